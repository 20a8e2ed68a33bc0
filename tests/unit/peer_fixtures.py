"""Real peer listeners (and a local API) on loopback for the hardening tests: one node per config dir, raw
sockets for what a well-behaved client would never send, and hellos signed as a stranger would sign them.

Sources other than 127.0.0.1 are other loopback addresses (127.0.0.2, ...): Linux routes all of 127/8 to
lo, so per-source limits can be exercised without leaving the machine."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx

from metralectl.peers.admission import Facts, GpuFact
from metralectl.peers.listener import Node, PeerServer
from metralectl.peers.protocol import sign_request
from metralectl.seams import identity

FACTS = Facts(gpu=lambda: GpuFact("NVIDIA GB10", "gb10"), busy=lambda: None, queued=lambda: 0,
              memory=lambda: 100 * 10**9, disk=lambda p: 900 * 10**9)


class Box:
    """A node with its own config dir, listening on 127.0.0.1 (all of lo when host is 0.0.0.0 is not used)."""

    def __init__(self, root: Path, name: str, *, facts: Facts = FACTS, node_name: str | None = None,
                 host: str = "127.0.0.1") -> None:
        self.base = root / name
        self.name = name
        self.me = identity.load_or_create(self.base)
        self.node = Node(self.base, self.me, facts, name=node_name if node_name is not None else name,
                         home=root / f"{name}-home", lock_path=root / f"{name}.lock")
        self.server = PeerServer(self.node, host, 0)
        self.server.start(f"peer-{name}")

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        self.server.stop()


def client(source: str = "127.0.0.1") -> httpx.Client:
    """An HTTP client whose connections come from `source` (a loopback address)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10, trust_env=False)


def hello_request(sender: identity.Identity, to: Box, *, name: str = "stranger", peer_port: Any = 8899,
                  body: bytes | None = None) -> tuple[bytes, dict[str, str]]:
    raw = body if body is not None else json.dumps({"public_key": sender.public_b64, "name": name,
                                                    "peer_port": peer_port}).encode()
    headers = sign_request(sender, to.me.fingerprint, "POST", "/peer/v1/hello", raw)
    headers["Content-Type"] = "application/json"
    return raw, headers


def send_hello(sender: identity.Identity, to: Box, *, source: str = "127.0.0.1", **kw: Any) -> httpx.Response:
    raw, headers = hello_request(sender, to, **kw)
    with client(source) as http:
        return http.post(f"http://{to.addr}/peer/v1/hello", content=raw, headers=headers)


def raw_exchange(port: int, request: bytes, *, source: str = "127.0.0.1", timeout: float = 10) -> bytes:
    """Send bytes as they are; everything the server answers until it closes (or `timeout`)."""
    with socket.socket() as sock:
        sock.settimeout(timeout)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if _complete(b"".join(chunks)):
                    break
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1."), answer[:200]
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> Any:
    return json.loads(answer.partition(b"\r\n\r\n")[2])
