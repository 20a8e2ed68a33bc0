"""The gateway's framing: where a chunked answer ends, over pieces cut anywhere (the relay passes the engine's bytes
on as they arrive and must know the last chunk when it sees it, never earlier and never later)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from metralectl.gateway.http1 import BadRequest, ChunkEnd, forwarded, parse_response_head


def _chunked(bodies: list[bytes], trailers: bytes = b"") -> bytes:
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(b), b) for b in bodies if b) + b"0\r\n" + trailers + b"\r\n"


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=6), st.sampled_from([b"", b"X-Trailer: 1\r\n"]),
       st.lists(st.integers(min_value=1, max_value=2000), max_size=10))
def test_the_end_of_a_chunked_body_is_found_however_it_is_cut(bodies: list[bytes], trailers: bytes,
                                                               cuts: list[int]) -> None:
    message = _chunked(bodies, trailers)
    points = sorted({c % len(message) for c in cuts} - {0})
    pieces = [message[a:b] for a, b in zip([0, *points], [*points, len(message)])]
    end, seen = ChunkEnd(), 0
    for index, piece in enumerate(pieces):
        found = end.feed(piece)
        if found is not None:
            assert index == len(pieces) - 1 and seen + found == len(message)
            return
        seen += len(piece)
    raise AssertionError("the end was never found")


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=6), st.sampled_from([b"", b"X-Trailer: 1\r\n"]),
       st.sampled_from([b"", b";ext=1", b" ;a=b"]), st.sampled_from([b"", b"XY", b"\r", b"\n\r\n", b"\r\n\r\n"]))
def test_a_body_sent_one_whole_chunk_per_piece_ends_where_its_last_chunk_does(bodies: list[bytes], trailers: bytes,
                                                                               extension: bytes, tail: bytes) -> None:
    """What a streaming engine sends most, one whole chunk per read, takes feed()'s shortcut: it finds the same end
    as the line-by-line reading, and a piece that only looks whole (data not ended by CRLF, more after it) is read
    line by line, as before."""
    pieces = [b"%x%s\r\n%s\r\n" % (len(b), extension, b) for b in bodies] + [b"0\r\n" + trailers + b"\r\n"]
    end = ChunkEnd()
    for piece in pieces[:-1]:
        assert end.feed(piece) is None
    assert end.feed(pieces[-1]) == len(pieces[-1])
    if bodies:  # a piece whose data is not followed by exactly its CRLF
        torn = b"%x\r\n%s%s" % (len(bodies[0]), bodies[0], tail)
        if tail != b"\r\n\r\n":
            with pytest.raises(ConnectionResetError):
                cut = ChunkEnd()
                cut.feed(torn)
                cut.feed(b"0\r\n\r\n")
        else:  # its CRLF, then the first line of the next size: a blank line is no chunk size
            with pytest.raises(ConnectionResetError):
                ChunkEnd().feed(torn)


def test_malformed_framing_is_refused() -> None:
    with pytest.raises(ConnectionResetError):
        ChunkEnd().feed(b"zz\r\ndata\r\n")
    with pytest.raises(ConnectionResetError):
        ChunkEnd().feed(b"1" * 5000)


@pytest.mark.parametrize("size", [b"-6", b"-1", b"0x10", b"1_0", b"+5", b"\xd9\xa3"])
def test_a_chunk_size_that_is_not_plain_hexadecimal_is_refused_not_looped_on(size: bytes) -> None:
    """int(x, 16) takes '-6', '0x10' and '1_0': a negative size walked the parser back over its own line, and an
    engine that sent one held the gateway's event loop (every client) forever."""
    with pytest.raises(ConnectionResetError):
        ChunkEnd().feed(size + b"\r\nabc\r\n0\r\n\r\n")


def _feed_cut(message: bytes, cut: int) -> int | None:
    end = ChunkEnd()
    first = end.feed(message[:cut])
    if first is not None:
        return first
    found = end.feed(message[cut:])
    return None if found is None else cut + found


@pytest.mark.parametrize("message", [
    b"5\nhello\r\n0\r\n\r\n",  # a size line ended by a bare LF
    b"5\r\nhelloAB0\r\n\r\n",  # data not ended by CRLF: two bytes taken on trust
    b"5\r\nhello\n\r0\r\n\r\n",
    b"5;a=\rb\r\nhello\r\n0\r\n\r\n",  # a bare CR inside an extension
    b"5;a=\x00\r\nhello\r\n0\r\n\r\n",
    b" 5\r\nhello\r\n0\r\n\r\n",  # whitespace before the size
    b"5\r\nhello\r\n0\r\nX: a\rb\r\n\r\n",  # a bare CR in a trailer
    b"5\r\nhello\r\n0\r\nno colon\r\n\r\n",
    b"5\r\nhello\r\n0\r\n\n",  # the blank line that ends it, a bare LF
])
def test_framing_a_strict_client_would_read_otherwise_is_refused_wherever_it_is_cut(message: bytes) -> None:
    """The relay passes the engine's bytes on as they are: where our end and a strict client's differ (a bare CR or
    LF in a line, a chunk's data not ended by CRLF), the client would read what follows as its next answer, one a
    hostile engine wrote. Each of these used to be followed to an end; now the answer is cut, however it is cut."""
    for cut in range(1, len(message)):
        with pytest.raises(ConnectionResetError):
            _feed_cut(message, cut)


@pytest.mark.parametrize("message", [
    b"5 ;name=\"v a\"\t\r\nhello\r\n0\r\n\r\n",
    b"5;a;b=c\r\nhello\r\n00\r\nX-Trailer: 1\r\nY:\r\n\r\n",
    b"A\r\n0123456789\r\n0;last\r\n\r\n",
])
def test_well_formed_extensions_and_trailers_still_end_where_they_end(message: bytes) -> None:
    for cut in range(1, len(message)):
        assert _feed_cut(message, cut) == len(message), cut


def test_hop_by_hop_headers_and_those_connection_names_are_dropped() -> None:
    headers = [("Connection", "keep-alive, X-Private"), ("X-Private", "1"), ("Keep-Alive", "timeout=5"),
               ("Transfer-Encoding", "chunked"), ("Proxy-Authorization", "x"), ("Host", "a"), ("Content-Length", "3"),
               ("Content-Type", "application/json"), ("Authorization", "Bearer k")]
    assert forwarded(headers) == [("Content-Type", "application/json"), ("Authorization", "Bearer k")]


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 \xb200 OK",  # '²' passes str.isdigit() and fails int(): an exception in the engine's read callback
    b"HTTP/1.1 20 OK", b"HTTP/1.1 2000 OK", b"HTTP/2 200 OK", b"HTTP/1.1 200 OK\nX-Injected: 1",
    b"HTTP/1.1 200 O\x00K", b"HTTP/1.1 200 OK\rX: 1",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\xb2", b"HTTP/1.1 200 OK\r\nContent-Length: -1",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6",  # which one frames the body? (RFC 9112 6.3)
    b"HTTP/1.1 200 OK\r\nX-Bad Name: 1",
])
def test_an_engine_head_that_is_malformed_or_could_be_read_two_ways_is_a_502_not_an_exception(head: bytes) -> None:
    """The status line's reason is written into the client's head: a bare LF there would add a header of the engine's
    choosing. Each of these is refused as the engine's fault (502), never raised as anything else."""
    with pytest.raises(BadRequest) as refused:
        parse_response_head(head + b"\r\n")
    assert refused.value.status == 502


def test_a_well_formed_engine_head_is_read_as_it_came() -> None:
    response = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\nX-A: \xff\r\n")
    assert (response.status, response.reason, response.length, response.keep_alive) == (200, "OK", 5, True)
    assert parse_response_head(b"HTTP/1.0 204\r\n").status == 204 and parse_response_head(b"HTTP/1.1 404 \r\n").reason == ""
