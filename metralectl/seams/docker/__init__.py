"""The Docker seam, one module per resource, as docker-py's own client is built (imports nothing here: `ps` and
`list` start fast; docker-py itself is imported only where a call needs it).

    protocol    ContainerRuntime: what callers type against (tests share one fake: tests/fakes/runtime.py)
    runtime     DockerRuntime (containers + images + logs over the one client) and open_runtime()
    containers  ContainerInfo; list, inspect, create and start, stop, kill, remove, wait, PIDs, probe containers
    images      ImageState, ImageRecord; inspect, pull, the revision label, disk accounting
    logs        the last lines, and followed lines with a watchdog
    client      DaemonClient: the one client of the Engine API; reads over the socket where it is local
    transport   SocketReader: those reads with http.client over a unix socket (no docker-py for `ps`)
    endpoints   which daemon: DOCKER_HOST, the CLI's current context, a node's URL or context, TLS
    errors      DockerUnavailable (the ways Docker is unusable), RuntimeFailure + RuntimeCause (its refusals)
    shared      SharedRuntime: one kept connection for long-lived watchers (top, the dashboard)
"""
