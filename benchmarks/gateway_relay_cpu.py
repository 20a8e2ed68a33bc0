#!/usr/bin/env python3
"""The gateway's CPU per relayed SSE event (a script, not a test): what the relay itself costs, with no engine
competing for the cores.

    python3 benchmarks/gateway_relay_cpu.py [--tree DIR ...] [--streams 64] [--events 200] [--interval-ms 2]
        [--requests 1] [--lockstep] [--event-loops asyncio[,uvloop]] [--rounds 3] [--json FILE]

A stub engine (this process, asyncio) answers each POST with a chunked SSE stream of `--events` events of an
OpenAI chat chunk's size, one write per event, `--interval-ms` apart (an engine's token pace, so the gateway
reads one event per wake-up as it does in front of a real engine). `--streams` clients stream through a
gateway started in a child process from each `--tree` (a checkout's root: compare two relays interleaved, which
goes first alternating by round) with the real `Gateway` class and a fixed one-route table. The child's CPU
(user + system, from /proc) over the streaming is divided by the events relayed. Every client checks that it
received every event in order and the stream's end; a lost or torn event fails the run (exit 1).

With `--requests N` each client sends N streamed requests one after another, so new requests arrive while the
other streams flow (with `--lockstep`, as behind an engine that batches: its streams end together and their clients
send again together), and the
gateway's own time per request from inside it (METRALECTL_GATEWAY_TIMING: its last byte in to its write to the
engine, timing.py) is reported too, its median and p99: what a request waits behind the relay of the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHUNK = ('data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"stub","choices":'
         '[{"index":0,"delta":{"content":" word%05d"},"finish_reason":null}]}\n\n')

CHILD = r"""
import asyncio, socket, sys
from metralectl.gateway.routes import Route, Table
from metralectl.gateway.server import Gateway, serve

port = int(sys.argv[1])
route = Route("stub", f"http://127.0.0.1:{port}", "127.0.0.1", port, ("stub",), ("stub",))

class Fixed:
    def lifecycle(self): return None, None
    def scan(self): return Table((route,), by_name={"stub": route})
    def close(self): pass

sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(512)
def ready(_table): print(sock.getsockname()[1], flush=True)
try:
    if sys.argv[2] == "asyncio":
        asyncio.run(serve(Gateway(Fixed()), sock, ready))
    else:  # a tree from before the gateway's event loop could be chosen has no loops.py
        from metralectl.gateway import loops
        loops.run(serve(Gateway(Fixed()), sock, ready), sys.argv[2])
except KeyboardInterrupt:  # stopped by the benchmark (SIGINT: the gateway writes its timing file as it stops)
    pass
"""


class Ticks:
    """One clock for every stream (an engine's batch step: all its streams get their next token at once)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.next: asyncio.Future[None] | None = None

    async def wait(self) -> None:
        if self.next is None:
            self.next = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(self.interval, self._tick)
        await asyncio.shield(self.next)

    def _tick(self) -> None:
        now, self.next = self.next, None
        if now is not None:
            now.set_result(None)


async def stub_engine(events: int, interval: float, lockstep: bool = False) -> tuple[asyncio.base_events.Server, int]:
    ticks = Ticks(interval)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(events):
                    data = (CHUNK % i).encode()
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                    await (ticks.wait() if lockstep else asyncio.sleep(interval))
                done = b"data: [DONE]\n\n"
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def one_stream(port: int, events: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": "stub", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"gateway_relay_cpu: the gateway answered {head[:80]!r}")
    text = _dechunk(rest).decode()
    expected = "".join(CHUNK % i for i in range(events)) + "data: [DONE]\n\n"
    if text != expected:
        raise SystemExit("gateway_relay_cpu: a stream came back torn or incomplete")
    return events


def _dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.index(b"\r\n", i)
        size = int(data[i:j], 16)
        if size == 0:
            return bytes(out)
        out += data[j + 2:j + 2 + size]
        i = j + 2 + size + 2


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(tree: Path, loop: str, ns: argparse.Namespace) -> dict[str, float]:
    server, upstream = await stub_engine(ns.events, ns.interval_ms / 1000, ns.lockstep)
    timing_file = Path(tempfile.mkdtemp()) / "timing.jsonl"
    env = {**os.environ, "PYTHONPATH": str(tree), "METRALECTL_GATEWAY_TIMING": str(timing_file)}
    child = subprocess.Popen([ns.python, "-c", CHILD, str(upstream), loop], stdout=subprocess.PIPE, text=True, env=env,
                             cwd=tree)
    stopped = False
    try:
        assert child.stdout is not None
        said = await asyncio.to_thread(child.stdout.readline)
        if not said.strip().isdigit():  # it died before listening: no CPU of a relay that never ran
            raise SystemExit(f"NOT MEASURED: the gateway from {tree} exited {child.wait(timeout=10)} before "
                             f"listening (said {said.strip()!r}; its stderr is above)")
        port = int(said)
        await one_stream(port, ns.events)  # warm: imports, first connection
        before, began = cpu_seconds(child.pid), time.monotonic()
        relayed = sum(await asyncio.gather(*(client(port, ns.events, ns.requests) for _ in range(ns.streams))))
        cpu, wall = cpu_seconds(child.pid) - before, time.monotonic() - began
        child.send_signal(signal.SIGINT)  # the gateway writes its timing file as it stops
        await asyncio.to_thread(child.wait, 30)
        stopped = True
    finally:
        if not stopped:
            child.terminate()
        child.wait(timeout=10)
        server.close()
    kept = [json.loads(line) for line in timing_file.read_text().splitlines()] if timing_file.exists() else []
    ups = sorted(r["up_ns"] / 1e3 for r in [r for r in kept if "up_ns" in r][1:])  # requests (not gc pauses)
    pauses = [r for r in kept if "gc" in r]
    if len(ups) != ns.streams * ns.requests:
        raise SystemExit(f"NOT MEASURED: the gateway kept its time for {len(ups)} requests of "
                         f"{ns.streams * ns.requests} (from {tree})")
    return {"cpu_s": cpu, "wall_s": wall, "events": relayed, "cpu_us_per_event": cpu / relayed * 1e6,
            "up_p50_us": ups[len(ups) // 2], "up_p99_us": ups[min(len(ups) - 1, int(len(ups) * 0.99))],
            # its garbage collections (a gateway that keeps them: timing.watch_collections), each a stop of it all
            "gc_pauses": len(pauses), "gc_full": sum(1 for r in pauses if r["gc"] == 2),
            "gc_longest_ms": max((r["pause_ns"] for r in pauses), default=0) / 1e6}


async def client(port: int, events: int, requests: int) -> int:
    return sum([await one_stream(port, events) for _ in range(requests)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout's root (repeat to compare)")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--requests", type=int, default=1, help="streamed requests per client, one after another")
    parser.add_argument("--lockstep", action="store_true",
                        help="every stream's next event at the same moment (an engine's batch step), not each on its own")
    parser.add_argument("--event-loops", default="asyncio", help="the gateway's event loop(s), e.g. asyncio,uvloop: "
                        "each tree is measured on each")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", type=Path)
    ns = parser.parse_args()
    arms = [f"{t.resolve()}@{loop}" for t in (ns.tree or [REPO]) for loop in ns.event_loops.split(",")]
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for r in range(ns.rounds):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            tree, _, loop = arm.rpartition("@")
            row = asyncio.run(measure(Path(tree), loop, ns))
            rows[arm].append(row)
            print(f"round {r + 1} {arm}: {row['cpu_us_per_event']:.1f} µs CPU/event "
                  f"({row['events']:.0f} events, {row['cpu_s']:.2f} s CPU in {row['wall_s']:.2f} s); own time per "
                  f"request p50 {row['up_p50_us']:.0f} µs, p99 {row['up_p99_us']:.0f} µs; "
                  f"{row['gc_pauses']:.0f} garbage collections ({row['gc_full']:.0f} full), the longest "
                  f"{row['gc_longest_ms']:.2f} ms", file=sys.stderr)
    summary = {arm: statistics.median(x["cpu_us_per_event"] for x in got) for arm, got in rows.items()}
    for arm, value in summary.items():
        up50 = statistics.median(x["up_p50_us"] for x in rows[arm])
        up99 = statistics.median(x["up_p99_us"] for x in rows[arm])
        print(f"{value:8.1f} µs CPU per event, own time per request p50 {up50:.0f} µs p99 {up99:.0f} µs "
              f"(medians of {ns.rounds})  {arm}")
    if ns.json:
        ns.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(ns).items()}, "rounds": rows,
                                       "median_cpu_us_per_event": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
