"""The small HTTP server base shared by the local API and the peer listener (stdlib http.server).

One thread per connection (daemon threads: a stuck client cannot keep the process alive), and what
keeps that safe when anyone may connect (the peer listener listens on 0.0.0.0):

* a cap on open connections per listener and per source address: one more is answered 503 and closed
  at once, without a thread, so idle connections cannot exhaust threads or descriptors;
* a deadline for the whole request (request line, headers and body), not only per read, so a client
  trickling a byte now and then cannot hold a connection for ever;
* a listen backlog of REQUEST_QUEUE, and a pause when accept() finds no descriptor left (EMFILE):
  the socket stays readable then, and retrying at once would spin a core;
* strict framing: an ASCII Content-Length, no chunked bodies, no repeated Host/Content-Length/Origin/
  Authorization headers (400), bodies bounded before they are read, JSON parsed without recursion
  errors (parse_json).

No access log on stdout (the agent's own log line per request goes to its logger).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from metralectl.wording import count

log = logging.getLogger("metralectl.http")
MAX_BODY = 1 << 20
REQUEST_QUEUE = 128  # the listen backlog (the kernel caps it at net.core.somaxconn)
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.05, 0.5
SINGLE_HEADERS = ("Host", "Content-Length", "Transfer-Encoding", "Content-Type", "Origin", "Authorization",
                  "Sec-Fetch-Site")
_LENGTH = re.compile(r"[0-9]{1,12}")  # ASCII digits only: str.isdigit() accepts '²', which int() refuses
_BUSY_BODY = b'{"error": "too many connections to this listener; try again later"}\n'
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
         b"Retry-After: 5\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


class BadRequest(Exception):
    """A request this server will not read further: the status to answer and why."""

    status = 400


class BodyTooLarge(BadRequest):
    status = 413


def parse_json(raw: bytes) -> object:
    """JSON from outside; ValueError for anything that is not (a nesting deep enough to exhaust the
    parser's recursion is not JSON we take either)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


def ascii_int(text: str | None) -> int | None:
    """A non-negative decimal written in ASCII digits, or None."""
    return int(text) if text is not None and _LENGTH.fullmatch(text) else None


class _DeadlineReader(io.RawIOBase):
    """The connection's reading side: each read waits at most the idle timeout and never past the
    request's deadline (a trickling client is cut off when the deadline passes, whatever it sends)."""

    def __init__(self, sock: socket.socket, idle_s: float) -> None:
        super().__init__()
        self._sock = sock
        self.idle_s = idle_s
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wait = self.idle_s
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive within its deadline")
            wait = min(wait, left)
        self._sock.settimeout(wait)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self.idle_s)  # writes keep the idle timeout


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    request_queue_size = REQUEST_QUEUE
    max_connections = 64  # open connections at once, over all sources
    max_per_source: int | None = None  # open connections at once from one address (None: no cap)

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self._conn_lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._open_total = 0
        self._backoff_s = 0.0
        self._last_warning = 0.0
        self.turned_away = 0  # connections answered 503 for a cap (tests and logs read it)
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            try:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" takes IPv4 too
            except OSError:
                pass
        super().server_bind()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self, name: str) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, name=name, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that left is no error; anything else is logged (escaped by the agent's log formatter),
        not printed raw to stderr as socketserver does."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            log.debug("port %d: %s left (%s)", self.port, self.source_of(client_address), type(exc).__name__)
            return
        log.error("port %d: internal error answering %s", self.port, self.source_of(client_address), exc_info=True)

    # -- accepting ------------------------------------------------------------------------------
    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            accepted = self.socket.accept()
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:
                self._starved(exc)
            raise  # socketserver drops this round and selects again
        self._backoff_s = 0.0
        return accepted

    def _starved(self, exc: OSError) -> None:
        """No descriptor for the connection waiting: pause (doubling, up to BACKOFF_MAX_S) instead of
        selecting again at once on a socket that stays readable."""
        self._backoff_s = min(BACKOFF_MAX_S, self._backoff_s * 2 or BACKOFF_FIRST_S)
        self._warn(f"port {self.port}: cannot accept a connection ({exc.strerror}); pausing {self._backoff_s:g} s")
        time.sleep(self._backoff_s)

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 10.0:  # one line per 10 s, not one per connection of a flood
            self._last_warning = now
            log.warning("%s", message)

    @staticmethod
    def source_of(client_address: Any) -> str:
        host = str(client_address[0]) if isinstance(client_address, tuple) and client_address else "?"
        return host.removeprefix("::ffff:")

    def process_request(self, request: Any, client_address: Any) -> None:
        source = self.source_of(client_address)
        with self._conn_lock:
            full = self._open_total >= self.max_connections
            crowded = self.max_per_source is not None and self._open.get(source, 0) >= self.max_per_source
            if not (full or crowded):
                self._open_total += 1
                self._open[source] = self._open.get(source, 0) + 1
        if full or crowded:
            self._turn_away(request, f"{count(self._open_total, 'connection')} open" if full
                            else f"{source} has {count(self.max_per_source or 0, 'connection')} open")
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(source)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(self.source_of(client_address))

    def _release(self, source: str) -> None:
        with self._conn_lock:
            self._open_total -= 1
            left = self._open.get(source, 1) - 1
            if left > 0:
                self._open[source] = left
            else:
                self._open.pop(source, None)

    def _turn_away(self, request: socket.socket, why: str) -> None:
        """503 and close, from the accepting thread, without waiting on the client (never blocks)."""
        self.turned_away += 1
        self._warn(f"port {self.port}: refusing connections ({why}; at most {self.max_connections}"
                   + (f", {self.max_per_source} per source" if self.max_per_source else "") + ")")
        try:
            request.setblocking(False)
            request.send(_BUSY)
        except OSError:
            pass
        self.shutdown_request(request)

    def open_connections(self) -> int:
        with self._conn_lock:
            return self._open_total


class Handler(BaseHTTPRequestHandler):
    server_version = "metralectl"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 15  # seconds one read (or write) may wait
    request_deadline_s = 15.0  # request line + headers + body, in all
    max_body = MAX_BODY

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection, float(self.timeout or 15))
        plain, self.rfile = self.rfile, io.BufferedReader(self._reader, 64 * 1024)
        plain.close()  # the socket's own reader, replaced (closing it leaves the socket open)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.request_deadline_s  # for this request's arrival
        super().handle_one_request()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        for name in SINGLE_HEADERS:
            if len(self.headers.get_all(name) or ()) > 1:
                self.close_connection = True
                self.refuse_request(400, f"the {name} header is given more than once")
                return False
        return True

    def refuse_request(self, status: int, reason: str) -> None:
        """Answer a request refused before routing (subclasses add their own headers or signature)."""
        self.send_json(status, {"error": reason})

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def header(self, name: str) -> str | None:
        value = self.headers.get(name)
        return value if value is None else value.strip()

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise BadRequest("chunked bodies are not accepted; send Content-Length")
        given = self.headers.get("Content-Length")
        length_s = "0" if given is None else given.strip()
        length = ascii_int(length_s)
        if length is None:
            raise BadRequest(f"bad Content-Length {length_s[:20]!r}: expected a number of bytes in ASCII digits")
        if length > self.max_body:
            raise BodyTooLarge(f"body larger than {self.max_body} bytes")
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            raise BadRequest("the body ended before its Content-Length")
        return body

    def send_bytes(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(status, json_bytes(value), "application/json", headers)


def json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode()
