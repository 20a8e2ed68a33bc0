"""metralectl/gateway/loops.py: the gateway's event loop, uvloop where it is installed, else asyncio's own."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from metralectl.errors import ExitCode, MetralError
from metralectl.gateway import loops


def test_auto_serves_on_uvloop_where_it_is_installed_and_each_loop_runs_what_it_is_given() -> None:
    assert loops.pick("auto") == "uvloop"  # a dependency on Linux (pyproject.toml)
    assert loops.pick("asyncio") == "asyncio"

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert loops.run(which(), "uvloop").startswith("uvloop")
    assert loops.run(which(), "asyncio").startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_asking_for_it_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError, as where it has no wheel
    assert loops.pick("auto") == "asyncio"
    with pytest.raises(MetralError) as refused:
        loops.pick("uvloop")
    assert refused.value.exit_code == ExitCode.USAGE and "not installed" in str(refused.value)


def test_an_unknown_loop_is_refused_before_anything_listens() -> None:
    done = subprocess.run([sys.executable, "-m", "metralectl", "gateway", "--event-loop", "twisted"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.USAGE, done
    assert "--event-loop 'twisted' is not one of auto, uvloop, asyncio" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_each_loop_sets_tcp_nodelay_on_the_connections_it_accepts_and_makes(loop: str) -> None:
    """The gateway sets no TCP_NODELAY of its own (loops.py): without it, an answer's small pieces waited ~40 ms for
    Nagle and a delayed ACK."""
    import socket

    seen: list[int] = []

    async def go() -> None:
        accepted = asyncio.get_running_loop().create_future()

        def on_client(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer)

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        _, made = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        theirs = await accepted
        for writer in (made, theirs):
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
        server.close()

    loops.run(go(), loop)
    assert len(seen) == 2 and all(seen), seen


FROZEN_AT_READY = r"""
import asyncio, gc, json, socket, sys
from metralectl.gateway.routes import Route, Table
from metralectl.gateway.server import Gateway, serve

route = Route("stub", "http://127.0.0.1:9", "127.0.0.1", 9, ("stub",), ("stub",))

class Fixed:
    def lifecycle(self): return None, None
    def scan(self): return Table((route,), by_name={"stub": route})
    def close(self): pass

seen = {}
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(8)

async def main():
    def ready(_table):
        seen.update(frozen=gc.get_freeze_count(), old=len(gc.get_objects(2)))
        asyncio.get_running_loop().call_soon(task.cancel)
    task = asyncio.ensure_future(serve(Gateway(Fixed()), sock, ready))
    try:
        await task
    except asyncio.CancelledError:
        pass

asyncio.run(main())
print(json.dumps(seen))
"""


def test_what_starting_made_is_frozen_out_of_the_collectors_passes_before_the_gateway_serves() -> None:
    """A full collection walked every object the gateway held from its start (its modules, Docker's client): on the
    lent H200 at 16 streams the loop stopped ~15 ms now and then, every request and stream in flight with it. Once it
    serves, that heap is collected once and frozen (loops.settle_heap), so the collector's passes walk only what the
    relay made since. In a process of its own: a freeze is for the whole process."""
    import json

    done = subprocess.run([sys.executable, "-c", FROZEN_AT_READY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["frozen"] > 10_000, seen  # the imports alone are tens of thousands of objects
    assert seen["old"] < seen["frozen"] // 100, seen  # none of them left for a full collection to walk
