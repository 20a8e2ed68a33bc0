"""Per-request results and their aggregation over a measured window (pure)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from metralectl.bench.sse import NS_PER_MS, RawResponse, count_tokens, parse_stream, token_times
from metralectl.bench.stats import summarize


@dataclass
class RequestResult:
    index: int
    worker: int
    phase: str  # "warmup" | "measure" (sent inside the measured window) | "cancelled"
    t_sched: int | None  # open loop: when it was due (perf_counter_ns)
    t_send: int
    ok: bool
    status: int | None
    error: str | None
    response_id: str | None = None
    prompt_tokens: int | None = None  # from usage
    expected_prompt_tokens: int | None = None
    output_tokens: int = 0
    reasoning_tokens: int = 0
    count_method: str = "events"
    ttft_ms: float | None = None
    ttft_content_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None  # (last - first token) / tokens after the first event == mean ITL
    decode_tok_s: float | None = None  # 1000 / tpot_ms
    finish_reason: str | None = None
    done: bool = False
    events: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    content: str | None = None
    tag: str | None = None  # suite-specific label (e.g. "cold"/"warm", a rung)
    token_ns: list[int] = field(default_factory=list, repr=False)  # absolute token arrival times
    first_n: int = 0

    @property
    def itl_ms(self) -> list[float]:
        t = self.token_ns[self.first_n - 1:] if self.first_n else []
        return [(b - a) / NS_PER_MS for a, b in zip(t, t[1:])]

    def to_record(self, t0: int) -> dict[str, Any]:
        """The JSONL line: times relative to the run's t0 in µs, token times relative to t_send in µs."""
        out = {k: v for k, v in asdict(self).items() if k not in ("token_ns", "t_send", "t_sched")}
        out["t_send_us"] = (self.t_send - t0) // 1000
        out["t_sched_us"] = None if self.t_sched is None else (self.t_sched - t0) // 1000
        out["token_us"] = [(t - self.t_send) // 1000 for t in self.token_ns]
        return out


def analyse(raw: RawResponse, *, index: int, worker: int, phase: str, t_sched: int | None = None,
            expected_prompt_tokens: int | None = None, keep_content: bool = False, tag: str | None = None) -> RequestResult:
    res = RequestResult(index, worker, phase, t_sched, raw.t_send, False, raw.status, raw.error, tag=tag,
                        expected_prompt_tokens=expected_prompt_tokens)
    if raw.status is not None and raw.status != 200 and raw.error is None:
        body = b"".join(p for _, p in raw.pieces)[:300].decode(errors="replace")
        res.error = f"HTTP {raw.status}: {_error_message(body)}"
    if res.error is not None and raw.status != 200:
        return res
    parsed = parse_stream(raw.pieces, keep_content=keep_content)
    res.response_id, res.finish_reason, res.done = parsed.response_id, parsed.finish_reason, parsed.done
    res.tool_calls, res.events = parsed.tool_calls, len(parsed.events)
    res.content = parsed.content if keep_content else None
    res.count_method = count_tokens(parsed.events, parsed.usage)
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
    res.error = res.error or parsed.error
    if res.error is None and not parsed.done and raw.error is None:
        res.error = "stream ended without [DONE]"
    res.ok = res.error is None and raw.status == 200 and res.output_tokens > 0
    return res


def _error_message(body: str) -> str:
    try:
        data = json.loads(body)
        err = data.get("error", data)
        return str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return body.strip()[:200]


def aggregate(results: list[RequestResult], window: tuple[int, int] | None) -> dict[str, Any]:
    """Summary of the requests sent inside the measured window; throughput counts tokens that *arrived*
    inside it (steady state, not diluted by ramp-up or drain)."""
    measured = [r for r in results if r.phase == "measure"]
    ok = [r for r in measured if r.ok]
    out: dict[str, Any] = {"requests": len(measured), "ok": len(ok), "errors": len(measured) - len(ok)}
    errors: dict[str, int] = {}
    for r in measured:
        if not r.ok:
            key = (r.error or "no tokens")[:120]
            errors[key] = errors.get(key, 0) + 1
    out["error_kinds"] = errors
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
    checked = [r for r in ok if r.expected_prompt_tokens is not None and r.prompt_tokens is not None]
    out["prompt_tokens_mismatch"] = sum(1 for r in checked if r.prompt_tokens != r.expected_prompt_tokens)
    out["prompt_tokens_checked"] = len(checked)
    return out
