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
