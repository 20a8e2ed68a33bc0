#!/usr/bin/env python3
"""TEST FIXTURE - an OpenAI-compatible SSE server that streams tokens on a KNOWN schedule.

Ground truth for metralectl's benchmark client: every request gets TTFT, then a chunk every
`tokens_per_chunk * itl` carrying `tokens_per_chunk` tokens (the first `reasoning` tokens as
`delta.reasoning_content`, or tool-call deltas when the request has tools), then — after `tail_ms` —
a finish_reason chunk, then (include_usage) a usage-only chunk with `choices: []`, then [DONE].
With `stream_options.continuous_usage_stats` every token chunk carries cumulative usage.
The server stamps time.perf_counter_ns() just before writing each event and, with --record, keeps
them per response id: GET /truth returns {id: {"t_req": ns, "events": [[ns, n_tokens, kind, ns_after], ...]}}
(the event reached the client's socket between the two stamps; t_req is the request's kernel arrival).
CLOCK_MONOTONIC is system-wide, so these stamps compare directly with the client's.

Standard library only. Run: python -m tests.bench_truth.truth_server --port 0 (prints "PORT <n>").
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import socket
import struct
import sys
import time
import uuid
from typing import Any

perf_ns = time.perf_counter_ns
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


class Config:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.ttft_s = ns.ttft_ms / 1000
        self.itl_s = ns.itl_ms / 1000
        self.k = ns.tokens_per_chunk
        self.reasoning = ns.reasoning
        self.tail_s = ns.tail_ms / 1000
        self.default_tokens = ns.tokens
        self.record = ns.record
        self.model = ns.model


class Server:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.truth: dict[str, Any] = {}
        self.requests = 0
        self.events = 0
        self._heap: list[tuple[float, int, Stream]] = []
        self._seq = 0
        self._wake: asyncio.Event | None = None

    def schedule(self, stream: Stream) -> None:
        self.requests += 1
        self._seq += 1
        heapq.heappush(self._heap, (stream.due(), self._seq, stream))
        if self._wake is not None:
            self._wake.set()

    async def ticker(self) -> None:
        """Write every due event, then sleep until the next one is due (absolute deadlines: no drift)."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        heap = self._heap
        while True:
            now = loop.time()
            while heap and heap[0][0] <= now:
                _, seq, stream = heapq.heappop(heap)
                if stream.step():
                    heapq.heappush(heap, (stream.due(), seq, stream))
            self._wake.clear()
            delay = heap[0][0] - loop.time() if heap else 1.0
            if delay > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    pass


class SockTransport:
    """Just what Conn and Stream need of a transport, over a non-blocking socket read with recvmsg, so each
    request is stamped with the kernel's arrival time (SO_TIMESTAMPNS) rather than the moment this busy
    loop got round to it: the truth of TTFT must not include the truth server's own queueing."""

    def __init__(self, sock: socket.socket, conn: Conn, clock: RealtimeClock) -> None:
        self.sock, self.conn, self.clock = sock, conn, clock
        self.loop = asyncio.get_running_loop()
        self.out = bytearray()
        self.closing = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        while not self.closing:
            try:
                data, anc, _, _ = self.sock.recvmsg(65536, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close()
                return
            if not data:
                self.close()
                return
            t = perf_ns()
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack_from("qq", payload)
                    t = min(t, self.clock.to_perf(sec * 1_000_000_000 + nsec))
            self.conn.data_received(data, t)

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        if not self.out:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.close()
                return
            if sent == len(data):
                return
            data = data[sent:]
            self.loop.add_writer(self.sock.fileno(), self._writable)
        self.out += data

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError:
            self.close()
            return
        del self.out[:sent]
        if not self.out:
            self.loop.remove_writer(self.sock.fileno())

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
            self.sock.close()


class RealtimeClock:
    """CLOCK_REALTIME (kernel stamps) -> perf_counter_ns, recalibrated every 0.5 s."""

    def __init__(self) -> None:
        self.offset, self.at = 0, 0
        self.calibrate()

    def calibrate(self) -> None:
        best = None
        for _ in range(5):
            a = perf_ns()
            w = time.time_ns()
            b = perf_ns()
            if best is None or b - a < best[0]:
                best = (b - a, w - (a + b) // 2)
        assert best is not None
        self.offset, self.at = best[1], perf_ns()

    def to_perf(self, realtime_ns: int) -> int:
        if perf_ns() - self.at > 500_000_000:
            self.calibrate()
        return realtime_ns - self.offset


class Conn:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = b""
        self.t_first = 0  # arrival of the first byte of the request being buffered
        self.transport: SockTransport | None = None
        self.busy = False

    def data_received(self, data: bytes, t: int | None = None) -> None:
        if data and not self.buf:
            self.t_first = t or perf_ns()
        self.buf += data
        t = self.t_first
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            method, path = head[0].split(" ")[:2]
            self.busy = True
            if self.buf:
                self.t_first = perf_ns()
            asyncio.get_running_loop().create_task(self.handle(method, path.split("?")[0], body, t))

    def send_json(self, status: int, obj: Any) -> None:
        raw = json.dumps(obj).encode()
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (status, len(raw), raw))

    async def handle(self, method: str, path: str, body: bytes, t_req: int) -> None:
        try:
            if method == "GET":
                if path in ("/health", "/health/live"):
                    self.send_json(200, {"status": "ok"})
                elif path == "/v1/models":
                    self.send_json(200, {"object": "list", "data": [{"id": self.server.cfg.model, "object": "model",
                                                                     "created": 0, "owned_by": "truth"}]})
                elif path == "/truth":
                    self.send_json(200, self.server.truth)
                elif path == "/stats":
                    self.send_json(200, {"requests": self.server.requests, "events": self.server.events})
                elif path == "/reset":
                    self.server.truth.clear()
                    self.send_json(200, {"ok": True})
                elif path == "/hardware":
                    self.send_json(200, {"hardware_class": "truth-server"})
                else:
                    self.send_json(404, {"error": {"message": f"no route {path}"}})
            elif path == "/tokenize":
                req = json.loads(body or b"{}")
                text = " ".join(str(m.get("content", "")) for m in req.get("messages", [])) or str(req.get("prompt", ""))
                self.send_json(200, {"count": len(text.split()), "tokens": list(range(len(text.split())))})
            elif path in ("/v1/chat/completions", "/v1/completions"):
                await self.stream(json.loads(body or b"{}"), path.endswith("chat/completions"), t_req)
            else:
                self.send_json(404, {"error": {"message": f"no route {path}"}})
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self.busy = False
            if self.buf and self.transport is not None and not self.transport.is_closing():
                self.data_received(b"", self.t_first)

    async def stream(self, req: dict[str, Any], chat: bool, t_req: int) -> None:
        tr = self.transport
        assert tr is not None
        stream = Stream(self.server, tr, req, chat, t_req)
        tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        self.server.schedule(stream)
        await stream.finished


class Stream:
    """One response as a state machine; the server's single ticker writes its events when they are due
    (a coroutine per stream costs ~3x the CPU per event, and this server must outrun the clients)."""

    def __init__(self, server: Server, tr: SockTransport, req: dict[str, Any], chat: bool, t_req: int) -> None:
        cfg = server.cfg
        loop = asyncio.get_running_loop()
        self.server, self.tr, self.chat = server, tr, chat
        self.finished: asyncio.Future[None] = loop.create_future()
        self.n = int(req.get("max_tokens") or req.get("max_completion_tokens") or cfg.default_tokens)
        opts = req.get("stream_options") or {}
        self.usage_on, self.continuous = bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats"))
        text = " ".join(str(m.get("content", "")) for m in req.get("messages", [])) if chat else str(req.get("prompt", ""))
        self.n_prompt = len(text.split())
        self.rid = "chatcmpl-" + uuid.uuid4().hex[:20]
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = '{"id":"%s","object":"%s","created":0,"model":"%s","choices":[' % (self.rid, obj, cfg.model)
        self.tools = chat and bool(req.get("tools"))
        self.tool_name = req["tools"][0]["function"]["name"] if self.tools else ""
        self.t_req = t_req
        self.t0 = loop.time() + (t_req - perf_ns()) / 1e9  # the request's arrival on the loop's clock
        self.sent = 0
        self.j = 0
        self.last_write = 0.0  # loop time of this stream's last token write
        self.tail_step = 0
        self.events: list[list[Any]] = []
        self.cache: dict[tuple[str, int], bytes] = {}

    def due(self) -> float:
        cfg = self.server.cfg
        if self.sent < self.n:
            nominal = self.t0 + cfg.ttft_s + self.j * cfg.k * cfg.itl_s
            # a late server catches up, but never writes one stream's events closer than half an ITL: an
            # engine emits one token per sequence per step, so back-to-back bursts would be an artefact
            return max(nominal, self.last_write + 0.5 * cfg.k * cfg.itl_s) if self.j else nominal
        last = self.t0 + cfg.ttft_s + (self.j - 1) * cfg.k * cfg.itl_s
        return last + cfg.tail_s * (self.tail_step + 1)

    def _token_bytes(self, take: int) -> tuple[bytes, str]:
        cfg = self.server.cfg
        if self.tools:
            kind = "t"
            if self.sent == 0:
                tc = {"index": 0, "id": "call_" + self.rid[-8:], "type": "function",
                      "function": {"name": self.tool_name, "arguments": ""}}
            else:
                piece = '{"city": "Paris"' if self.sent == 1 else ("}" if self.sent + take >= self.n else " ")
                tc = {"index": 0, "function": {"arguments": piece}}
            delta = json.dumps({"tool_calls": [tc]})
        elif self.sent < cfg.reasoning:
            kind, delta = "r", json.dumps({"reasoning_content": " think" * take})
        else:
            kind, delta = "c", json.dumps({"content": " word" * take})
        if not self.continuous and not self.tools:
            cached = self.cache.get((kind, take))
            if cached is not None:
                return cached, kind
        choice = ('{"index":0,"delta":%s,"finish_reason":null}' % delta) if self.chat else \
            ('{"index":0,"text":%s,"finish_reason":null}' % json.dumps(" word" * take))
        usage = (',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}'
                 % (self.n_prompt, self.sent + take, self.n_prompt + self.sent + take)) if self.continuous else ""
        data = b"data: " + (self.head + choice + "]" + usage + "}").encode() + b"\n\n"
        out = b"%x\r\n%s\r\n" % (len(data), data)
        if not self.continuous and not self.tools:
            self.cache[(kind, take)] = out
        return out, kind

    def step(self) -> bool:
        """Write what is due now; False when the response is complete (or the client left)."""
        cfg, tr = self.server.cfg, self.tr
        if tr.is_closing():
            return self._done()
        if self.sent < self.n:
            take = min(cfg.k, self.n - self.sent)
            out, kind = self._token_bytes(take)
            t_w = perf_ns()
            tr.write(out)
            t_after = perf_ns()
            self.server.events += 1
            if cfg.record:
                # the bytes reached the client's socket somewhere in [t_w, t_after]: usually a few µs, but a
                # truth server preempted inside write() (a busy 2-core box) must not blame the client for it
                self.events.append([t_w, take, kind, t_after])
            self.sent += take
            self.j += 1
            self.last_write = asyncio.get_running_loop().time()
            return True
        chunks = [self._finish_bytes()]
        if self.usage_on:
            chunks.append(self._usage_bytes())
        chunks.append(b"data: [DONE]\n\n")
        if cfg.tail_s == 0:
            tr.write(b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n")
            return self._done()
        data = chunks[self.tail_step]
        tr.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.tail_step += 1
        if self.tail_step < len(chunks):
            return True
        tr.write(b"0\r\n\r\n")
        return self._done()

    def _finish_bytes(self) -> bytes:
        reason = "tool_calls" if self.tools else "length"
        finish = '{"index":0,"delta":{},"finish_reason":"%s"}' % reason if self.chat else \
            '{"index":0,"text":"","finish_reason":"length"}'
        return b"data: " + (self.head + finish + "]}").encode() + b"\n\n"

    def _usage_bytes(self) -> bytes:
        u = {"prompt_tokens": self.n_prompt, "completion_tokens": self.n, "total_tokens": self.n_prompt + self.n,
             "completion_tokens_details": {"reasoning_tokens": 0 if self.tools else min(self.server.cfg.reasoning, self.n)}}
        return b"data: " + (self.head + "],\"usage\":" + json.dumps(u) + "}").encode() + b"\n\n"

    def _done(self) -> bool:
        if self.server.cfg.record and not self.tr.is_closing():
            self.server.truth[self.rid] = {"t_req": self.t_req, "events": self.events, "prompt_tokens": self.n_prompt}
        if not self.finished.done():
            self.finished.set_result(None)
        return False


async def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--reasoning", type=int, default=0, help="reasoning tokens before the content")
    ap.add_argument("--tail-ms", type=float, default=0.0, help="delay of the finish, usage and [DONE] chunks")
    ap.add_argument("--tokens", type=int, default=16, help="tokens when the request gives no max_tokens")
    ap.add_argument("--model", default="truth-model")
    ap.add_argument("--record", action="store_true", help="keep per-event send times for GET /truth")
    ns = ap.parse_args(argv)
    server = Server(Config(ns))
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted sockets inherit it: a request sent right after connect() is stamped even before accept()
    listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    listener.bind(("127.0.0.1", ns.port))
    listener.listen(4096)
    listener.setblocking(False)
    clock = RealtimeClock()

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn = Conn(server)
            conn.transport = SockTransport(sock, conn, clock)

    loop.add_reader(listener.fileno(), accept)
    port = listener.getsockname()[1]
    ticker = loop.create_task(server.ticker())
    print(f"PORT {port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        ticker.cancel()


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1:]))
    except KeyboardInterrupt:
        pass
