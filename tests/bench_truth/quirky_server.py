"""TEST FIXTURE - an OpenAI-compatible streaming server with the habits of real servers nobody here wrote.

Each habit is an option, taken from a server seen in the field:
  refuse_fields   HTTP 422 naming the unknown fields it refuses (transformers serve: "Unexpected fields in
                  the request: {'ignore_eos', 'min_tokens'}")
  done_marker     False: the stream ends after its finish chunk without `data: [DONE]` (transformers serve)
  usage           False: no usage at all, even when asked (newer transformers serve)
  end             "chunked" (terminal chunk) | "close" (no framing: the body ends when the server closes)
  cut_after       close the connection after this many token events, before any finish_reason
  error_event     send an `error` event after this many token events, then end the stream
  stall_request   this request (1-based count) sends its headers and then nothing, until stopped
  reject_all      every completion request gets this HTTP status with a message naming no field
  fail_every      every k-th completion request gets HTTP 500 (the others succeed)
  switch_after    after this many completion requests, /v1/models and the chunks name `model_b`
  events_per_write  token events written together in one write() (a server that batches)
  close_after_stream  after a complete streamed response, wait this many seconds and close the kept-alive
                  connection without `Connection: close` and without reading what came meanwhile
                  (llama.cpp's llama-server, tests/real_llamacpp/README.md)
  drop            these requests (1-based count) are read and then answered by a close, no byte sent
  reset_request   this request gets its head and two token events, then a TCP reset (SO_LINGER 0)
Stdlib only; runs in a thread of the test process on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KNOWN = {"model", "messages", "max_tokens", "stream", "temperature", "seed", "stream_options", "tools", "tool_choice",
         "ignore_eos", "min_tokens", "prompt", "top_p", "stop"}


@dataclass
class Habits:
    refuse_fields: tuple[str, ...] = ()
    done_marker: bool = True
    usage: bool = True
    end: str = "chunked"
    cut_after: int | None = None
    error_event: int | None = None
    stall_request: int | None = None
    reject_all: int | None = None
    fail_every: int | None = None
    switch_after: int | None = None
    events_per_write: int = 1
    close_after_stream: float | None = None
    drop: tuple[int, ...] = ()
    reset_request: int | None = None
    itl_s: float = 0.002
    ttft_s: float = 0.005
    model: str = "quirky-a"
    model_b: str = "quirky-b"


@dataclass
class Seen:
    completions: int = 0
    connections: int = 0
    refused: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stalled: threading.Event = field(default_factory=threading.Event)  # the stall_request is being held


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.seen.lock:
            self.server.seen.connections += 1

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _model(self) -> str:
        h, seen = self.server.habits, self.server.seen
        return h.model_b if h.switch_after is not None and seen.completions > h.switch_after else h.model

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self._model(), "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        h, seen = self.server.habits, self.server.seen
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._json(404, {"detail": "Not Found"})  # no /tokenize, like transformers serve
            return
        with seen.lock:
            seen.bodies.append(body)
        if h.reject_all is not None:
            self._json(h.reject_all, {"error": {"message": "this server takes no requests today", "type": "invalid"}})
            return
        unexpected = sorted(set(body) & set(h.refuse_fields)) + sorted(
            k for k in (body.get("stream_options") or {}) if k in h.refuse_fields)
        if unexpected:
            with seen.lock:
                seen.refused += 1
            self._json(422, {"detail": "Unexpected fields in the request: {" + ", ".join(repr(k) for k in unexpected) + "}"})
            return
        with seen.lock:
            seen.completions += 1
            number = seen.completions
        if number in h.drop:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if h.fail_every and number % h.fail_every == 0:
            self._json(500, {"error": {"message": "internal error (every k-th request)"}})
            return
        self._stream(body, number)

    def _stream(self, body: dict[str, Any], number: int) -> None:
        h = self.server.habits
        model = self._model()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if h.end == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        if h.stall_request == number:
            self.server.seen.stalled.set()
            self.server.stop.wait()
            self.close_connection = True
            return
        n = int(body.get("max_tokens") or 16)
        want_usage = h.usage and bool((body.get("stream_options") or {}).get("include_usage"))
        rid = f"chatcmpl-{number}"

        def write(events: list[dict[str, Any] | str]) -> None:
            data = b"".join(b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
                            for e in events)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if h.end == "chunked" else data)
            self.wfile.flush()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": rid, "object": "chat.completion.chunk", "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        time.sleep(h.ttft_s)
        pending: list[dict[str, Any] | str] = []
        for i in range(n):
            if h.cut_after is not None and i == h.cut_after:
                if pending:
                    write(pending)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if h.reset_request == number and i == 2:
                if pending:
                    write(pending)
                time.sleep(0.3)  # the client has read what came: a reset discards what it has not
                self.close_connection = True
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                return
            if h.error_event is not None and i == h.error_event:
                write([*pending, {"error": {"message": "CUDA error: an illegal memory access", "code": 500}}])
                self._end()
                return
            pending.append(chunk({"content": f" w{i}"}))
            if len(pending) >= h.events_per_write:
                write(pending)
                pending = []
                time.sleep(h.itl_s)
        final: list[dict[str, Any] | str] = [*pending, chunk({}, "length")]
        if want_usage:
            final.append({"id": rid, "object": "chat.completion.chunk", "model": model, "choices": [],
                          "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}})
        if h.done_marker:
            final.append("[DONE]")
        write(final)
        self._end()

    def _end(self) -> None:
        h = self.server.habits
        if h.end == "chunked":
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        else:
            self.close_connection = True
        if h.close_after_stream is not None:
            time.sleep(h.close_after_stream)
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, habits: Habits) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.habits = habits
        self.seen = Seen()
        self.stop = threading.Event()


@contextmanager
def quirky_server(**habits: Any) -> Iterator[tuple[str, Seen]]:
    server = _Server(Habits(**habits))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.seen
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
