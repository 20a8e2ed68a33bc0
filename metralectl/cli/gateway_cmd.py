"""`metralectl gateway`: one OpenAI-compatible endpoint in front of every model this box serves (docs/gateway.md).

Foreground: it serves until Ctrl-C or SIGTERM. The listening socket is bound here, before anything else
starts, so a taken port or a refused address is a one-line error and nothing half-started.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
from typing import Any

import typer

from metralectl.errors import ExitCode, MetralError, UsageError
from metralectl.gateway.listen import DEFAULT_LISTEN, parse_listen  # noqa: F401 (parse_listen: tests use it here)

def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise MetralError(f"the gateway cannot listen on {host}:{port}: {exc.strerror or exc}",
                          "another program holds it: pick another with `--listen HOST:PORT`",
                          exit_code=ExitCode.UNAVAILABLE) from None
    sock.setblocking(False)
    return sock


def _own_cpus(text: str | None) -> frozenset[int] | None:
    """The gateway on --cpus (else box.yaml's gateway-cpus), checked against what this process may use; None: no
    CPUs of its own. A list that cannot be: refused before anything listens."""
    from metralectl.seams import affinity

    if text is None:
        from metralectl.lifecycle.budget import box_config

        chosen, where = box_config().gateway_cpus, "box.yaml's gateway-cpus"
        if not chosen:
            return None
    else:
        from metralectl.core.cpulist import parse

        try:
            chosen, where = parse(text), "--cpus"
        except ValueError as bad:
            raise UsageError(f"--cpus: {bad}", "name the CPUs the gateway runs on, e.g. --cpus 14-15") from None
    problem = affinity.check(chosen)
    if problem is not None:
        raise UsageError(f"{where}: {problem}", "leave the engines some CPUs: e.g. the last two, --cpus 14-15 on a "
                                                "box of 16 (`nproc` says how many this process may use)")
    affinity.pin(chosen)
    return chosen


def _busy_poll_ms(given: float | None) -> float:
    """--busy-poll, else box.yaml's gateway-busy-poll (refused by line there), else 0: off."""
    from metralectl.lifecycle.budget import BUSY_POLL_MAX_MS, box_config

    if given is None:
        return box_config().gateway_busy_poll_ms
    if not 0 <= given <= BUSY_POLL_MAX_MS:  # (nan too)
        raise UsageError(f"--busy-poll: {given:g} is not a number of milliseconds from 0 to {BUSY_POLL_MAX_MS:g}",
                         "e.g. --busy-poll 50, or 0 for off")
    return given


def _status(table: Any, url: str) -> dict[str, Any]:
    return {"listen": url, "models": [{"name": name, "recipe": route.recipe, "url": route.url}
                                      for name, route in sorted(table.by_name.items())],
            "starting": sorted(table.starting), "error": table.error}


gateway_app = typer.Typer(help="Serve one OpenAI-compatible endpoint that routes each request by its `model` to the "
                               "engine serving it.", invoke_without_command=True, no_args_is_help=False,
                          add_completion=False, rich_markup_mode=None)


@gateway_app.callback()
def gateway(
    ctx: typer.Context,
    listen: str = typer.Option(DEFAULT_LISTEN, "--listen", metavar="HOST:PORT",
                               help="Where to listen (loopback unless API keys exist or --allow-remote)."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback --listen address without "
                                      "API keys (anyone who reaches it may use every model)."),
    max_body: int = typer.Option(16 * 1024 * 1024, "--max-body", metavar="BYTES", min=1,
                                 help="Largest request body accepted (413 past it)."),
    queue_size: int = typer.Option(256, "--queue-size", min=1,
                                   help="Requests that may wait per model while it starts or swaps (503 past it)."),
    queue_timeout: float = typer.Option(300.0, "--queue-timeout", metavar="SECONDS", min=0.1,
                                        help="A waiting request gets 503 after this long with no progress of its "
                                             "model's start (a stall timer, not a total)."),
    client_timeout: float = typer.Option(60.0, "--client-timeout", metavar="SECONDS", min=0.1,
                                         help="Close a client connection idle this long (nothing asked, or kept "
                                              "alive between requests), or whose request head is not whole this "
                                              "long after its first byte (408)."),
    budget: float = typer.Option(None, "--budget", metavar="GB", min=0,
                                 help="The box's memory budget in GB that loaded models share (default: box.yaml's "
                                      "`budget:`, else the GPU's memory, else the host's RAM less the OS's share)."),
    pin: list[str] = typer.Option(None, "--pin", metavar="RECIPE", help="Never evict this model to make room "
                                  "(repeatable; also box.yaml's `pin:`)."),
    drain_timeout: float = typer.Option(60.0, "--drain-timeout", metavar="SECONDS", min=0,
                                        help="How long a busy model's requests may take to finish before it is "
                                             "evicted (never stopped mid-request: the load waits, then 503)."),
    no_load: bool = typer.Option(False, "--no-load", help="Route only to what serves; never load a model on demand."),
    as_json: bool = typer.Option(False, "--json", help="Status as JSON lines on stdout: one when listening, one each "
                                                       "time the served models change (`gone`: the engines that "
                                                       "went away without being stopped)."),
    event_loop: str = typer.Option("auto", "--event-loop", metavar="auto|uvloop|asyncio",
                                   help="The event loop it serves on: auto is uvloop where it is installed (it is a "
                                        "dependency on Linux and macOS), else asyncio's own."),
    cpus: str = typer.Option(None, "--cpus", metavar="LIST",
                             help="Run on these CPUs only (e.g. 14-15), and start engines on the others (default: "
                                  "box.yaml's `gateway-cpus:`). Engines started by `run` keep off them when box.yaml "
                                  "names them."),
    busy_poll: float = typer.Option(None, "--busy-poll", metavar="MS",
                                    help="Keep its event loop polling, not sleeping, this long (0-10000) after "
                                         "each read: less added to a first token at few streams, a CPU flat out "
                                         "while it serves (give it --cpus of its own). Default: box.yaml's "
                                         "`gateway-busy-poll:`, else 0 (off)."),
) -> None:
    """Serve one OpenAI-compatible endpoint that routes each request by its `model` to the engine serving it.
    With API keys (`gateway keys add`), every client needs one, and each key names the models it may use."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio
    import signal

    from metralectl.core.gateway_keys import KeyWatch
    from metralectl.gateway import loops
    from metralectl.gateway.routes import Scanner
    from metralectl.gateway.server import Gateway, Limits, serve

    loop_name = loops.pick(event_loop)  # a loop that is not there: refused before anything listens
    own_cpus = _own_cpus(cpus)  # before any thread starts: each one inherits the affinity
    if own_cpus is not None:
        from metralectl.core.cpulist import render

        cpu_list: str | None = render(own_cpus)
    else:
        cpu_list = None
    busy_ms = _busy_poll_ms(busy_poll)
    keys = KeyWatch()  # a key file that cannot be trusted: refused here, before anything listens
    host, port = parse_listen(listen, allow_remote, bool(keys.ring))
    remote = not ipaddress.ip_address(host).is_loopback
    sock = _bind(host, port)
    from metralectl.seams.process import raise_fd_limit

    raise_fd_limit()  # a client and an engine connection per stream, and idle clients until --client-timeout
    url = f"http://{'[' + host + ']' if ':' in host else host}:{sock.getsockname()[1]}"

    def show(table: Any, event: str = "models", gone: list[str] | None = None) -> None:
        status = {**_status(table, url), "keys": len(keys.ring.keys), "keys_error": keys.error, "gone": gone or [],
                  "event_loop": loop_name, "cpus": cpu_list, "busy_poll_ms": busy_ms}
        if as_json:
            print(json.dumps({"event": event, **status}), flush=True)
            return
        from metralectl.safetext import clean
        from metralectl.wording import count

        names = ", ".join(f"{m['name']} ({m['recipe']})" if m["name"] != m["recipe"] else m["name"]
                          for m in status["models"]) or "none"
        print(f"gateway {url}: serving {clean(names, 2000)}" + (f"; on CPUs {cpu_list}" if cpu_list else "") +
              (f"; starting: {clean(', '.join(status['starting']), 500)}" if status["starting"] else "") +
              (f"; {clean(table.error, 500)}" if table.error else "") +
              (f"; went away (exited without being stopped): {clean(', '.join(gone), 500)}" if gone else "") +
              (f"; {count(status['keys'], 'API key')} in force" if status["keys"] else "; no API key: loopback only"
               if not remote else "; no API key and --allow-remote: open to every client") +
              (f"; the keys file is refused, the last good keys stay in force: {clean(keys.error, 500)}"
               if keys.error else ""), file=sys.stderr, flush=True)

    loader = None
    if not no_load:
        from metralectl.gateway.loader import BoxOps, Loader, loadable_names
        from metralectl.lifecycle.budget import box_config

        pins = [*(pin or []), *box_config().pin]
        loader = Loader(BoxOps(budget), loadable_names(), pins=pins, drain_timeout_s=drain_timeout)
    limits = Limits(max_body=max_body, queue_size=queue_size, queue_stall_s=queue_timeout,
                    client_timeout_s=client_timeout, busy_poll_s=busy_ms / 1000)
    gateway_ = Gateway(Scanner(), limits, keys, require_key=remote and not allow_remote, loader=loader)
    if loader is not None:
        loader.metrics = gateway_.metrics
    gateway_.on_table = show

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(serve(gateway_, sock, lambda table: show(table, "listening")))
        stopped: list[int] = []

        def stop(signum: int) -> None:
            stopped.append(signum)
            task.cancel()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop, signum)
        try:
            await task
        except asyncio.CancelledError:
            if not stopped:
                raise
        return True  # Ctrl-C / SIGTERM, the clients' connections closed by serve() on its way out

    from metralectl.gateway import state

    import secrets

    gateway_.monitor = secrets.token_urlsafe(32)  # `top`, the dashboard and the page read /metrics with it
    recorded = state.record(url, len(keys.ring.keys), monitor=gateway_.monitor, cpus=cpu_list,
                            busy_poll_ms=busy_ms)  # `ps` shows it
    try:
        interrupted = loops.run(main(), loop_name)
    finally:
        state.remove(recorded)
    if interrupted:
        raise KeyboardInterrupt  # outside the loop (raised in it, the clients' tasks were torn down noisily):
        # the CLI's boundary says so and exits 130


def register(app: typer.Typer) -> None:
    from metralectl.cli import gateway_keys_cmd

    gateway_keys_cmd.register(gateway_app)
    from metralectl.cli import gateway_agent_cmd

    gateway_agent_cmd.register(gateway_app)
    app.add_typer(gateway_app, name="gateway")
