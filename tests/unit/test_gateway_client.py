"""A client's connection to the gateway (client.py): its requests read from bytes cut anywhere, under the same caps
and checks as before, and the fast path that forwards a request for a served model from the callback that read it
(server.Gateway.arrived), handing its connection's task the request already sent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from metralectl.gateway import http1
from metralectl.gateway.client import RequestParser
from metralectl.gateway.dispatch import Flight, Refused, Routed
from metralectl.gateway.http1 import HEAD_LIMIT, BadRequest, Closed, Request
from metralectl.gateway.routes import Route
from metralectl.gateway.upstream import Upstream
from tests.unit.test_gateway_engine_token import Client
from tests.unit.test_gateway_pool import Engine, chat, gateway_before

LIMIT = 4096


def _chunked(body: bytes, cuts: list[int], trailers: bytes) -> bytes:
    points = sorted({c % len(body) for c in cuts} - {0}) if body else []
    parts = [body[a:b] for a, b in zip([0, *points], [*points, len(body)])] if body else []
    return b"".join(b"%x;ext=\"a b\"\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n" + trailers + b"\r\n"


def _requests(pieces: list[bytes], limit: int = LIMIT) -> list[Request]:
    """As a client's connection reads them: each read through take() (a request whole in it is cut from it as it
    is), then what else is whole in the buffer through next()."""
    parser, got = RequestParser(limit), []
    for piece in pieces:
        request = parser.take(piece)
        while request is not None:
            got.append(request)
            request = parser.next()
    return got


def _cut(message: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % len(message) for c in cuts} - {0})
    return [message[a:b] for a, b in zip([0, *points], [*points, len(message)])]


@settings(max_examples=150)
@given(st.binary(max_size=600), st.booleans(), st.lists(st.integers(0, 4000), max_size=6),
       st.sampled_from([b"", b"X-Trailer: 1\r\n"]), st.lists(st.integers(1, 4000), max_size=12))
def test_requests_are_read_the_same_however_their_bytes_are_cut(body: bytes, chunked: bool, chunk_cuts: list[int],
                                                                 trailers: bytes, cuts: list[int]) -> None:
    """Two requests back to back (the second pipelined behind the first): the same method, target, headers and body
    whatever the pieces the socket gave them in, and nothing read of the second before it is whole."""
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % len(body)
    first = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: g\r\nX-Id: 1\r\n" + framing + b"\r\n" + \
        (_chunked(body, chunk_cuts, trailers) if chunked else body)
    second = b"GET /v1/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    got = _requests(_cut(first + second, cuts))
    assert [(r.method, r.target, r.body, r.keep_alive) for r in got] == [
        ("POST", "/v1/chat/completions?x=1", body, True), ("GET", "/v1/models", b"", True)]
    assert got[0].header("x-id") == "1" and got[0].path == "/v1/chat/completions"


@pytest.mark.parametrize("message, status", [
    (b"POST / HTTP/1.1\r\nX: " + b"a" * HEAD_LIMIT + b"\r\n\r\n", 431),  # a head over the cap
    (b"POST / HTTP/1.1\r\nX: " + b"a" * HEAD_LIMIT, 431),  # ... before its end arrived
    (b"POST / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 413),  # a body over the cap, refused before it comes
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"800\r\n" + b"a" * 2048 + b"\r\n" + b"901\r\n",
     413),  # chunks that add up past the cap
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabc\r\n0\r\n\r\n", 400),  # int(x, 16) takes it
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n", 400),  # data not ended by CRLF
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * (HEAD_LIMIT + 1), 400),  # a size line
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"X: y\r\n" * (HEAD_LIMIT // 6 + 1), 400),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),  # read two ways
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
    (b"POST /a b HTTP/1.1\r\n\r\n", 400),
    (b"\r\nPOST / HTTP/1.1\r\n\r\n", 400),
], ids=["head-over-cap", "head-over-cap-unended", "length-over-cap", "chunks-over-cap", "negative-size", "0x-size",
        "chunk-not-crlf", "size-line-too-long", "trailers-too-long", "two-lengths", "length-and-chunked", "gzip",
        "nul-in-value", "space-in-target", "blank-line-first"])
def test_a_request_that_cannot_be_read_is_refused_with_its_status_wherever_it_is_cut(message: bytes,
                                                                                    status: int) -> None:
    for cut in sorted({1, 2, len(message) // 2, len(message) - 1, len(message)}):
        with pytest.raises(BadRequest) as refused:
            _requests([message[:cut], message[cut:]])
        assert refused.value.status == status, (cut, refused.value.message)


def test_what_an_end_of_the_clients_sending_means() -> None:
    parser = RequestParser(LIMIT)
    assert isinstance(parser.ended(), Closed)  # an idle keep-alive connection ending: no error
    parser.buffer += b"\r\n"
    assert isinstance(parser.ended(), Closed)
    parser = RequestParser(LIMIT)
    parser.buffer += b"POST / HTTP/1.1\r\nContent-"
    assert parser.next() is None
    cut = parser.ended()
    assert isinstance(cut, BadRequest) and cut.status == 400  # a head cut short: answered
    parser = RequestParser(LIMIT)
    parser.buffer += b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"
    assert parser.next() is None
    assert isinstance(parser.ended(), Closed)  # a body cut short: nobody to answer


def test_a_large_body_is_consumed_as_it_arrives_not_gathered_twice() -> None:
    parser = RequestParser(1 << 20)
    parser.buffer += b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    for _ in range(64):
        parser.buffer += b"2000\r\n" + b"z" * 0x2000 + b"\r\n"
        assert parser.next() is None
        assert len(parser.buffer) == 0  # decoded as it came: the raw chunks are not kept beside the body
    parser.buffer += b"0\r\n\r\n"
    request = parser.next()
    assert request is not None and request.body == b"z" * (64 * 0x2000)


class Sink(Client):
    """The client's side as the fast path sees it: gone or not, and a transport for the answer."""

    gone = False


def _post(model: str = "stub", headers: list[tuple[str, str]] | None = None) -> Request:
    return Request("POST", "/v1/chat/completions", "HTTP/1.1", headers or [("Content-Type", "application/json")],
                   json.dumps({"model": model, "stream": True, "messages": []}).encode())


def test_a_request_for_a_served_model_is_sent_to_its_engine_from_the_callback_that_read_it() -> None:
    """arrived() (run in the read callback) sends the request and hands the task a Flight: on a connection to the
    engine idle in the pool (pooled), or with none (the first request), on one it connects to right there (the
    engine is on loopback: Pool.now), and nothing is checked twice. What the gateway answers itself goes to the task
    as it came."""
    engine = Engine()
    seen: list[object] = []

    async def go() -> None:
        async with gateway_before(engine.handle) as (gateway, port):
            arrived: Any = gateway.arrived  # called with Sinks too

            def watched(request: Request, client: Any) -> object:
                seen.append(arrived(request, client))
                return seen[-1]

            gateway.arrived = watched  # type: ignore[method-assign]
            await chat(port)
            for _ in range(20):  # the spare opened after the first take
                if gateway.pool._idle.get(("127.0.0.1", gateway.table.routes[0].port)):
                    break
                await asyncio.sleep(0.05)
            await chat(port)
            assert isinstance(arrived(Request("GET", "/v1/models", "HTTP/1.1", []), Sink()), Request)
            assert isinstance(arrived(_post("nobody"), Sink()), Routed)  # not served: the task's queue and its 404
            refused = arrived(Request("POST", "/v1/chat/completions", "HTTP/1.1", [], b"[1]"), Sink())
            assert isinstance(refused, Refused) and refused.answer.status == 400

    asyncio.run(go())
    assert isinstance(seen[0], Flight) and seen[0].client is not None and not seen[0].pooled
    assert isinstance(seen[1], Flight) and seen[1].client is not None and seen[1].pooled
    assert len(engine.requested) == 2


def test_a_request_sent_by_the_fast_path_whose_client_left_before_its_task_woke_is_taken_back() -> None:
    """The client went away between the read callback's send and its task's turn: the engine connection is closed
    (how an engine learns to stop generating), and the connection is not kept."""
    closed = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        while await reader.read(1024):
            pass
        closed.set()  # the gateway closed its side
        writer.close()

    async def go() -> None:
        async with gateway_before(slow) as (gateway, _port):
            route = gateway.table.routes[0]
            _, connection = await asyncio.get_running_loop().create_connection(Upstream, route.host, route.port)
            gateway.pool._wanted[(route.host, route.port)] = 1
            gateway.pool._idle[(route.host, route.port)] = [connection]
            client = Sink()
            flight = gateway.arrived(_post(), client)  # type: ignore[arg-type]
            assert isinstance(flight, Flight)
            client.gone = True
            assert await gateway._serve(flight, client) is False  # type: ignore[arg-type]
            await asyncio.wait_for(closed.wait(), 10)
            assert flight.conn.closed

    asyncio.run(go())


NAMES = ["Host", "content-length", "Connection", "Keep-Alive", "TE", "Trailer", "Upgrade", "Proxy-Authorization",
         "Authorization", "AUTHORIZATION", "Content-Type", "X-Trace", "Te-Not", "Accept", "Transfer-Encoding-X"]


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(NAMES), st.text(st.characters(min_codepoint=0x20, max_codepoint=0xff),
                                                          max_size=12)), max_size=10), st.booleans())
def test_the_headers_forwarded_from_a_head_as_read_are_those_its_pairs_would_give(
        fields: list[tuple[str, str]], drop_authorization: bool) -> None:
    """An engine's head is built from the client's header lines as read, with one regex dropping the hop-by-hop ones
    (and Authorization where a token or a gateway key replaces it): the same headers, in the same order, as the
    pair-by-pair filter (http1.forwarded) keeps, whatever their case and spacing."""
    fields = [(name, value) for name, value in fields if name.lower() not in ("content-length", "transfer-encoding")]
    head = b"POST / HTTP/1.1\r\n" + b"".join(f"{n}:{v}\r\n".encode("latin-1") for n, v in fields)
    request, _, _ = http1.parse_request_head(head, LIMIT)
    expected = [(k, v) for k, v in http1.forwarded(request.headers)
                if not (drop_authorization and k.lower() == "authorization")]
    kept = http1.end_to_end(request.block, request.headers, drop_authorization)
    got = [(k, v.strip(" \t")) for k, v in (line.split(":", 1) for line in kept.split("\r\n")[:-1])]
    assert got == expected
    named = {t.strip().lower() for k, v in fields if k.lower() == "connection" for t in v.split(",")}
    assert (request.block is None) == (not named <= http1.PLAIN_CONNECTION)  # others named: dropped pair by pair


def test_an_answer_head_keeps_the_engines_end_to_end_headers_and_frames_it_for_the_client() -> None:
    response = http1.parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nServer: llama\r\n"
                                         b"keep-alive: timeout=5\r\nTransfer-Encoding: chunked\r\nX-Request-Id: 7\r\n")
    assert http1.answer_head(response) == (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nServer: llama\r\n"
                                           b"X-Request-Id: 7\r\nTransfer-Encoding: chunked\r\n\r\n")
    response = http1.parse_response_head(b"HTTP/1.0 200 OK\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\n"
                                         b"Content-Length: 2\r\n")
    assert http1.answer_head(response) == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"  # what Connection named
    assert not response.keep_alive


def test_a_request_head_seen_before_is_reused_with_its_new_length_and_only_when_one_line_frames_its_body() -> None:
    """heads.py: a client's head again with another Content-Length is not parsed again; a head that adds a second
    framing line (another Content-Length in another case, a Transfer-Encoding) never matches a kept one and is refused
    by the parse as before."""
    from metralectl.gateway import heads

    heads._requests.clear()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Length: %d\r\nAuthorization: Bearer k\r\n"
    first = _requests([head % 3 + b"\r\nabc"])[0]
    assert len(heads._requests) == 1
    again = _requests([head % 5 + b"\r\nhello"])[0]
    assert (again.body, again.header("authorization")) == (b"hello", "Bearer k")  # its own length read: 5 bytes
    assert again.header("content-length") is None and first.header("content-length") is None  # the parser's alone
    assert again is not first and again.block is first.block  # reused: the same lines, a new request
    assert len(heads._requests) == 1
    for hostile in (head % 5 + b"content-length: 9\r\n\r\nhello", head % 5 + b"Transfer-Encoding: chunked\r\n\r\n",
                    head % 5 + b"Content-Length: 6\r\n\r\nhello", (head % 5).replace(b"5", b"+5") + b"\r\nhello"):
        with pytest.raises(BadRequest) as refused:
            _requests([hostile])
        assert refused.value.status == 400, hostile
    with pytest.raises(BadRequest) as refused:
        _requests([head % 9999999 + b"\r\n"], limit=LIMIT)
    assert refused.value.status == 413  # the cap is checked on every request, reused head or not


def test_an_answer_head_seen_before_is_the_same_response_and_its_client_head_is_made_once() -> None:
    from metralectl.gateway import heads

    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\n"
    one, two = heads.response_head(head), heads.response_head(head)
    assert one is two and one.chunked and one.keep_alive
    assert http1.answer_head(one) is http1.answer_head(two)
    assert http1.answer_head(one) == b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_the_engine_head_kept_for_a_head_seen_before_is_that_requests_own() -> None:
    """Routed.head() keeps all but the length per head and route: two requests with the same header lines and
    another method or target, another route, or another key's stripping each get their own head."""
    one = Route("a", "http://127.0.0.1:1", "127.0.0.1", 1, ("a",), ("a",))
    two = Route("b", "http://127.0.0.1:2", "127.0.0.1", 2, ("b",), ("b",), upstream=(("Authorization", "Bearer t"),))
    lines = "X-Id: 1\r\nAuthorization: Bearer mine\r\n"

    def head(target: str, route: Route, keyed: bool = False) -> bytes:
        request = Request("POST", target, "HTTP/1.1", [("X-Id", "1"), ("Authorization", "Bearer mine")], block=lines)
        return Routed(request, target, {"model": "a"}, "a", keyed).head(route, 7)

    for _ in range(2):  # the second time from what was kept
        assert head("/v1/completions", one) == (b"POST /v1/completions HTTP/1.1\r\nX-Id: 1\r\nAuthorization: Bearer "
                                                b"mine\r\nHost: 127.0.0.1:1\r\nContent-Length: 7\r\n\r\n")
        assert head("/v1/chat/completions", one).startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert head("/v1/completions", two) == (b"POST /v1/completions HTTP/1.1\r\nX-Id: 1\r\nAuthorization: Bearer t"
                                                b"\r\nHost: 127.0.0.1:2\r\nContent-Length: 7\r\n\r\n")
        assert b"mine" not in head("/v1/completions", one, keyed=True)


async def _answers(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """`count` chunked answers read one after another from a kept-alive connection (their bodies)."""
    bodies = []
    for _ in range(count):
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower(), head
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            body += (await reader.readexactly(size + 2))[:-2]
            if size == 0:
                break
        bodies.append(body)
    return bodies


def test_requests_pipelined_and_bodies_dribbled_byte_by_byte_are_each_answered_in_order() -> None:
    """Three requests on one connection (the second and third, sent while the first is served, wait in its buffer),
    then a chunked body sent a byte at a time: each answered whole, in order, on the one kept-alive connection; the
    engine gets every body as it was sent."""
    bodies: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        bodies.append(await reader.readexactly(length))
        data = b"data: %d\n\n" % len(bodies)
        if len(bodies) == 1:  # the first answer is the slowest: the next must not be read (and answered) before it
            await asyncio.sleep(0.3)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        await writer.drain()
        writer.close()

    def post(n: int) -> bytes:
        body = json.dumps({"model": "stub", "n": n}).encode()
        return b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def go() -> list[bytes]:
        async with gateway_before(engine) as (_gateway, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post(1))
            await asyncio.sleep(0.1)  # the first is being served: the next two come in while it is
            writer.write(post(2) + post(3))
            got = await _answers(reader, 3)
            body = json.dumps({"model": "stub", "n": 4}).encode()
            message = (b"POST /v1/completions HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n"
                       + b"".join(b"1\r\n%s\r\n" % body[i:i + 1] for i in range(len(body))) + b"0\r\n\r\n")
            for i in range(len(message)):
                writer.write(message[i:i + 1])
                await writer.drain()
                await asyncio.sleep(0)
            got += await _answers(reader, 1)
            writer.close()
            return got

    got = asyncio.run(go())
    assert got == [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n", b"data: 4\n\n"]
    assert [json.loads(b)["n"] for b in bodies] == [1, 2, 3, 4]


def test_what_a_client_sends_while_its_request_is_served_is_bounded_then_read_when_the_task_asks() -> None:
    """A client that floods the connection while its request is relayed: reading pauses past PAUSE_AT (the kernel's
    buffers hold the rest) and resumes when the connection's task asks for the next request."""
    from metralectl.gateway.client import PAUSE_AT, ClientConnection

    calls: list[str] = []

    class Transport:
        def pause_reading(self) -> None:
            calls.append("pause")

        def resume_reading(self) -> None:
            calls.append("resume")

    async def go() -> None:
        handed: list[object] = []

        async def serve(conn: ClientConnection) -> None:
            handed.append(await conn.next())
            while len(conn.parser.buffer) <= PAUSE_AT:
                await asyncio.sleep(0.001)
            handed.append(await conn.next())

        conn = ClientConnection(serve, lambda request, _client: request, 1 << 20)
        conn.connection_made(Transport())  # type: ignore[arg-type]
        conn.data_received(_post_bytes())
        await asyncio.sleep(0.01)
        big = b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (PAUSE_AT + 1)
        conn.data_received(big + b"x" * (PAUSE_AT + 1))  # the next request, sent while the first is served
        assert calls == ["pause"] and len(handed) == 1
        assert conn.task is not None
        await asyncio.wait_for(conn.task, 5)
        assert calls == ["pause", "resume"] and len(handed) == 2
        assert isinstance(handed[1], Request) and handed[1].body == b"x" * (PAUSE_AT + 1)

    asyncio.run(go())


def _post_bytes() -> bytes:
    body = json.dumps({"model": "stub"}).encode()
    return b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _loads(data: bytes) -> object:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                            max_leaves=12)


@settings(max_examples=300)
@given(st.dictionaries(st.text(), _json_values, max_size=5), st.sampled_from(["", " ", "\n", "\t\r\n", "\x0b", "\u2028"]),
       st.sampled_from(["", " ", "\n", "x", "{}", "\x0c", "\u00a0"]), st.sampled_from(["utf-8", "utf-16", "utf-8-sig"]),
       st.integers(0, 40))
def test_the_body_json_the_gateway_reads_is_what_json_loads_reads(value: dict[str, Any], before: str, after: str,
                                                                   encoding: str, cut: int) -> None:
    """dispatch._json calls json's C scanner itself for a UTF-8 body starting with `{`: whatever the body (space
    before or after, extra data, another encoding, a body cut short), it reads what json.loads reads."""
    from metralectl.gateway.dispatch import _json
    text = before + json.dumps(value, ensure_ascii=cut % 2 == 0) + after
    data = text.encode(encoding, "surrogatepass")
    for body in (data, data[:len(data) - cut]):
        assert _json(body) == _loads(body)
    assert _json(b"{" * 100_000) is None  # nested past Python's stack: no RecursionError out of it
