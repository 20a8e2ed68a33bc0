"""The requesting side of the peer protocol, over the one HTTP client (seams/httpclient.py, imported inside the
functions)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.seams.identity import Identity, fingerprint_of, public_key_from_b64
from metralectl.peers.address import PeerAddress
from metralectl.peers.protocol import H_KEY, new_nonce, sign_request, verify_response
from metralectl.peers.store import key_changed

TIMEOUT_S = 5.0


class PeerUnreachable(MetralError):
    """Nothing (or not a metralectl peer listener) answered at that address."""

    exit_code = ExitCode.UNAVAILABLE


class PeerProtocolError(MetralError):
    """The peer answered, but not in a way that can be trusted."""

    exit_code = ExitCode.FAILED


@dataclass(frozen=True)
class RemoteIdentity:
    fingerprint: str
    public_key: bytes
    name: str
    version: str

    @property
    def public_b64(self) -> str:
        import base64

        return base64.b64encode(self.public_key).decode("ascii")


@dataclass(frozen=True)
class Answer:
    status: int
    value: Any


def _send(addr: PeerAddress, method: str, path: str, body: bytes, headers: dict[str, str],
          timeout: float) -> tuple[int, Mapping[str, str], bytes]:
    from metralectl.seams.bounded import CONTROL_LIMIT
    from metralectl.seams.httpclient import Client, Failed

    url = addr.url(path)
    try:
        with Client(timeout=timeout) as client:
            with client.stream(method, url, content=body, headers=headers) as reply:
                content = reply.body(CONTROL_LIMIT, str(addr))  # TooLarge past it (exit 65)
    except Failed as exc:
        if exc.timed_out:
            raise PeerUnreachable(f"{addr}: no answer within {timeout:g} s",
                                  "is its agent running with the peer listener on (there: `metralectl agent start "
                                  "--peers`), and its peer port open in the firewall?") from None
        raise PeerUnreachable(f"{addr}: {exc}",
                              "is its agent running with the peer listener on? (there: `metralectl agent start --peers`; "
                              "the peer port: `--peer-port`)") from None
    return reply.status, reply.headers, content


class StreamBroken(PeerUnreachable):
    """A streamed answer broke off (reset, EOF mid-line is not this: silence past the read timeout is)."""

    exit_code = ExitCode.UNAVAILABLE


@dataclass
class Stream:
    status: int
    headers: Mapping[str, str]
    lines: Iterator[bytes]  # the body's lines, exact bytes without the newline; raises StreamBroken
    read: Any  # () -> bytes: the whole body (for a non-200 answer)


@contextmanager
def open_stream(addr: PeerAddress, path: str, headers: dict[str, str], *, read_timeout: float) -> Iterator[Stream]:
    """GET a streamed answer; a transport failure at any point is StreamBroken (or PeerUnreachable before it began)."""
    from metralectl.seams import bounded
    from metralectl.seams.httpclient import Client, Failed, Reply

    def lines(reply: Reply) -> Iterator[bytes]:
        try:  # one event per line, each at most LINE_LIMIT (TooLarge, exit 65, past it)
            yield from reply.lines(bounded.LINE_LIMIT, str(addr))
        except Failed as exc:
            raise StreamBroken(f"{addr}: {exc.named}") from None

    try:
        with Client(timeout=TIMEOUT_S, read_timeout=read_timeout) as client:
            with client.stream("GET", addr.url(path), headers=headers) as reply:
                yield Stream(reply.status, reply.headers, lines(reply),
                             lambda: reply.body(bounded.CONTROL_LIMIT, str(addr)))
    except Failed as exc:
        raise StreamBroken(f"{addr}: {exc.named}") from None


def _decode(addr: object, body: bytes) -> object:  # JSON: callers check its shape; addr names the node
    from metralectl.seams.httpserve import parse_json

    try:
        return parse_json(body)
    except ValueError:
        raise PeerProtocolError(f"{addr}: the answer is not JSON (not a metralectl peer listener?)") from None


def fetch_identity(addr: PeerAddress, *, timeout: float = TIMEOUT_S) -> RemoteIdentity:
    """Who answers at addr, proven: its answer is signed, over our fresh challenge, by the key it shows."""
    challenge = new_nonce()
    status, headers, body = _send(addr, "GET", f"/peer/v1/identity?challenge={challenge}", b"", {}, timeout)
    value = _decode(addr, body)
    if status != 200 or not isinstance(value, dict):
        raise PeerProtocolError(f"{addr}: identity request answered {status}: {value}")
    try:
        key = public_key_from_b64(str(value["public_key"]))
        claimed = str(value["fingerprint"])
    except (KeyError, ValueError) as exc:
        raise PeerProtocolError(f"{addr}: malformed identity ({exc})") from None
    if fingerprint_of(key) != claimed:
        raise PeerProtocolError(f"{addr}: its fingerprint {claimed} does not belong to the key it shows")
    problem = verify_response(headers, status, body, nonce=challenge, me="", expect_key=claimed, public=key)
    if problem:
        raise PeerProtocolError(f"{addr}: identity not proven: {problem}")
    return RemoteIdentity(claimed, key, str(value.get("name", "")), str(value.get("version", "")))


def signed_call(me: Identity, addr: PeerAddress, fingerprint: str, public_key: bytes, method: str, path: str,
                body: bytes = b"", *, timeout: float = TIMEOUT_S) -> Answer:
    """A request signed by `me` for the node `fingerprint`; the answer must be signed by that node's key."""
    headers = sign_request(me, fingerprint, method, path, body)
    if body:
        headers["Content-Type"] = "application/json"
    status, response_headers, response_body = _send(addr, method, path, body, headers, timeout)
    answered_as = response_headers.get(H_KEY)
    if answered_as and answered_as != fingerprint:
        raise key_changed(str(addr), fingerprint, str(answered_as))
    problem = verify_response(response_headers, status, response_body, nonce=headers["X-Metrale-Nonce"], me=me.fingerprint,
                              expect_key=fingerprint, public=public_key)
    if problem:
        raise PeerProtocolError(f"{addr}: answer refused: {problem}",
                                "if the node was reinstalled, check `metralectl id` there and pair again")
    return Answer(status, _decode(addr, response_body))


def hello(me: Identity, addr: PeerAddress, fingerprint: str, public_key: bytes, *, name: str, peer_port: int,
          timeout: float = TIMEOUT_S) -> Answer:
    body = json.dumps({"public_key": me.public_b64, "name": name, "peer_port": peer_port}).encode()
    return signed_call(me, addr, fingerprint, public_key, "POST", "/peer/v1/hello", body, timeout=timeout)
