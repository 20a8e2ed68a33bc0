"""From what the wire delivered to per-request timings (pure; runs after the load, never in the hot path).

Input: `RawResponse.pieces`, the response body as (arrival perf_counter_ns, bytes) pieces exactly as
the transport read them. An SSE event gets the arrival time of the read that completed it.

Token accounting, best first (recorded as `count_method`):
  continuous-usage  every token event carries cumulative usage.completion_tokens: exact per event
  usage             the final usage equals the number of token events: one token each
  usage-spread      the final usage differs: its total is split over the events by text length
  tokenizer(-spread) no usage, but a tokenizer of the model counted the generated text (same split)
  events            no usage at all: one token per event (a lower bound for multi-token chunks)
A chunk carrying n tokens is spread evenly between the previous token event and its own arrival,
so ITL stays per token; the first chunk's tokens all land at TTFT. Reasoning and tool-call deltas
are generated tokens. E2E ends at the last token event, not at a finish or usage-only chunk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from metralectl.bench.stats import largest_remainder

NS_PER_MS = 1_000_000
# What is read of a server's stream (docs/bench.md, docs/serving.md): one SSE event (from the end of the last
# one to its blank line), and one response body. Past either the request fails (END_OVERSIZE) and the
# connection is closed: a server that never ends an event cannot make the client grow without bound.
EVENT_LIMIT = 1 << 20
BODY_LIMIT = 64 << 20


# How a response's body ended (RawResponse.end). A server may end a stream by closing the connection
# rather than by HTTP framing; whether that stream is complete is decided from its events (results.analyse).
END_COMPLETE = "complete"  # the HTTP framing ended (terminal chunk, Content-Length reached, or EOF framing)
END_CLOSED = "closed"  # the server closed the connection before the framing ended, without an error
END_LOST = "lost"  # the connection failed (reset, broken pipe) or the response head was unreadable
END_TIMEOUT = "timeout"  # the per-request timeout passed
END_CANCELLED = "cancelled"  # the client stopped waiting (drain timeout, Ctrl-C)
END_CONNECT = "connect"  # no connection could be made
END_OVERSIZE = "oversize"  # an event or the body went past EVENT_LIMIT / BODY_LIMIT: cut there, the connection closed


class EventTooLarge(ValueError):
    """An SSE event went past its limit without its end (a blank line)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an SSE event went past {_mib(limit)} without its end (a blank line); the stream was cut "
                         "there")


def _mib(limit: int) -> str:
    return f"{limit / (1 << 20):g} MiB"


@dataclass
class RawResponse:
    """One streamed request as the transport saw it; nothing parsed. The load generator creates it before
    the request is sent, so a request that never finishes (cancelled at drain, Ctrl-C) is still on record."""

    t_send: int  # perf_counter_ns just before the request was written
    status: int | None = None
    t_headers: int | None = None
    pieces: list[tuple[int, bytes]] = field(default_factory=list)
    error: str | None = None
    t_done: int | None = None
    end: str | None = None  # END_*; None while the request is in flight
    # kernel-stamped reads only, per read: (its stamp: the arrival of its newest bytes, the arrival of its
    # oldest bytes or -1 when the read did not peek, ns from the stamp to the read)
    reads: list[tuple[int, int, int]] = field(default_factory=list)
    # Sent a second time, on a fresh connection: the kept-alive connection it was first sent on ended
    # before any byte of a response (the server never took the request). Everything above is then the
    # second attempt's, t_send included; first_send is when the first attempt was sent.
    retried: bool = False
    first_send: int | None = None
    retry_reason: str | None = None
    # the body so far, and the bytes since the last event's end (EVENT_LIMIT, BODY_LIMIT); the last bytes
    # seen, for a blank line split between two reads
    body_bytes: int = field(default=0, repr=False)
    open_event: int = field(default=0, repr=False)
    _tail: bytes = field(default=b"", repr=False)

    def restart(self, reason: str) -> None:
        """Forget the unanswered first attempt before it is sent again (see `retried`)."""
        self.retried, self.first_send, self.retry_reason = True, self.t_send, reason
        self.status = self.t_headers = self.error = self.t_done = self.end = None
        self.pieces, self.reads = [], []
        self.body_bytes, self.open_event, self._tail = 0, 0, b""

    def keep(self, t: int, data: bytes, event_limit: int = EVENT_LIMIT, body_limit: int = BODY_LIMIT) -> str | None:
        """Keep one piece of the body as it arrived; the reason to cut the response here (None: go on). Only
        where the last blank line is is looked for (a bounded scan of this piece), nothing is parsed."""
        self.pieces.append((t, data))
        self.body_bytes += len(data)
        end = _event_end(data)  # where the last event this piece completes ends (-1: none), no copy of it
        if end < 0 and self._tail:  # a blank line split between the last read and this one
            end = _event_end(self._tail + data[:2]) - len(self._tail)
        self.open_event = len(data) - end if end >= 0 else self.open_event + len(data)
        self._tail = (self._tail + data)[-2:] if len(data) < 2 else data[-2:]
        if self.status == 200 and self.open_event > event_limit:
            return (f"an SSE event went past {_mib(event_limit)} without its end (a blank line); the response was "
                    "cut there")
        if self.body_bytes > body_limit:
            return f"the response went past {_mib(body_limit)}; it was cut there"
        return None


@dataclass
class TokenEvent:
    t: int  # arrival, perf_counter_ns
    kind: str  # "c" content, "r" reasoning, "t" tool call
    n: int = 1  # tokens it carries (filled in by count_tokens)
    chars: int = 0
    cum: int | None = None  # cumulative completion_tokens, when the chunk carried usage


@dataclass
class Parsed:
    events: list[TokenEvent]
    usage: dict[str, Any] | None
    response_id: str | None
    finish_reason: str | None
    tool_calls: list[dict[str, Any]]
    content: str
    done: bool  # saw `data: [DONE]`
    error: str | None  # an error object in the stream, or unparseable data
    model: str | None = None  # the `model` the chunks name (the first one given)
    at_boundary: bool = True  # the body ended at an event boundary (nothing half-sent after the last event)
    generated: str | None = None  # every generated text, when asked for (keep_generated)


def _event_end(data: bytes) -> int:
    """The offset just past the last event end in `data` ("\\n\\n", or "\\r\\n\\r\\n" as "\\n\\r\\n"), -1 when none."""
    lf_lf, lf_cr_lf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
    return max(lf_lf + 2 if lf_lf >= 0 else -1, lf_cr_lf + 3 if lf_cr_lf >= 0 else -1)


class EventSplitter:
    """SSE events (their `data:` payloads, lines joined) as each one completes, fed piece by piece: the one
    splitter of the benchmark's post-processing and of `chat`'s live stream. An event that goes past `limit`
    without its end raises EventTooLarge (nothing more is kept of it)."""

    def __init__(self, limit: int = EVENT_LIMIT) -> None:
        self._buf = b""
        self.limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the events this piece completes (an event without `data:` lines yields none)."""
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                break
            block, buf = buf[:end], buf[end + 2:]
            payload = _payload(block)
            if payload is not None:
                out.append(payload)
        if len(buf) > self.limit:
            self._buf = b""
            raise EventTooLarge(self.limit)
        self._buf = buf
        return out

    def finish(self) -> tuple[bytes | None, bool]:
        """At the end of the body: the payload of a last event sent without its blank line (a server that
        closed early), and whether the body ended at an event boundary (nothing half-sent after the last)."""
        rest, self._buf = self._buf, b""
        if not rest.strip():
            return None, True
        return _payload(rest), False


def _payload(block: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def split_events(pieces: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """SSE events (their `data:` payload, lines joined) with the arrival time of the piece completing them."""
    return _split(pieces)[0]


def _split(pieces: list[tuple[int, bytes]]) -> tuple[list[tuple[int, bytes]], bool]:
    """The events, and whether the body ended at an event boundary."""
    splitter = EventSplitter()
    out: list[tuple[int, bytes]] = []
    try:
        for t, data in pieces:
            out += [(t, payload) for payload in splitter.feed(data)]
    except EventTooLarge:  # the transport cut the response there (END_OVERSIZE): the events before it count
        return out, False
    last, at_boundary = splitter.finish()
    if last is not None and pieces:
        out.append((pieces[-1][0], last))  # stamped with the last piece
    return out, at_boundary


def parse_stream(pieces: list[tuple[int, bytes]], keep_content: bool = False, keep_generated: bool = False) -> Parsed:
    """Events, usage and the rest of one stream. `keep_generated` keeps all generated text (content,
    reasoning, tool-call arguments) in `generated`, for counting tokens when the server reports none."""
    events: list[TokenEvent] = []
    usage: dict[str, Any] | None = None
    response_id = finish = error = None
    done = False
    calls: dict[int, dict[str, Any]] = {}
    text: list[str] = []
    generated: list[str] | None = [] if keep_generated else None
    model: str | None = None
    events_raw, at_boundary = _split(pieces)
    for t, data in events_raw:
        if data == b"[DONE]":
            done = True
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            error = error or f"unparseable event: {data[:80]!r}"
            continue
        if not isinstance(obj, dict):
            continue
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            error = error or (str(err.get("message", err)) if isinstance(err, dict) else str(err))
            continue
        response_id = response_id or obj.get("id")
        if model is None and isinstance(obj.get("model"), str):
            model = obj["model"]
        u = obj.get("usage")
        if isinstance(u, dict):
            usage = u
        event = _token_event(t, obj, calls, text if keep_content else None, generated)
        if event is not None:
            if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
                event.cum = u["completion_tokens"]
            events.append(event)
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason"):
                finish = choice["finish_reason"]
    return Parsed(events, usage, response_id, finish, [calls[i] for i in sorted(calls)], "".join(text), done, error,
                  model, at_boundary, "".join(generated) if generated is not None else None)


def _token_event(t: int, obj: dict[str, Any], calls: dict[int, dict[str, Any]], text: list[str] | None,
                 generated: list[str] | None = None) -> TokenEvent | None:
    choices = obj.get("choices")
    if not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        delta = {"content": choice.get("text")}  # /v1/completions chunks
    content = delta.get("content")
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    tools = delta.get("tool_calls")
    kind, chars = "", 0
    if tools:
        kind = "t"
        for tc in tools:
            if not isinstance(tc, dict):
                continue
            slot = calls.setdefault(int(tc.get("index", len(calls))), {"id": None, "name": "", "arguments": ""})
            slot["id"] = slot["id"] or tc.get("id")
            fn = tc.get("function") or {}
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""
            chars += len(fn.get("arguments") or "") + len(fn.get("name") or "")
            if generated is not None:
                generated.append((fn.get("name") or "") + (fn.get("arguments") or ""))
    if reasoning:
        kind = kind or "r"
        chars += len(reasoning)
        if generated is not None:
            generated.append(str(reasoning))
    if content:
        kind = "c"  # content wins: time to first *content* token must see it
        chars += len(content)
        if text is not None:
            text.append(content)
        if generated is not None:
            generated.append(str(content))
    return TokenEvent(t, kind, 1, max(chars, 1)) if kind else None


def count_tokens(events: list[TokenEvent], usage: dict[str, Any] | None, counted: int | None = None) -> str:
    """Set each event's `n`; return the method used (see the module docstring). `counted`: the generated
    text's tokens by a tokenizer, used only when the server reported no usage."""
    if events and all(e.cum is not None for e in events):
        prev = 0
        for e in events:
            assert e.cum is not None
            e.n, prev = max(e.cum - prev, 0), max(e.cum, prev)
        total = usage.get("completion_tokens") if usage else None
        if isinstance(total, int) and total > prev:
            events[-1].n += total - prev  # tokens reported only by the final usage (held-back text)
        return "continuous-usage"
    total = usage.get("completion_tokens") if usage else None
    method = "usage"
    if not isinstance(total, int) and counted is not None and events:
        total, method = counted, "tokenizer"
    if not isinstance(total, int):
        for e in events:
            e.n = 1
        return "events"
    if total == len(events):
        for e in events:
            e.n = 1
        return method
    for e, n in zip(events, largest_remainder(total, [e.chars for e in events])):
        e.n = n
    return method + "-spread"


def token_times(events: list[TokenEvent]) -> tuple[list[int], int]:
    """Arrival time of every token (multi-token chunks spread over the gap before them), and how many
    tokens came with the first event (they share its time, so they have no ITL)."""
    times: list[int] = []
    first_n = 0
    prev: int | None = None
    for e in events:
        if e.n <= 0:
            continue
        if prev is None:
            times.extend([e.t] * e.n)
            first_n = e.n
        else:
            gap = e.t - prev
            times.extend(prev + gap * (j + 1) // e.n for j in range(e.n))
        prev = e.t
    return times, first_n
