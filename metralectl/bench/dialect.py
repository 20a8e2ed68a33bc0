"""Which OpenAI extensions a server accepts, so a benchmark sends only what it will take.

The benchmark would like to send vLLM-style extensions: `ignore_eos` and `min_tokens` (outputs exactly as
long as asked) and `stream_options` (`include_usage`: the token count; `continuous_usage_stats`: exact
tokens per chunk). A strict server refuses unknown fields (transformers serve: HTTP 422 "Unexpected fields
in the request: {'ignore_eos', 'min_tokens'}"), and a benchmark that sends them anyway counts nothing.

Where it comes from: the engine's data when metralectl serves the target and the data declares every
field; otherwise one real request (the probe): when a 400/422 names fields it refuses, exactly those are
dropped and the probe is sent again. A refusal that names none of them ends the run before any load.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError

if TYPE_CHECKING:
    from metralectl.bench.transport import RawResponse, Transport

# request field -> Dialect attribute (nested stream_options fields are named by their own key)
FIELDS = {"ignore_eos": "ignore_eos", "min_tokens": "min_tokens", "stream_options": "stream_usage",
          "include_usage": "stream_usage", "continuous_usage_stats": "continuous_usage", "seed": "seed"}
PROBE_PROMPT = "Say hello."
PROBE_TOKENS = 8
MAX_ROUNDS = 4


@dataclass(frozen=True)
class Dialect:
    ignore_eos: bool = True
    min_tokens: bool = True
    stream_usage: bool = True  # stream_options.include_usage
    continuous_usage: bool = True  # stream_options.continuous_usage_stats
    seed: bool = True
    source: str = "full"  # "full" | "plain" | "probe" | "engine <name>"
    refused: tuple[str, ...] = ()  # request fields the server refused (probe)
    refusal: str | None = None  # the server's own words, escaped and capped
    sends_usage: bool | None = None  # probe: the stream carried usage
    done_marker: bool | None = None  # probe: the stream ended with data: [DONE]

    def forces_length(self, wanted: bool) -> bool:
        """Whether outputs will be as long as asked (EOS ignored or masked)."""
        return wanted and (self.ignore_eos or self.min_tokens)

    def without(self, fields: list[str]) -> Dialect:
        changes: dict[str, Any] = {FIELDS[f]: False for f in fields if f in FIELDS}
        if "stream_usage" in changes:
            changes["continuous_usage"] = False  # it rides inside stream_options
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["refused"] = list(self.refused)
        return out


FULL = Dialect()
PLAIN = Dialect(False, False, False, False, True, source="plain")


def from_engine(name: str, declared: dict[str, str]) -> Dialect | None:
    """The dialect an engine's data declares ({field: accepted|refused|unknown}); None when any field is
    unknown (then a probe decides)."""
    keys = ("ignore-eos", "min-tokens", "stream-usage", "continuous-usage")
    if any(declared.get(k) not in ("accepted", "refused") for k in keys):
        return None
    ok = {k: declared[k] == "accepted" for k in keys}
    return Dialect(ok["ignore-eos"], ok["min-tokens"], ok["stream-usage"], ok["continuous-usage"] and ok["stream-usage"],
                   True, source=f"engine {name}")


def named_fields(body: str, sent: list[str]) -> list[str]:
    """The fields among `sent` that a refusal's text names (as whole words)."""
    return [f for f in sent if re.search(rf"(?<![A-Za-z0-9_]){re.escape(f)}(?![A-Za-z0-9_])", body)]


def probe_body(model: str, dialect: Dialect) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": PROBE_PROMPT}],
                            "max_tokens": PROBE_TOKENS, "stream": True, "temperature": 0.0}
    if dialect.seed:
        body["seed"] = 0
    if dialect.ignore_eos:
        body["ignore_eos"] = True
    if dialect.min_tokens:
        body["min_tokens"] = PROBE_TOKENS
    if dialect.stream_usage:
        body["stream_options"] = {"include_usage": True,
                                  **({"continuous_usage_stats": True} if dialect.continuous_usage else {})}
    return body


def _sent_fields(body: dict[str, Any]) -> list[str]:
    fields: list[str] = [f for f in ("ignore_eos", "min_tokens", "seed", "stream_options") if f in body]
    fields += [f for f in ("include_usage", "continuous_usage_stats") if f in (body.get("stream_options") or {})]
    return fields


def probe(url: str, path: str, model: str, headers: dict[str, str] | None = None, timeout_s: float = 60.0,
          transport: str = "raw") -> Dialect:
    """Find the dialect with real requests (at most MAX_ROUNDS), through the benchmark's own transport."""
    from metralectl.bench.results import analyse
    from metralectl.bench.transport import make_transport
    from metralectl.safetext import clean

    dialect = replace(FULL, source="probe")
    refused: list[str] = []
    refusal = None
    for _ in range(MAX_ROUNDS):
        body = probe_body(model, dialect)
        raw = asyncio.run(_one(make_transport(transport, url, path, 1, headers), json.dumps(body).encode(), timeout_s))
        res = analyse(raw, index=0, worker=0, phase="probe", asked_tokens=PROBE_TOKENS)
        if res.status in (400, 422):
            text = b"".join(p for _, p in raw.pieces)[:2000].decode(errors="replace")
            named = [f for f in named_fields(text, _sent_fields(body)) if f not in refused]
            if not named:
                raise MetralError(f"{url} refused the benchmark's probe request: {clean(res.error or '', 300)}",
                                  "check the URL and that it serves an OpenAI-compatible /v1/chat/completions; "
                                  "--param dialect=plain sends only standard OpenAI fields")
            refused += named
            refusal = clean(res.error or "", 300)
            dialect = dialect.without(named)
            continue
        if res.error_kind == "empty":  # the server works; this tiny request just ended at once
            res.ok = True
        if not res.ok:
            raise MetralError(f"the benchmark's probe request to {url} failed: {clean(res.error or '', 300)}",
                              "is it serving? `metralectl ps`, or check --url")
        return replace(dialect, refused=tuple(refused), refusal=refusal, sends_usage=res.count_method != "events",
                       done_marker=res.done)
    raise MetralError(f"{url} kept refusing the benchmark's request fields after {MAX_ROUNDS} probes: {refusal}",
                      "--param dialect=plain sends only standard OpenAI fields")


async def _one(transport: Transport, body: bytes, timeout_s: float) -> RawResponse:
    await transport.open(1)
    try:
        return await transport.stream(body, timeout_s)
    finally:
        await transport.close()
