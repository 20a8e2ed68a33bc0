"""Per-request results and their aggregation over a measured window (pure).

When a streamed request counts as complete: HTTP 200, a chunk carrying `finish_reason`, no error event,
and at least one output token. How the body ended does not matter once the finish chunk arrived: some
servers end with `data: [DONE]`, some just end the chunked body, some close the connection (`done`
records whether the marker came). A stream cut before any `finish_reason` is `truncated`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from metralectl.bench.sse import (END_CANCELLED, END_CONNECT, END_OVERSIZE, END_TIMEOUT, NS_PER_MS, RawResponse,
                                  TokenEvent, count_tokens, parse_stream, token_times)
from metralectl.bench.stats import percentile, summarize
from metralectl.bench.tokcount import Counter

# error kinds (RequestResult.error_kind): short, stable names a script can count on
KIND_HTTP = "http"  # the server answered with a status other than 200 (the kind is "http-<status>")
KIND_TRUNCATED = "truncated"
KIND_SERVER_ERROR = "server-error"
KIND_TIMEOUT = "timeout"
KIND_CONNECT = "connect"
KIND_EMPTY = "empty"
KIND_NO_TEXT = "no-text"  # the server counted tokens it generated, but every delta it streamed was empty
KIND_DRAIN = "cancelled-at-drain"
KIND_INTERRUPTED = "interrupted"
KIND_CANCELLED = "cancelled"
KIND_OVERSIZE = "oversize"  # an SSE event or the body went past its limit (sse.EVENT_LIMIT, BODY_LIMIT): cut
# The oldest and newest bytes of a read arriving this close together came in together (one write of the
# server's, or segments of it).
SAME_ARRIVAL_NS = 50_000
# A read this soon after its newest bytes arrived was not late.
PROMPT_READ_NS = 250_000


@dataclass
class RequestResult:
    index: int
    worker: int
    phase: str  # "warmup" | "measure" (sent inside the measured window) | "drain" (unmeasured filler)
    t_sched: int | None  # open loop: when it was due (perf_counter_ns)
    t_send: int
    ok: bool
    status: int | None
    error: str | None
    error_kind: str | None = None
    end: str | None = None  # how the body ended (sse.END_*)
    response_id: str | None = None
    model: str | None = None  # the model the response's chunks name
    prompt_tokens: int | None = None  # from usage
    expected_prompt_tokens: int | None = None
    asked_tokens: int | None = None  # max_tokens of the request
    output_tokens: int = 0
    reasoning_tokens: int = 0
    count_method: str = "events"
    ttft_ms: float | None = None
    ttft_content_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None  # (last - first token) / tokens after the first event == mean ITL
    decode_tok_s: float | None = None  # 1000 / tpot_ms
    finish_reason: str | None = None
    done: bool = False  # the stream carried `data: [DONE]`
    events: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    content: str | None = None
    tag: str | None = None  # suite-specific label (e.g. "cold"/"warm", a rung)
    # client accuracy: token events whose stamp a late read shared with a later event, and the estimated
    # lateness (ms) of each such stamp (0 for every other event); None without kernel stamps
    late_stamps: int = 0
    stamp_err_ms: list[float] | None = None
    ttft_err_ms: float | None = None
    # sent again on a fresh connection after its kept-alive connection ended before any response byte
    # (RawResponse.retried): every time above is from the second send; retry_ms is from the first send
    # to the second (noticing the closed connection and connecting anew), retry_reason how the first ended
    retried: bool = False
    retry_ms: float | None = None
    retry_reason: str | None = None
    token_ns: list[int] = field(default_factory=list, repr=False)  # absolute token arrival times
    first_n: int = 0

    @property
    def itl_ms(self) -> list[float]:
        t = self.token_ns[self.first_n - 1:] if self.first_n else []
        return [(b - a) / NS_PER_MS for a, b in zip(t, t[1:])]

    @property
    def short(self) -> bool:
        """Ended before the asked length (EOS, a stop string, a server-side cap)."""
        return self.ok and self.asked_tokens is not None and self.output_tokens < self.asked_tokens

    def to_record(self, t0: int) -> dict[str, Any]:
        """The JSONL line: times relative to the run's t0 in µs, token times relative to t_send in µs."""
        out = {k: v for k, v in asdict(self).items() if k not in ("token_ns", "t_send", "t_sched", "stamp_err_ms")}
        out["t_send_us"] = (self.t_send - t0) // 1000
        out["t_sched_us"] = None if self.t_sched is None else (self.t_sched - t0) // 1000
        out["token_us"] = [(t - self.t_send) // 1000 for t in self.token_ns]
        return out


def analyse(raw: RawResponse, *, index: int, worker: int, phase: str, t_sched: int | None = None,
            expected_prompt_tokens: int | None = None, keep_content: bool = False, tag: str | None = None,
            asked_tokens: int | None = None, counter: Counter | None = None) -> RequestResult:
    res = RequestResult(index, worker, phase, t_sched, raw.t_send, False, raw.status, raw.error, tag=tag,
                        expected_prompt_tokens=expected_prompt_tokens, asked_tokens=asked_tokens, end=raw.end)
    if raw.retried:
        res.retried, res.retry_reason = True, raw.retry_reason
        res.retry_ms = None if raw.first_send is None else round((raw.t_send - raw.first_send) / NS_PER_MS, 3)
    if raw.status is not None and raw.status != 200:
        body = b"".join(p for _, p in raw.pieces)[:600].decode(errors="replace")
        res.error = f"HTTP {raw.status}: {_error_message(body)}"
        res.error_kind = f"{KIND_HTTP}-{raw.status}"
        return res
    if raw.status is None:  # nothing came back: the transport says why
        res.error = raw.error or "no response"
        res.error_kind = _transport_kind(raw)
        return res
    parsed = parse_stream(raw.pieces, keep_content=keep_content, keep_generated=counter is not None)
    res.response_id, res.finish_reason, res.done = parsed.response_id, parsed.finish_reason, parsed.done
    res.model = parsed.model
    res.tool_calls, res.events = parsed.tool_calls, len(parsed.events)
    res.content = parsed.content if keep_content else None
    counted = None
    if counter is not None and parsed.generated and not isinstance((parsed.usage or {}).get("completion_tokens"), int):
        counted = counter(parsed.generated)
    res.count_method = count_tokens(parsed.events, parsed.usage, counted)
    times, res.first_n = token_times(parsed.events)
    res.token_ns = times
    res.output_tokens = len(times)
    res.reasoning_tokens = sum(e.n for e in parsed.events if e.kind == "r")
    if parsed.usage:
        pt = parsed.usage.get("prompt_tokens")
        res.prompt_tokens = pt if isinstance(pt, int) else None
    if times:
        res.ttft_ms = (times[0] - raw.t_send) / NS_PER_MS
        res.e2e_ms = (times[-1] - raw.t_send) / NS_PER_MS
        first_content = next((e.t for e in parsed.events if e.kind == "c" and e.n > 0), None)
        if first_content is not None:
            res.ttft_content_ms = (first_content - raw.t_send) / NS_PER_MS
        decode_tokens = len(times) - res.first_n
        if decode_tokens > 0 and times[-1] > times[0]:
            res.tpot_ms = (times[-1] - times[0]) / decode_tokens / NS_PER_MS
            res.decode_tok_s = 1000.0 / res.tpot_ms
    if raw.reads:
        errs = late_stamp_errors(parsed.events, {t: (oldest, late) for t, oldest, late in raw.reads}, raw.t_send,
                                 raw.t_headers)
        res.late_stamps = sum(1 for e in errs if e > 0)
        res.stamp_err_ms = [round(e / NS_PER_MS, 4) for e in errs if e > 0]
        res.ttft_err_ms = errs[0] / NS_PER_MS if errs else None
    res.error, res.error_kind = _judge(raw, parsed.error, parsed.finish_reason, res.output_tokens)
    reported = (parsed.usage or {}).get("completion_tokens")
    if res.error_kind == KIND_EMPTY and isinstance(reported, int) and reported > 0:
        # Tokens were generated (the server's own count says so), none reached the client as text: a
        # tokenizer whose tokens decode to nothing. The count is the server's; the finding is "no text".
        res.output_tokens = reported
        res.error = (f"no text: the server reports {reported} completion tokens but every delta it streamed was "
                     "empty (do the model's tokens decode to text?)")
        res.error_kind = KIND_NO_TEXT
    res.ok = res.error is None
    return res


def _judge(raw: RawResponse, stream_error: str | None, finish: str | None, tokens: int) -> tuple[str | None, str | None]:
    """(error, kind) of a 200 response from its events and how its body ended; (None, None) when complete."""
    if raw.end == END_OVERSIZE:  # cut by the client: what the events say after the cut is not known
        return raw.error or raw.end, KIND_OVERSIZE
    if stream_error is not None:
        return f"server error: {stream_error[:300]}", KIND_SERVER_ERROR
    if raw.end in (END_TIMEOUT, END_CANCELLED, END_CONNECT):
        return raw.error or raw.end, _transport_kind(raw)
    if finish is None:
        how = raw.error or ("the server closed the connection" if raw.end else "the body ended")
        return f"truncated: the stream ended before any finish_reason ({how})", KIND_TRUNCATED
    if tokens == 0:
        return f"empty: finish_reason {finish!r} with no output tokens", KIND_EMPTY
    return None, None


def _transport_kind(raw: RawResponse) -> str:
    error = raw.error or ""
    if error.startswith("interrupted"):
        return KIND_INTERRUPTED
    if error.startswith("cancelled at drain"):
        return KIND_DRAIN
    if raw.end == END_CANCELLED:
        return KIND_CANCELLED
    if raw.end == END_TIMEOUT:
        return KIND_TIMEOUT
    if raw.end == END_CONNECT:
        return KIND_CONNECT
    return KIND_TRUNCATED


def late_stamp_errors(events: list[TokenEvent], reads: dict[int, tuple[int, int]], t_send: int,
                      t_headers: int | None = None) -> list[float]:
    """Estimated stamp error (ns) of every token event, from kernel-stamped reads ({stamp: (oldest, late)}).

    A read is stamped with the arrival of its newest bytes, so when one read completes several token
    events of a stream, all share that stamp, and every one but the last may have arrived earlier: when
    the client was late to read. The transport knows how late each read came and, while the client is
    behind, when the read's oldest bytes arrived (a peek before the read; -1 when it did not peek):
    - oldest bytes well before the newest: separate arrivals. The first event came with the oldest
      bytes; the ones between are taken to be one of the stream's short gaps apart (the 10th percentile
      of its gaps between distinct stamps), never before the oldest bytes. Not so for the read that also
      held the response's headers (`t_headers`): its oldest bytes may be those, so it counts as below.
    - both together and the read prompt (within PROMPT_READ_NS): the server wrote them together.
    - both together (or not peeked) but the read late: either a burst read late, or segments the
      kernel merged while they waited (it keeps the newest stamp). When the stream shows the server
      writing bursts (a prompt read of several events), or the read was late by less than one of the
      stream's short gaps (segments a gap apart could only have merged if the client had stopped
      reading for longer), it is taken for a burst; otherwise the read's lateness stands for the first
      gap, and a short gap for each one after (never before the previous stamp).
    Checked against the truth server under CPU hogs and a packet capture of `transformers serve`."""
    out = [0.0] * len(events)
    stamps = sorted({e.t for e in events})
    gaps = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
    usual = percentile(gaps, 10) if gaps else None
    groups: list[tuple[int, int]] = []
    i = 0
    while i < len(events):
        j = i
        while j + 1 < len(events) and events[j + 1].t == events[i].t:
            j += 1
        groups.append((i, j))
        i = j + 1
    # a server seen writing several token events at once to a prompt reader writes in bursts: for it, a
    # late read of events that came together is a burst, not merged segments
    def together(t: int) -> bool:
        oldest, late = reads.get(t, (-1, 0))
        return late <= PROMPT_READ_NS and (oldest < 0 or t - oldest <= SAME_ARRIVAL_NS)

    bursty = any(j > i and together(events[i].t) for i, j in groups)
    prev = t_send
    for i, j in groups:
        t = events[i].t
        oldest, late = reads.get(t, (-1, 0))
        spread = t - oldest if oldest >= 0 and t != t_headers else 0
        if j > i and spread > SAME_ARRIVAL_NS:
            step = usual if usual is not None else spread / (j - i)
            out[i] = float(spread)
            for k in range(i + 1, j):
                out[k] = float(min((j - k) * step, spread))
        elif j > i and late > PROMPT_READ_NS and not bursty:
            span = max(t - prev, 0)
            step = usual if usual is not None else span / (j - i + 1)
            if late > step:  # late by more than a gap: merged segments are likely; less, a burst is
                for k in range(i, j):
                    out[k] = float(min((j - k) * step, span, late + (j - k - 1) * step))
        prev = t
    return out


def _error_message(body: str) -> str:
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        return (err if isinstance(err, str) else json.dumps(err))[:300]
    except ValueError:
        return body.strip()[:300]


def error_kinds(results: list[RequestResult], top: int = 5) -> list[dict[str, Any]]:
    """The failed requests' kinds, most frequent first, each with its count and one example message."""
    kinds: dict[str, dict[str, Any]] = {}
    for r in results:
        if not r.ok:
            kind = r.error_kind or KIND_TRUNCATED
            slot = kinds.setdefault(kind, {"kind": kind, "count": 0, "example": (r.error or "")[:200]})
            slot["count"] += 1
    return sorted(kinds.values(), key=lambda k: (-k["count"], k["kind"]))[:top]


def stamp_error_summary(results: list[RequestResult]) -> dict[str, Any] | None:
    """Estimated stamp error over every token event (ms): p50, p99, max; None without kernel stamps."""
    stamped = [r for r in results if r.stamp_err_ms is not None]
    if not stamped:
        return None
    total = sum(len(r.token_ns) for r in stamped)
    late = sorted(x for r in stamped for x in r.stamp_err_ms or ())
    values = [0.0] * max(total - len(late), 0) + late
    out = summarize(values)
    out["late"] = len(late)
    ttft = [r.ttft_err_ms for r in stamped if r.ttft_err_ms is not None]
    out["ttft_p99"] = percentile(ttft, 99) if ttft else None
    return out


def aggregate(results: list[RequestResult], window: tuple[int, int] | None) -> dict[str, Any]:
    """Summary of the requests sent inside the measured window; throughput counts tokens that *arrived*
    inside it (steady state, not diluted by ramp-up or drain)."""
    measured = [r for r in results if r.phase == "measure"]
    ok = [r for r in measured if r.ok]
    out: dict[str, Any] = {"requests": len(measured), "ok": len(ok), "errors": len(measured) - len(ok)}
    kinds = error_kinds(measured, top=20)
    out["error_kinds"] = {k["kind"]: k["count"] for k in kinds}
    out["error_examples"] = {k["kind"]: k["example"] for k in kinds}
    if window is not None:
        start, end = window
        seconds = (end - start) / 1e9
        in_window = sum(1 for r in results for t in r.token_ns if start <= t < end)
        out["window_s"] = round(seconds, 3)
        out["output_tok_s"] = round(in_window / seconds, 3) if seconds > 0 else None
        out["requests_per_s"] = round(sum(1 for r in ok if r.e2e_ms is not None
                                          and start <= r.t_send + r.e2e_ms * NS_PER_MS < end) / seconds, 4) if seconds > 0 else None
    out["output_tokens"] = sum(r.output_tokens for r in ok)
    out["ttft_ms"] = summarize(r.ttft_ms for r in ok if r.ttft_ms is not None)
    out["ttft_content_ms"] = summarize(r.ttft_content_ms for r in ok if r.ttft_content_ms is not None)
    out["tpot_ms"] = summarize(r.tpot_ms for r in ok if r.tpot_ms is not None)
    out["itl_ms"] = summarize(x for r in ok for x in r.itl_ms)
    out["e2e_ms"] = summarize(r.e2e_ms for r in ok if r.e2e_ms is not None)
    out["stream_tok_s"] = summarize(r.decode_tok_s for r in ok if r.decode_tok_s is not None)
    methods: dict[str, int] = {}
    for r in ok:
        methods[r.count_method] = methods.get(r.count_method, 0) + 1
    out["count_methods"] = methods
    out["done_marker_missing"] = sum(1 for r in ok if not r.done)
    out["retried"] = sum(1 for r in measured if r.retried)
    out["short_outputs"] = sum(1 for r in ok if r.short)
    models: dict[str, int] = {}
    for r in measured:
        if r.model is not None:
            models[r.model] = models.get(r.model, 0) + 1
    out["models"] = models
    checked = [r for r in ok if r.expected_prompt_tokens is not None and r.prompt_tokens is not None]
    out["prompt_tokens_mismatch"] = sum(1 for r in checked if r.prompt_tokens != r.expected_prompt_tokens)
    out["prompt_tokens_checked"] = len(checked)
    out["stamp_error_ms"] = stamp_error_summary(ok)
    return out
