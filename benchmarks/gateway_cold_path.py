#!/usr/bin/env python3
"""The gateway's own Python per request on a cold core (a script, not a test): each metralectl given runs its gateway's
fast path in process, one request at a time, with the CPU's caches emptied before each, and the script reports its
time from a client's connection made (the protocol made and connection_made, then the event loop's turn before the
request's read) to the request's read, from the request's bytes read to its bytes written to the engine, and from the
engine's first piece read to its write to the client.

    python3 benchmarks/gateway_cold_path.py --python VENV_A/bin/python --python VENV_B/bin/python
        [--rounds 8] [--requests 200] [--evict-mb 96] [--json FILE]

Why this, beside benchmarks/gateway_overhead.py: on the lent H200 at one stream the gateway's own time per request
is several times what the same Python costs warm, because the milliseconds between requests leave every cache it
touches cold (metralectl/gateway/heads.py). A busy 2-core box cannot show a few tens of microseconds in a client's
TTFT (its noise is larger), but it can run the same code on caches emptied on purpose (a copy of `--evict-mb` MiB
before each request) and time it from inside, with nothing else on the path: no socket, no engine, no client. The
engine's and client's sides are fakes that take the bytes; the gateway's objects (Gateway, its pool, a client's
connection, an engine connection) are the real ones of each metralectl, fed as each event loop feeds them (uvloop:
data_received for a protocol that is an asyncio.Protocol, else buffer_updated). The figure leaves out the accept and
send system calls, which any relay makes (benchmarks/relay_floor.c), and the event loop's wake-up. The connection is
made cold and its request read right after (a client sends as soon as it has connected): what making it ran (a task's
first turn, in trees up to 3d194e7) is in the "made" time and leaves the request's read warmer.

Each round runs every python once, in a rotated order, each in a fresh process from /tmp (so a wheel's venv imports
its own metralectl, not this checkout). Per python: the median over rounds of each round's median. Per python after
the first: its paired difference with the first, round by round (median, and the smallest and largest). Trees from
7a7115d on have what this drives (client.ClientConnection). Exit 1 if a child failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

CHILD = r'''
import asyncio, gc, json, os, sys, time
from metralectl.gateway import http1
from metralectl.gateway.client import ClientConnection
from metralectl.gateway.routes import Route, Table
from metralectl.gateway.server import Gateway
from metralectl.gateway.upstream import Upstream

REQUESTS, EVICT_MB = int(sys.argv[1]), int(sys.argv[2])
route = Route("stub", "http://127.0.0.1:9", "127.0.0.1", 9, ("stub",), ("stub",))

class Fixed:
    def lifecycle(self): return None, None
    def scan(self): return Table((route,), by_name={"stub": route})
    def close(self): pass

class Sink:  # a transport that takes what is written, and when
    def __init__(self): self.written, self.at = [], 0
    def write(self, data):
        self.at = self.at or time.perf_counter_ns()
        self.written.append(data)
    def is_closing(self): return False
    def get_write_buffer_size(self): return 0
    def close(self): pass
    def pause_reading(self): pass
    def resume_reading(self): pass

BODY = json.dumps({"model": "stub", "messages": [{"role": "user", "content": "word " * 100}], "stream": True,
                   "max_tokens": 16}).encode()
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
           b"Authorization: Bearer none\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nServer: llama.cpp\r\nKeep-Alive: timeout=5, max=100\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" word"}}],"object":"chat.completion.chunk"}\n\n'
PIECE = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
spill = bytearray(EVICT_MB << 20)

def evict():
    global spill
    spill = bytearray(spill)  # a copy larger than the caches: none of what the path touches is left in them

def feed(protocol, data):  # as the event loop would (uvloop: data_received for an asyncio.Protocol)
    if isinstance(protocol, asyncio.Protocol):
        protocol.data_received(data)
    else:
        view = http1.read_buffer()
        view[:len(data)] = data
        protocol.buffer_updated(len(data))

async def main():
    gateway = Gateway(Fixed())
    gateway._publish(Fixed().scan())
    gateway.timing = None
    address = (route.host, route.port)
    made, sent, first = [], [], []
    opened = getattr(gateway, "connections", None)  # the gateway's client connections (trees after 3d194e7)
    for i in range(REQUESTS):
        engine = Upstream()
        engine.connection_made(Sink())
        gateway.pool._wanted[address] = 1
        gateway.pool._idle[address] = [engine]
        warm = i < 20
        if not warm:
            evict()
        t0 = time.perf_counter_ns()  # as the server's protocol factory and the loop's accept would
        client = ClientConnection(gateway.handle, gateway.arrived, 1 << 24, *([] if opened is None else [opened]))
        client.connection_made(Sink())
        await asyncio.sleep(0)  # the loop's turn between the accept and the request's read: what made scheduled runs
        t1 = time.perf_counter_ns()
        feed(client, REQUEST)
        if not engine.transport.written:
            raise SystemExit("the request was not written to the engine from the read callback")
        feed(engine, HEAD)
        if not warm:
            evict()
        t2 = time.perf_counter_ns()
        feed(engine, PIECE)
        t3 = time.perf_counter_ns()
        if len(client.transport.written) != 2 or not client.transport.written[1].endswith(PIECE):
            raise SystemExit("the first piece did not reach the client from the read callback")
        if not warm:
            made.append(t1 - t0)
            sent.append(engine.transport.at - t1)
            first.append(t3 - t2)
        await asyncio.sleep(0)  # the connection's task wakes, and is cancelled: the next request is a new client's
        for task in list(gateway._clients):
            task.cancel()
        await asyncio.sleep(0)
    print(json.dumps({"made_ns": made, "sent_ns": sent, "first_ns": first}))

gc.disable()  # a collection's pause is not the path's cost (the gateway freezes its heap: loops.settle_heap)
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
'''


def run_child(python: str, requests: int, evict_mb: int) -> dict[str, list[int]]:
    done = subprocess.run([python, "-c", CHILD, str(requests), str(evict_mb)], capture_output=True, text=True,
                          cwd="/tmp", timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"gateway_cold_path: {python} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    got: dict[str, list[int]] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", required=True, help="an interpreter with metralectl (repeat)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200, help="per child; the first 20 are warm-up")
    parser.add_argument("--evict-mb", type=int, default=96, help="MiB copied before each request (> the L3 cache)")
    parser.add_argument("--json", help="write every round's medians here")
    ns = parser.parse_args()
    pythons: list[str] = ns.python
    rounds: dict[str, list[dict[str, float]]] = {p: [] for p in pythons}
    for r in range(ns.rounds):
        order = pythons[r % len(pythons):] + pythons[:r % len(pythons)]
        for python in order:
            got = run_child(python, ns.requests, ns.evict_mb)
            medians = {k: statistics.median(v) / 1e3 for k, v in got.items()}
            rounds[python].append(medians)
            print(f"round {r + 1}: {python}: made {medians['made_ns']:.1f} us, sent {medians['sent_ns']:.1f} us, "
                  f"first piece {medians['first_ns']:.1f} us", file=sys.stderr)
    report: dict[str, Any] = {"evict_mb": ns.evict_mb, "requests": ns.requests, "rounds": rounds, "summary": {}}
    base = pythons[0]
    print("| python | connection made to request read, us | request read to engine write, us "
          "| first piece read to client write, us |")
    print("|---|---:|---:|---:|")
    for python in pythons:
        row: dict[str, Any] = {}
        cells = []
        for key in ("made_ns", "sent_ns", "first_ns"):
            mine = [m[key] for m in rounds[python]]
            row[key] = statistics.median(mine)
            cell = f"{row[key]:.1f}"
            if python != base:
                diffs = sorted(a - b for a, b in zip(mine, (m[key] for m in rounds[base])))
                row[key + "_minus_first"] = {"median": statistics.median(diffs), "min": diffs[0], "max": diffs[-1]}
                cell += f" ({statistics.median(diffs):+.1f} [{diffs[0]:+.1f}, {diffs[-1]:+.1f}])"
            cells.append(cell)
        report["summary"][python] = row
        print(f"| {python} | {' | '.join(cells)} |")
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
