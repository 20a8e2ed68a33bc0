"""Loopback ports a test owns from the moment it chooses them (tests/unit/test_port_ownership.py keeps to it).

"Bind port 0, read the number, close, use the number later" loses on a busy machine: between the close and
the later bind another program can take the port (the kernel hands out ephemeral ports at random, and an
outgoing connection takes one too). Two ways instead:

- `HeldPort` / `own_port()`: a socket bound to 127.0.0.1:N with SO_REUSEADDR that never listens, kept open
  for as long as the port is in use. No other program can take N: neither a bind() of port 0 nor an outgoing
  connect() is given a port a socket holds, and an explicit bind without SO_REUSEADDR fails. Yet a server
  that sets SO_REUSEADDR (Python's http.server, metralectl's own servers, the engine double, uvicorn,
  llama-server) still binds and listens on N beside it, again after another server there stopped, and
  metralectl's own probe (seams/ports.py) calls N free while nothing listens. While nothing listens there,
  connecting to N is refused: a dead endpoint nobody else can bring to life.
- `pick_port()` + `start_retrying()`: for a program another party builds (llama-server, transformers serve,
  the registry), whose socket options are not ours to rely on: choose a number, start, and when the start
  failed because the port was taken (`port_in_use`, `run_lost_its_port`: the product's own reading), choose
  again, a bounded number of times.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
ATTEMPTS = 5  # starts tried before a taken port is the test's failure


class HeldPort:
    """A loopback port held (bound with SO_REUSEADDR, never listening) until close()."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.port = int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_HELD: list[HeldPort] = []  # own_port()'s, released after each test (tests/conftest.py)


def own_port(host: str = "127.0.0.1") -> int:
    """A port held until the end of the current test (or of the process, outside a test)."""
    held = HeldPort(host)
    _HELD.append(held)
    return held.port


def release_owned() -> None:
    while _HELD:
        _HELD.pop().close()


def pick_port() -> int:
    """A number that was free a moment ago, for `start_retrying` only: another program may take it before the
    child binds it, and the retry is what makes that harmless."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PortTaken(Exception):
    """Raised by a start that failed only because its port was taken (the caller tries another)."""


def start_retrying(start: Callable[[int], T], attempts: int = ATTEMPTS) -> T:
    """`start(port)` on fresh ports until it does not raise PortTaken; the last PortTaken after `attempts`."""
    for attempt in range(attempts):
        try:
            return start(pick_port())
        except PortTaken:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def port_in_use(log: str, engine: str = "metrale") -> bool:
    """Whether an engine's log says it could not bind its port, by the product's own reading of engine logs
    (lifecycle/boot.py: the engine contract's port-in-use signature, else "address already in use")."""
    from metralectl.core.catalog import load_catalog
    from metralectl.lifecycle.boot import BootLog

    reader = BootLog(load_catalog(include_user=False).engines[engine], "127.0.0.1", 0)
    for line in log.splitlines():
        reader.feed(line)
    return reader.failure is not None and reader.failure.cause == "port-in-use"


def run_lost_its_port(stderr: str) -> bool:
    """Whether `metralectl run` failed because its port was taken, in its own words: the preflight's refusal
    (lifecycle/preflight.py) or a start whose diagnosis is port-in-use (lifecycle/launch.py)."""
    return ("start failed (port-in-use)" in stderr
            or re.search(r"port \d+ on \S+ is already in use by another program", stderr) is not None)
