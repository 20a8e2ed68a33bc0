"""The peer listener: the HTTP port other metralectl nodes talk to (PEER_PORT; not the local API).

    GET  /peer/v1/identity?challenge=N   public: fingerprint, key, name; the answer is signed over N,
                                         which proves the node holds the key it shows
    POST /peer/v1/hello                  public, self-signed: "I paired with you; here is my key".
                                         Stored as pending; trusts nothing until the operator types the
                                         fingerprint here (`metralectl peer grant-bench FP`)
    GET  /peer/v1/admission              signed by a known peer: the bench admission answer
    GET  /peer/v1/thermal                signed by a known peer: the hottest GPU and the throttle flags
    /peer/v1/units...                    remote benchmark units (unit_routes.py): submit, follow, fetch, cancel
    /peer/v1/fabric...                   links and a bounded throughput probe for `doctor --peer` (fabric_routes.py)

Every other request must be signed by a known peer's key (protocol.verify_request); every answer is
signed by this node's key (protocol.sign_response).

Anyone on the network may connect (0.0.0.0 by default), so the listener caps connections (MAX_CONNECTIONS,
MAX_PER_SOURCE: seams/httpserve.py answers the next one 503 and closes it), gives each request a deadline,
and keeps strangers' hellos apart: rate-limited per source and checked against their own nonce store
(limits.py), never the one paired peers' requests need.
"""

from __future__ import annotations

import functools
import logging
import math
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from metralectl import __version__
from metralectl.safetext import NAME_LIMIT, clean
from metralectl.seams.httpserve import BadRequest, Handler, Server, json_bytes, parse_json
from metralectl.seams.identity import Identity, fingerprint_of, public_key_from_b64
from metralectl.peers import PEER_PORT
from metralectl.peers.address import PeerAddress
from metralectl.peers.admission import Admission, Facts, judge
from metralectl.peers.config import BenchConfig, bench_path, load_bench_config
from metralectl.peers.limits import HELLO_NONCES, SourceLimiter, source_key
from metralectl.peers.protocol import (
    _NONCE,
    H_KEY,
    H_NONCE,
    NonceStore,
    Refusal,
    SignedRequest,
    sign_response,
    verify_request,
)
from metralectl.peers.store import PeerStore
from metralectl.peers.units import Executor, UnitQueue
from metralectl.seams.store import lifecycle_lock

log = logging.getLogger("metralectl.peers")
PROTOCOL = 1
MAX_CONNECTIONS = 128  # open connections to the peer port at once
MAX_PER_SOURCE = 16  # ... from one address (a campaign keeps a few streams open to a node)


@dataclass
class Node:
    """This node as the peer listener sees it. Everything is explicit, so two nodes can share a process."""

    base: Path  # the config dir: identity, peers, bench.yaml, the nonce store
    identity: Identity
    facts: Facts = field(default_factory=Facts)
    name: str = field(default_factory=socket.gethostname)
    home: Path | None = None  # METRALE_HOME: units and their records (default: paths.metrale_home())
    executor: Executor | None = None  # how units run (default: `metralectl bench run` as a child)
    lock_path: Path | None = None  # the lifecycle lock units hold (default: this machine's; tests give each node one)
    sys_root: str = "/sys"  # where this node's links are read (fabric_routes; tests give a fake sysfs)
    proc_root: str = "/proc"
    peers: PeerStore = field(init=False)
    nonces: NonceStore = field(init=False)  # paired peers' signed requests (persisted)
    hello_nonces: NonceStore = field(init=False)  # strangers' self-signed hellos (memory only, apart)
    hello_limit: SourceLimiter = field(init=False)
    units: UnitQueue = field(init=False)

    def __post_init__(self) -> None:
        from metralectl import paths
        from metralectl.peers.unit_exec import SubprocessExecutor
        from metralectl.peers.store import private_dir

        self.peers = PeerStore(self.base)
        private_dir(self.peers.dir)
        self.nonces = NonceStore(self.base / "peers" / "nonces")
        self.hello_nonces = NonceStore(None, max_entries=HELLO_NONCES)
        self.hello_limit = SourceLimiter()
        home = self.home if self.home is not None else paths.metrale_home()
        executor = self.executor or SubprocessExecutor(self.base, home, lambda: self.bench_config().endpoint)
        self.units = UnitQueue(home, executor, lock=functools.partial(lifecycle_lock, path=self.lock_path))

    def bench_config(self) -> BenchConfig:
        return load_bench_config(self.base)

    def trusted_key(self, fingerprint: str) -> bytes | None:
        peer = self.peers.load().by_fingerprint(fingerprint)
        return peer.key if peer is not None else None

    def admission(self, grants: tuple[str, ...] | None) -> Admission:
        return judge(self.bench_config(), fingerprint=self.identity.fingerprint, name=self.name,
                     facts=self.facts, requester_grants=grants, config_path=bench_path(self.base),
                     queued=self.units.waiting())


class PeerHandler(Handler):
    server: PeerServer

    # -- plumbing -------------------------------------------------------------------------------
    def _answer(self, status: int, value: Any, *, nonce: str = "", to: str = "") -> None:
        body = json_bytes(value)
        headers = sign_response(self.server.node.identity, status, nonce, to, body)
        self.send_bytes(status, body, "application/json", headers)

    def refuse_request(self, status: int, reason: str) -> None:
        self._refuse(Refusal(status, reason))

    @property
    def source(self) -> str:
        return Server.source_of(self.client_address)

    def _refuse(self, refusal: Refusal) -> None:
        nonce = self.header(H_NONCE) or ""
        self._answer(refusal.status, {"error": refusal.reason},
                     nonce=nonce if _NONCE.fullmatch(nonce) else "", to=self.header(H_KEY) or "")

    def _signed(self, body: bytes, keys: Any = None, nonces: NonceStore | None = None) -> SignedRequest | None:
        node = self.server.node
        result = verify_request(self.headers, self.command, self.path, body, me=node.identity.fingerprint,
                                keys=keys or node.trusted_key, nonces=node.nonces if nonces is None else nonces)
        if isinstance(result, Refusal):
            log.info("peer request refused from %s: %s", self.source, clean(result.reason, 300))
            self._refuse(result)
            return None
        return result

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        route = urlsplit(self.path).path
        if route == "/peer/v1/fabric" or route.startswith("/peer/v1/fabric/"):
            from metralectl.peers.fabric_routes import dispatch as fabric

            fabric(self, method, route)  # the sink reads its own (larger, discarded) body, after the signature
            return
        try:
            body = self.read_body()
        except BadRequest as exc:
            self.close_connection = True
            self._refuse(Refusal(exc.status, str(exc)))
            return
        if method == "GET" and route == "/peer/v1/identity":
            self._identity()
        elif method == "POST" and route == "/peer/v1/hello":
            self._hello(body)
        elif method == "GET" and route == "/peer/v1/admission":
            self._admission(body)
        elif method == "GET" and route == "/peer/v1/thermal":
            self._thermal(body)
        elif route == "/peer/v1/units" or route.startswith("/peer/v1/units/"):
            from metralectl.peers.unit_routes import dispatch

            dispatch(self, method, route, body)
        else:
            request = self._signed(body)  # unknown paths answer only to known peers
            if request is not None:
                self._answer(404, {"error": f"no {method} {route}"}, nonce=request.nonce, to=request.key)

    # -- routes ---------------------------------------------------------------------------------
    def _identity(self) -> None:
        node = self.server.node
        challenge = (parse_qs(urlsplit(self.path).query).get("challenge") or [""])[0]
        if not _NONCE.fullmatch(challenge):
            self._answer(400, {"error": "a challenge (16-64 url-safe characters) is required"})
            return
        self._answer(200, {"fingerprint": node.identity.fingerprint, "public_key": node.identity.public_b64,
                           "name": node.name, "protocol": PROTOCOL, "version": __version__}, nonce=challenge)

    def _hello(self, body: bytes) -> None:
        node = self.server.node
        wait = node.hello_limit.take(source_key(self.source))
        if wait:
            log.debug("hello from %s refused: too many hellos from there", self.source)  # a flood: not one line each
            self.close_connection = True
            self._refuse(Refusal(429, f"too many hellos from {self.source}; try again in {math.ceil(wait)} s"))
            return
        try:
            hello = parse_json(body)
            if not isinstance(hello, dict):
                raise ValueError("a hello is a JSON object")
            key = public_key_from_b64(str(hello["public_key"]))
            name, port = hello.get("name", ""), hello.get("peer_port", PEER_PORT)
            if not isinstance(name, str):
                raise ValueError("name must be a string")
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise ValueError(f"peer_port must be a port number from 1 to 65535, not {clean(str(port), 20)}")
        except (ValueError, KeyError, TypeError) as exc:
            self._refuse(Refusal(400, f"a hello needs {{public_key, name, peer_port}} ({clean(str(exc), 120)})"))
            return
        fp = fingerprint_of(key)
        request = self._signed(body, keys=lambda claimed: key if claimed == fp else None,  # self-signed
                               nonces=node.hello_nonces)
        if request is None:
            return
        source = PeerAddress(self.source, port).netloc
        node.peers.add_pending(fp, hello["public_key"], name[:NAME_LIMIT], source)
        log.info("hello from %s (%s) at %s: pending until the operator grants it", fp, clean(name, NAME_LIMIT), source)
        self._answer(200, {"pending": True, "fingerprint": self.server.node.identity.fingerprint},
                     nonce=request.nonce, to=request.key)

    def _admission(self, body: bytes) -> None:
        request = self._signed(body)
        if request is None:
            return
        peer = self.server.node.peers.load().by_fingerprint(request.key)
        grants = peer.grants if peer is not None else ()
        try:
            answer = self.server.node.admission(grants).to_json()
        except Exception as exc:  # noqa: BLE001 - a broken bench.yaml is an answer, not a dropped connection
            message = getattr(exc, "message", str(exc))
            self._answer(500, {"error": f"this node cannot judge admission: {message}",
                               "hint": getattr(exc, "hint", None)}, nonce=request.nonce, to=request.key)
            return
        self._answer(200, answer, nonce=request.nonce, to=request.key)


    def _thermal(self, body: bytes) -> None:
        request = self._signed(body)
        if request is None:
            return
        reading = dict(self.server.node.facts.thermal())
        reading["hardware_class"] = self.server.node.bench_config().hardware_class
        self._answer(200, reading, nonce=request.nonce, to=request.key)


class PeerServer(Server):
    max_connections = MAX_CONNECTIONS
    max_per_source = MAX_PER_SOURCE

    def __init__(self, node: Node, host: str = "0.0.0.0", port: int = PEER_PORT) -> None:
        self.node = node
        super().__init__((host, port), PeerHandler)

    def start(self, name: str) -> threading.Thread:
        self.node.units.start()
        return super().start(name)

    def stop(self) -> None:
        super().stop()
        self.node.units.stop()
