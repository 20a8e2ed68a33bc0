"""`metralectl agent`: the long-running service. Wires the capability monitor, the local API + page and
the peer listener, records where it listens (`<config>/agent/agent.json`), and stops cleanly on
SIGTERM/SIGINT.

One agent per configuration: run_agent takes the config dir's agent lock first, so a second agent is
refused naming the first (pid, URL), and records itself in the pidfile (pid, start time, executable,
how it was started: `agent start`, systemd, or a terminal). A port held by another program is refused
naming that program. The peer listener, the one socket open beyond loopback, is on only when asked
(`--peers`), once this box knows a peer, or once it takes benchmark units from peers (bench.yaml): an
agent started before either turns it on by itself within PEER_RECHECK_S.

The docker group: a process keeps the groups it started with, so an agent started before
`usermod -aG docker $USER` can never reach the socket by itself. When its own check finds exactly that
case (listed in /etc/group, missing from the process) it re-executes itself through `sg docker`, which
needs no password for a listed member, and so picks up the fix within one check interval, without the
operator restarting anything (`--no-regroup` turns this off).
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.agent import security
from metralectl.agent.capability import DEFAULT_INTERVAL_S, CapabilityMonitor, doctor_capability
from metralectl.errors import ExitCode, MetralError
from metralectl.peers import PEER_PORT
from metralectl.seams.agent_files import HOW_ENV, LOG_ENV, read_state, state_path  # noqa: F401  (re-exported)
from metralectl.seams.process import on_stop_signals, raise_fd_limit

log = logging.getLogger("metralectl.agent")
REGROUP_MARK = "METRALECTL_AGENT_REGROUPED"  # set on the re-executed agent: never loop through sg twice
GATEWAY_RECHECK_S = 2.0  # how soon `gateway enable|disable` takes effect, and a gateway that exited starts again
PEER_RECHECK_S = 5.0  # how soon a first pairing turns the peer listener on (when not decided by an option)


class CleanFormatter(logging.Formatter):
    """The agent's log lines: each message with its control characters escaped (safetext.clean), so text
    from a peer or a client (a hello's name, a request's path) can neither forge a line nor move the
    terminal's cursor. A traceback, which is ours, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        from metralectl.safetext import clean

        record.message = clean(record.message)
        return super().formatMessage(record)


def configure_logging(stream: Any = None) -> logging.Handler:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(CleanFormatter("%(asctime)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def page_url(base: Path | None = None, port: int | None = None) -> str:
    state = read_state(base) or {}
    port = port or int(state.get("api_port") or security.DEFAULT_API_PORT)
    return f"http://127.0.0.1:{port}/#token={security.load_or_create_token(base)}"


def needs_regroup(answer: dict[str, Any]) -> bool:
    for check in answer.get("checks", []):
        if check.get("id") == "docker.daemon" and check.get("status") == "problem":
            data = check.get("data") or {}
            return bool(data.get("cause") == "permission-denied" and data.get("in_docker_group")
                        and not data.get("docker_group_active"))
    return False


def peers_wanted(base: Path | None = None) -> str | None:
    """Why the peer listener should be on when no option decides: this box knows a peer (paired from
    here, or a hello the operator granted), or takes benchmark units from peers (bench.yaml enabled:
    `peer bench-config --enable`, which a node does before it is paired); None: off."""
    from metralectl.peers.config import load_bench_config
    from metralectl.peers.store import PeerStore

    try:
        if PeerStore(base).load().peers:
            return "a peer is paired"
        if load_bench_config(base).enabled:
            return "peers may run benchmarks here (bench.yaml)"
    except MetralError as exc:
        log.warning("peer listener stays off: %s", exc.message)
    return None


def port_taken(what: str, host: str, port: int, exc: OSError, option: str) -> MetralError:
    """A listener that could not bind, in words: who holds the port (as far as this user may see), the fix."""
    from metralectl.doctor.context import listening_process
    from metralectl.safetext import clean

    if exc.errno == errno.EACCES:
        return MetralError(f"cannot listen on {host}:{port} for {what}: permission denied (ports below 1024 need "
                           "privileges)", f"give it a port ≥ 1024: {option} N", exit_code=ExitCode.USAGE)
    if exc.errno != errno.EADDRINUSE:
        return MetralError(f"cannot listen on {host}:{port} for {what}: {exc.strerror or exc}",
                           f"check the address, or give it another port: {option} N",
                           exit_code=ExitCode.UNAVAILABLE)
    holder = listening_process(port)
    who = "another program (this user cannot see which: `sudo ss -ltnp` shows it)"
    if holder.get("pid"):
        from metralectl.seams.process import command_line

        name = clean(str(holder.get("process") or "?"), 64)
        command = command_line(int(holder["pid"]))
        who = f"PID {holder['pid']} ({name}" + (f": {clean(command, 120)}" if command else "") + ")"
    return MetralError(f"cannot listen on {host}:{port} for {what}: the port is already in use by {who}",
                       f"stop that program, or give the agent another port: {option} N (0: any free port)",
                       exit_code=ExitCode.BUSY)


def _listen(what: str, host: str, port: int, option: str, make: Callable[[], Any]) -> Any:
    try:
        return make()
    except OSError as exc:
        raise port_taken(what, host, port, exc, option) from None


@dataclass
class AgentOptions:
    api_port: int = security.DEFAULT_API_PORT
    peer_port: int = PEER_PORT
    peer_host: str = "0.0.0.0"
    peer: bool | None = None  # None: on when peers_wanted() says why (checked again while it runs)
    interval_s: float = DEFAULT_INTERVAL_S
    regroup: bool = True
    argv: Sequence[str] = field(default_factory=lambda: list(sys.argv[1:]))


class Agent:
    def __init__(self, options: AgentOptions, *, base: Path | None = None,
                 check: Callable[[], dict[str, Any]] = doctor_capability, ops: Any = None, facts: Any = None,
                 home: Path | None = None, lock_path: Path | None = None) -> None:
        from metralectl.seams import identity
        from metralectl.agent.api import LocalApiServer
        from metralectl.agent.ops import LifecycleOps

        self.options = options
        self.base = base
        self.started = time.time()
        self.how = "embedded"  # run_agent says how the process was started (detached, systemd, foreground)
        self.log_file: str | None = None
        self.identity = identity.load_or_create(base)
        self.token = security.load_or_create_token(base)
        self.stopping = threading.Event()
        self.regroup_wanted = False
        self.monitor = CapabilityMonitor(self._checked(check), interval_s=options.interval_s,
                                         on_change=lambda a: log.info("capability: %s", a.get("summary")))
        self.ops = ops if ops is not None else LifecycleOps(self.monitor.latest)
        self.api = _listen("the local API", "127.0.0.1", options.api_port, "--port",
                           lambda: LocalApiServer(self.ops, token=self.token, port=options.api_port,
                                                  info={"fingerprint": self.identity.fingerprint}))
        self._facts, self._home, self._lock_path = facts, home, lock_path
        self.peer_server: Any = None
        self._peer_failed = False
        try:
            if options.peer or (options.peer is None and peers_wanted(base)):
                self.peer_server = self._peer_listener()
        except BaseException:
            self.api.server_close()
            raise
        self.api.info["peer_port"] = self.peer_server.port if self.peer_server else None
        from metralectl.agent.gateway_child import GatewayChild
        from metralectl.seams.agent_files import agent_dir

        self.gateway = GatewayChild(agent_dir(base))  # runs `metralectl gateway` while `gateway enable` says so

    def _peer_listener(self) -> Any:
        from metralectl.peers.admission import Facts
        from metralectl.peers.listener import Node, PeerServer

        node = Node(self.base if self.base is not None else paths.config_dir(), self.identity,
                    self._facts or Facts(), home=self._home, lock_path=self._lock_path)
        server = _listen("the peer listener", self.options.peer_host, self.options.peer_port, "--peer-port",
                         lambda: PeerServer(node, self.options.peer_host, self.options.peer_port))
        self.api.units = node.units
        return server

    def peers_now(self) -> None:
        """Turn the peer listener on once a peer is known (options left it to that), and record its port."""
        if self.options.peer is not None or self.peer_server is not None or self._peer_failed:
            return
        why = peers_wanted(self.base)
        if why is None:
            return
        try:
            server = self._peer_listener()
        except MetralError as exc:
            self._peer_failed = True  # said once; the next start tries again
            log.warning("%s, but the peer listener cannot start: %s", why, exc.message)
            return
        server.start("agent-peers")
        self.peer_server = server
        self.api.info["peer_port"] = server.port
        self._record()
        log.info("%s: peer listener on %s:%d", why, self.options.peer_host, server.port)

    def _checked(self, check: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            answer = check()
            if (self.options.regroup and needs_regroup(answer) and not os.environ.get(REGROUP_MARK)
                    and shutil.which("sg")):
                answer["summary"] += " (the agent is picking up the docker group: restarting itself through `sg docker`)"
                self.regroup_wanted = True
                self.stopping.set()
            return answer
        return run

    def start(self) -> None:
        before, after = raise_fd_limit()  # connections are capped; the rest of the process needs its share
        if after != before:
            log.info("descriptor limit raised from %d to %d", before, after)
        self.monitor.start()
        self.api.start("agent-api")
        if self.peer_server is not None:
            self.peer_server.start("agent-peers")
        self.started = time.time()
        self._record()
        self.gateway.tick()

    def _record(self) -> None:
        from metralectl.seams.process import identity
        from metralectl.seams.store import write_json

        me = identity(os.getpid()) or {"pid": os.getpid()}
        write_json(state_path(self.base), {**me, "api_port": self.api.port,
                                           "peer_port": self.peer_server.port if self.peer_server else None,
                                           "peer_host": self.options.peer_host if self.peer_server else None,
                                           "fingerprint": self.identity.fingerprint, "started": self.started,
                                           "how": self.how, "log": self.log_file},
                   mode=0o600)

    def stop(self) -> None:
        self.stopping.set()
        self.monitor.stop()
        self.api.stop()
        if self.peer_server is not None:
            self.peer_server.stop()
        self.gateway.stop()
        close = getattr(self.ops, "close", None)
        if close is not None:
            close()
        state = read_state(self.base)
        if state is not None and state.get("pid") == os.getpid():
            state_path(self.base).unlink(missing_ok=True)

    def wait(self) -> None:
        next_peer_check = time.monotonic() + PEER_RECHECK_S
        next_gateway_check = time.monotonic() + GATEWAY_RECHECK_S
        while not self.stopping.wait(0.5):
            if time.monotonic() >= next_gateway_check:
                next_gateway_check = time.monotonic() + GATEWAY_RECHECK_S
                self.gateway.tick()
            if time.monotonic() >= next_peer_check:
                next_peer_check = time.monotonic() + PEER_RECHECK_S
                self.peers_now()


def how_started() -> tuple[str, str | None]:
    """(how this process was started, the file its log goes to): `agent start` says so in the environment
    (taken out of it: the agent's own children are not agents); else systemd's unit, else a terminal."""
    from metralectl.seams.user_systemd import started_by_systemd

    how, log_file = os.environ.pop(HOW_ENV, ""), os.environ.pop(LOG_ENV, None)
    if how == "detached":
        return how, log_file
    return ("systemd" if started_by_systemd() else "foreground"), None


def run_agent(options: AgentOptions, *, base: Path | None = None, on_ready: Callable[[Agent], None] | None = None) -> None:
    from metralectl.joblog import quiet_http_clients
    from metralectl.seams.agent_files import remove_pidfile, take_lock, write_pidfile

    quiet_http_clients()  # the log says what the agent did, not every health poll a readiness wait makes
    how, log_file = how_started()
    lock = take_lock(base)  # a second agent for this configuration is refused here, naming the first
    try:
        write_pidfile(how, log_file, base)
        try:
            _serve(options, base, how, log_file, on_ready)
        finally:
            remove_pidfile(os.getpid())
    finally:
        os.close(lock)


def _serve(options: AgentOptions, base: Path | None, how: str, log_file: str | None,
           on_ready: Callable[[Agent], None] | None) -> None:
    agent = Agent(options, base=base)
    agent.how, agent.log_file = how, log_file

    with on_stop_signals(agent.stopping.set):  # SIGTERM or Ctrl-C: stop serving, then clean up
        agent.start()
        if on_ready is not None:
            on_ready(agent)
        try:
            agent.wait()
        finally:
            agent.stop()
    if agent.regroup_wanted:
        command = shlex.join([sys.executable, "-m", "metralectl", *options.argv])
        os.environ[REGROUP_MARK] = "1"
        if how == "detached":  # the agent after the re-exec is still the one `agent start` started
            os.environ[HOW_ENV] = how
            os.environ[LOG_ENV] = log_file or ""
        log.warning("re-executing through `sg docker` to pick up the docker group")
        os.execvp("sg", ["sg", "docker", "-c", command])
