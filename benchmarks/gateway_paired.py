"""The paired, concurrent design of benchmarks/gateway_overhead.py (its default, `--design paired`): the engine's
noise falls on every path alike, because every path is measured at the same moments.

One pool of `c` client workers takes jobs from one sequence: job k sends prompt k // P over path k % P (P paths:
direct, gateway, and LiteLLM's proxy when it runs), the order within each prompt's group rotated so no path always
goes first. So at any moment about c/P requests of each path are in flight, each prompt goes once over every path
within a few milliseconds, with the same seed, temperature 0 and a fixed output length (`ignore_eos`). Prompts:
PROMPTS seeded random texts cut to `isl` - 16 tokens by the engine's own /tokenize and /detokenize (its chat
template adds the rest), each group's prefixed with its own seed, so no two groups share a prefix the engine could
serve from its cache (and `cache_prompt` is off where llama-server reads it). Connections (`ns.connections`), the
same way on every path: `fresh` (the default), a connection per request (`Connection: close`); `keep-alive`, what
`metralectl bench` and the OpenAI SDKs do: metralectl's own bench transport (metralectl/bench/transport.py: HTTP/1.1
kept alive, an idle connection checked before reuse, a request its server closed the connection under sent once more
on a fresh one; reads stamped by the kernel), one per path and phase with a connection per worker. There each request
says whether it went out on a connection opened for it (`fresh`): llama-server closes its streamed connections
after their answer (every one, in this design), where a gateway keeps its client's, so the summary also gives the added TTFT over the
groups whose every request went on a kept connection (`kept_only`): the gateway against the engine, both kept alive.
A request's TTFT runs from just before its connect (or its taking of a kept connection) to the first SSE event with
output text; its output rate is its content events over its time. Only groups started after the warm-up and
answered over every path are counted.

Per concurrency (rounds pooled), against direct: the added TTFT p50 and p99 (difference of the percentiles), the
median of the paired differences, the ratio of output rates (sum of tokens over sum of request time), each with a
95 % bootstrap interval over the groups; and the gateway's own time from inside it (METRALECTL_GATEWAY_TIMING,
metralectl/gateway/timing.py) over the same window: a figure the engine's noise does not reach.
The median of the paired differences is also given order-balanced (order_balanced(): each group keeps which path
went first, and the two orders' medians are averaged), where going second costs something at the engine.
A target is "held" when the interval's bound is within it, "missed" when the interval lies beyond it, else "open".
Each is one-sided: the added TTFT must not exceed its target, the output rate must not fall more than its share
below direct's; a gateway faster than direct holds both.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import random
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

BOOT = 1000
REQUEST_TIMEOUT_S = 60
PROMPTS = 64


def prompt(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice('bcdfghklmnprstvz')}{rng.choice('aeiou')}{rng.randrange(100)}" for _ in range(words))


def sized_prompts(engine: str, isl: int) -> list[str]:
    """PROMPTS texts of isl - 16 tokens each, cut by the engine's tokenizer (llama-server's /tokenize)."""
    import urllib.request

    def post(path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(engine + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())

    out = []
    try:
        for i in range(PROMPTS):
            tokens = post("/tokenize", {"content": prompt(i, isl)})["tokens"][:max(8, isl - 16)]
            out.append(post("/detokenize", {"tokens": tokens})["content"])
    except (OSError, ValueError, KeyError) as e:  # an engine that cannot size a prompt serves no measured request
        raise SystemExit(f"NOT MEASURED: the engine at {engine} did not size the prompts "
                         f"(/tokenize, /detokenize): {type(e).__name__}: {e}") from None
    return out


async def one(url: str, body: bytes) -> dict[str, Any]:
    """One streamed chat request; its TTFT, time, content events. Any fault is an `error` (never raised)."""
    parts = urlsplit(url)
    began = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port, limit=1 << 20)
    except OSError as e:
        return {"error": f"connect: {e}"}
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer none\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                     % (parts.netloc.encode(), len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
            rest = await asyncio.wait_for(reader.read(2000), 5)
            return {"error": (head.split(b"\r\n", 1)[0] + b" " + rest[:300]).decode("latin-1")}
        chunked = b"transfer-encoding: chunked" in head.lower()
        buf, first, tokens, done = b"", None, 0, False
        while not done:
            if chunked:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = (await reader.readexactly(size + 2))[:-2] if size else b""
            else:
                data = await reader.read(1 << 16)
            if not data:
                break
            buf += data.replace(b"\r\n", b"\n")
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        continue
                    choices = json.loads(payload).get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        tokens += 1
                        if first is None:
                            first = time.perf_counter()
        end = time.perf_counter()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, asyncio.TimeoutError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        writer.close()
    if first is None or not done:
        return {"error": f"no output text (done={done})"}
    return {"ttft_ms": (first - began) * 1e3, "e2e_ms": (end - began) * 1e3, "tokens": tokens}


OPENED: contextvars.ContextVar[list[int]] = contextvars.ContextVar("opened")  # connections opened for this request


def kept_alive(url: str, pool: int) -> Any:
    """metralectl bench's own transport to `url`, which notes each connection it opens in OPENED."""
    from metralectl.bench.transport import RawTransport

    class Noted(RawTransport):
        async def _connect(self) -> Any:
            conn = await super()._connect()
            OPENED.get([]).append(1)
            return conn

    return Noted(url, "/v1/chat/completions", pool, {"Authorization": "Bearer none"})


async def one_kept(transport: Any, body: bytes) -> dict[str, Any]:
    """one() over a kept-alive transport (kept_alive()): its TTFT from before the request takes a connection."""
    from metralectl.bench.sse import parse_stream

    opened: list[int] = []
    OPENED.set(opened)  # this worker's context: stream() connects in it
    began = time.perf_counter_ns()
    raw = await transport.stream(body, REQUEST_TIMEOUT_S)
    if raw.status is None or raw.error:
        return {"error": raw.error or f"no answer (the connection {raw.end or 'ended'})"}
    if raw.status != 200:
        return {"error": f"HTTP {raw.status} " + (raw.pieces[0][1][:300].decode("latin-1") if raw.pieces else "")}
    parsed = parse_stream(raw.pieces)
    content = [event.t for event in parsed.events if event.kind == "c"]
    if not content or not parsed.done:
        return {"error": f"no output text (done={parsed.done})"}
    return {"ttft_ms": (content[0] - began) / 1e6, "e2e_ms": ((raw.t_done or content[-1]) - began) / 1e6,
            "tokens": len(content), "fresh": bool(opened), "retried": raw.retried}


def modes(ns: Any) -> list[str]:
    """The connection modes asked for (`ns.connections`: fresh, keep-alive, or both, comma-separated)."""
    return [m.strip() for m in str(getattr(ns, "connections", "fresh")).split(",") if m.strip()]


async def phase(urls: dict[str, str], c: int, ns: Any, seed_base: int, connections: str = "") -> dict[str, Any]:
    """One round at concurrency c: every path under the same load at the same time, over `connections` (fresh or
    keep-alive; default: the first of ns.connections)."""
    paths = list(urls)
    connections = connections or modes(ns)[0]
    kept = {p: kept_alive(url, c) for p, url in urls.items()} if connections == "keep-alive" else None
    if kept is not None:
        await asyncio.gather(*(transport.open(c) for transport in kept.values()))
    groups: dict[int, dict[str, Any]] = {}
    counter = 0
    started = time.monotonic()
    measure_from, stop_at = started + ns.warmup, started + ns.warmup + ns.duration

    async def worker() -> None:
        nonlocal counter
        while time.monotonic() < stop_at:
            k, counter = counter, counter + 1
            g = k // len(paths)
            path = paths[(k + g) % len(paths)]
            seed = seed_base + g
            text = f"{seed}: {ns.prompts[g % len(ns.prompts)]}"
            body = json.dumps({"model": ns.alias, "messages": [{"role": "user", "content": text}],
                               "max_tokens": ns.osl, "stream": True, "temperature": 0, "seed": seed,
                               "ignore_eos": True, "cache_prompt": False}).encode()
            at = time.monotonic()
            try:  # a hung request must not hang the run (the device call has a hard limit)
                got = await asyncio.wait_for(one(urls[path], body) if kept is None else one_kept(kept[path], body),
                                             REQUEST_TIMEOUT_S + (0 if kept is None else 5))
            except asyncio.TimeoutError:  # (the kept transport times its exchange itself: this is a backstop)
                got = {"error": f"no answer in {REQUEST_TIMEOUT_S} s"}
            group = groups.setdefault(g, {"at": at, "seed": seed,
                                          "order": [paths[(j + g) % len(paths)] for j in range(len(paths))]})
            group["at"] = min(group["at"], at)
            group[path] = got

    window = time.monotonic_ns()
    try:
        await asyncio.gather(*(worker() for _ in range(c)))
    finally:
        for transport in (kept or {}).values():
            await transport.close()
    counted = [g for g in groups.values() if g["at"] >= measure_from and all(p in g for p in paths)]
    errors = [f"{p}: {g[p]['error']}" for g in groups.values() for p in paths if "error" in g.get(p, {})]
    ok = [g for g in counted if not any("error" in g[p] for p in paths)]
    return {"window_ns": (window + int(ns.warmup * 1e9), time.monotonic_ns()), "groups": ok,
            "errors": errors, "incomplete": len(counted) - len(ok), "connections": connections}


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    i = q * (len(s) - 1)
    lo = int(i)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (i - lo)


def _ci(columns: dict[str, Any], stat: Any, seed: int) -> tuple[float, float, float]:
    """stat(columns) (numpy arrays, one value per group, the last axis) and its 95 % bootstrap interval: the
    groups resampled with replacement BOOT times, all at once (numpy; a pure-Python loop took minutes)."""
    import numpy as np

    n = len(next(iter(columns.values())))
    idx = np.random.default_rng(seed).integers(0, n, (BOOT, n))
    boot = stat({k: v[idx] for k, v in columns.items()})
    return float(stat(columns)), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def verdict(ci: tuple[float, float, float], low: float, high: float) -> str:
    if low <= ci[1] and ci[2] <= high:
        return "held"
    if ci[2] < low or ci[1] > high:
        return "missed"
    return "open"


def summarize(c: int, via: str, groups: list[dict[str, Any]], own: list[dict[str, Any]],
              targets: dict[str, float]) -> dict[str, Any]:
    import numpy as np

    def ttft(p: str, gs: list[dict[str, Any]]) -> list[float]:
        return [g[p]["ttft_ms"] for g in gs]

    cols = {f"{p}.{k}": np.array([g[p][k] for g in groups], dtype=float)
            for p in ("direct", via) for k in ("ttft_ms", "e2e_ms", "tokens")}
    d, v = "direct.", f"{via}."

    def added(q: float) -> Any:
        return lambda x: np.percentile(x[v + "ttft_ms"], q, axis=-1) - np.percentile(x[d + "ttft_ms"], q, axis=-1)

    p50, p99 = _ci(cols, added(50), c), _ci(cols, added(99), c + 1)
    paired = _ci(cols, lambda x: np.median(x[v + "ttft_ms"] - x[d + "ttft_ms"], axis=-1), c + 2)
    balanced = order_balanced(groups, via, c + 4)
    ratio = _ci(cols, lambda x: (x[v + "tokens"].sum(-1) / x[v + "e2e_ms"].sum(-1))
                / (x[d + "tokens"].sum(-1) / x[d + "e2e_ms"].sum(-1)), c + 3)
    row: dict[str, Any] = {
        "concurrency": c, "via": via, "design": "paired-concurrent", "groups": len(groups),
        "direct_ttft_p50_ms": _pct(ttft("direct", groups), .5), "via_ttft_p50_ms": _pct(ttft(via, groups), .5),
        "direct_ttft_p99_ms": _pct(ttft("direct", groups), .99), "via_ttft_p99_ms": _pct(ttft(via, groups), .99),
        "added_ttft_p50_ms": p50, "added_ttft_p99_ms": p99, "paired_median_added_ms": paired, "tok_s_ratio": ratio,
        "order_balanced_median_added_ms": balanced,
        "direct_tokens_per_request": statistics.mean(g["direct"]["tokens"] for g in groups),
        "via_tokens_per_request": statistics.mean(g[via]["tokens"] for g in groups),
        "verdicts": {"ttft_p50": verdict(p50, -1e9, targets["ttft_p50_ms"]),
                     "ttft_p99": verdict(p99, -1e9, targets["ttft_p99_ms"]),
                     # one-sided: the target is that the gateway costs no output rate, so a ratio above 1 (a kept-alive
                     # client, whose connection the gateway keeps where llama-server closes every streamed one: 1.057
                     # at c=16 on the H100) holds it; held when the interval's lower bound is within 1 - t
                     "tok_s": verdict(ratio, 1 - targets["tok_s_ratio"], float("inf"))}}
    if balanced is not None:
        row["verdicts"]["paired_p50"] = verdict(balanced, -1e9, targets["ttft_p50_ms"])
    if all("fresh" in g[p] for g in groups for p in ("direct", via)):  # kept-alive connections (one_kept)
        row["fresh_share"] = {p: sum(g[p]["fresh"] for g in groups) / len(groups) for p in ("direct", via)}
        kept = kept_only(c, via, groups, added)
        if kept is not None:
            row["kept_only"] = kept
            row["verdicts"]["kept_p50"] = verdict(kept["added_ttft_p50_ms"], -1e9, targets["ttft_p50_ms"])
    if via == "gateway" and own:
        mine = [(r["up_ns"] + r["first_ns"]) / 1e6 for r in own]
        pieces = [r["pieces_max_ns"] / 1e6 for r in own]
        row["inside"] = {"requests": len(own), "own_ttft_p50_ms": _pct(mine, .5), "own_ttft_p99_ms": _pct(mine, .99),
                         "own_ttft_max_ms": max(mine), "up_p50_ms": _pct([r["up_ns"] / 1e6 for r in own], .5),
                         "up_p99_ms": _pct([r["up_ns"] / 1e6 for r in own], .99),
                         "piece_max_p99_ms": _pct(pieces, .99),
                         "piece_mean_us": sum(r["pieces_sum_ns"] for r in own) / 1e3
                         / max(1, sum(r["pieces"] for r in own)),
                         # written again on a new connection: the kept one had been closed by the engine (timing.py)
                         "resent": sum(bool(r.get("resent")) for r in own),
                         "resent_own_ttft_p50_ms": _pct([m for m, r in zip(mine, own) if r.get("resent")], .5)
                         if any(r.get("resent") for r in own) else None}
        row["verdicts"]["inside_p50"] = "held" if row["inside"]["own_ttft_p50_ms"] <= targets["ttft_p50_ms"] else "missed"
        row["verdicts"]["inside_p99"] = "held" if row["inside"]["own_ttft_p99_ms"] <= targets["ttft_p99_ms"] else "missed"
    return row


def kept_only(c: int, via: str, groups: list[dict[str, Any]], added: Any) -> dict[str, Any] | None:
    """The added TTFT over the groups whose direct and `via` requests both went on a kept connection (None under
    20 such groups): what the gateway costs a client that keeps its connection, against the engine kept alive too."""
    import numpy as np

    both = [g for g in groups if not g["direct"]["fresh"] and not g[via]["fresh"]]
    if len(both) < 20:
        return None
    cols = {f"{p}.ttft_ms": np.array([g[p]["ttft_ms"] for g in both], dtype=float) for p in ("direct", via)}
    return {"groups": len(both), "added_ttft_p50_ms": _ci(cols, added(50), c + 5),
            "paired_median_added_ms": _ci(cols, lambda x: np.median(x[f"{via}.ttft_ms"] - x["direct.ttft_ms"], axis=-1),
                                          c + 6),
            "order_balanced_median_added_ms": order_balanced(both, via, c + 7)}


def order_balanced(groups: list[dict[str, Any]], via: str, seed: int) -> tuple[float, float, float] | None:
    """The median of the paired differences (via - direct) taken apart by each group's send order (the rotation of
    the paths it went out in), and the mean of those medians, with its 95 % bootstrap interval (groups resampled
    within each order): a cross-over design's estimate, in which what a place in the order costs at the engine
    cancels out, as every path takes every place equally often. On the H200 at c=1 the first of a group (a prompt
    the engine had not seen) waited ±2-4.5 ms longer, by the order alone (the engine's TTFT there is 10.5 or 15 ms),
    so the pooled paired median fell into the gap between the modes (+2.9 ms [-2.7, +3.7]) and said nothing about
    the gateway. (Split by which of the two went first only, as before, this held with two paths; with four the
    split put a gateway first in one order of four and second-or-later in three, so the first place's cost stayed
    in: +2.4 ms for a gateway, -2.1 for the relay in C.)
    None without each group's order (results from before it was kept) or with an order missing."""
    import numpy as np

    ordered = [g for g in groups if "order" in g]
    orders = sorted({tuple(g["order"]) for g in ordered})
    parts = [np.array([g[via]["ttft_ms"] - g["direct"]["ttft_ms"] for g in ordered if tuple(g["order"]) == order],
                      dtype=float) for order in orders]
    rotations = len(orders[0]) if orders else 0
    if not parts or len(parts) < rotations or not all(len(part) for part in parts):
        return None
    rng = np.random.default_rng(seed)
    boot = sum(np.median(part[rng.integers(0, len(part), (BOOT, len(part)))], axis=-1) for part in parts) / len(parts)
    point = sum(float(np.median(part)) for part in parts) / len(parts)
    return point, float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def run(urls: dict[str, str], concurrencies: list[int], ns: Any) -> list[dict[str, Any]]:
    """Every round at every concurrency (and, with both connection modes asked, in each: which goes first alternates
    by round, so the machine's drift falls on both alike); returns the phases (groups, errors, windows), in order."""
    import sys

    phases: list[dict[str, Any]] = []
    ns.prompts = sized_prompts(urls["direct"], ns.isl)
    give_up = ns.started + ns.budget if ns.budget else float("inf")  # from the benchmark's own start
    asked = modes(ns)
    for round_ in range(ns.rounds):
        for c in concurrencies:
            for connections in asked[round_ % len(asked):] + asked[:round_ % len(asked)]:
                if time.monotonic() + ns.warmup + ns.duration + 15 > give_up:  # what ran is kept and reported
                    print(f"out of time (--budget {ns.budget:g} s): round {round_ + 1} c={c} and later not run",
                          file=sys.stderr, flush=True)
                    return phases
                seed_base = (round_ * 1000 + c) * 100_000 + asked.index(connections) * 50_000  # no prompt twice
                got = asyncio.run(phase(urls, c, ns, seed_base, connections))
                got.update(round=round_, concurrency=c)
                phases.append(got)
                print(json.dumps({"round": round_, "concurrency": c, "connections": connections,
                                  "groups": len(got["groups"]), "errors": len(got["errors"]),
                                  "first_errors": got["errors"][:3]}), file=sys.stderr, flush=True)
    return phases


def collections(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The gateway's garbage collections among its timing records (timing.watch_collections): each stops every
    request in the gateway, also one not yet read, which its own time cannot show. None: no pause kept (a gateway
    from before it kept them, or none in the window)."""
    pauses = [r for r in records if "gc" in r]
    if not pauses:
        return None
    longest = max(pauses, key=lambda r: r["pause_ns"])
    return {"count": len(pauses), "full": sum(1 for r in pauses if r["gc"] == 2),
            "total_ms": sum(r["pause_ns"] for r in pauses) / 1e6, "longest_ms": longest["pause_ns"] / 1e6,
            "longest_generation": longest["gc"], "longest_at_ns": longest["at_ns"]}


def slowest(records: list[dict[str, Any]], share: float = 0.01) -> dict[str, Any] | None:
    """What the gateway's slowest requests (by own TTFT, the top `share`, at least 5) had in common, from its
    timing records: how many were sent from their connection's task (a loop turn after their read), the thread's
    CPU time over their up time (well below 1: the thread stood still), and how many overlapped its periodic work
    (the lifecycle poll, a scan) or a garbage collection. None: too few records, or a gateway from before these."""
    requests = [r for r in records if "up_ns" in r and "up_cpu_ns" in r]
    if len(requests) < 100:
        return None
    requests.sort(key=lambda r: r["up_ns"] + r["first_ns"])
    top = requests[-max(5, int(len(requests) * share)):]
    spans = [(r["at_ns"], r["at_ns"] + (r.get("ns") or r.get("pause_ns") or 0), r.get("window") or "gc")
             for r in records if "window" in r or "gc" in r]

    def during(r: dict[str, Any], kind: str) -> bool:
        start, end = r["at_ns"], r["at_ns"] + r["up_ns"]
        return any(k == kind and a <= end and b >= start for a, b, k in spans)

    cpu = sorted(r["up_cpu_ns"] / r["up_ns"] for r in top if r["up_cpu_ns"] >= 0 and r["up_ns"] > 0)
    return {"requests": len(top), "own_ttft_from_ms": (top[0]["up_ns"] + top[0]["first_ns"]) / 1e6,
            "up_share": statistics.median(r["up_ns"] / max(1, r["up_ns"] + r["first_ns"]) for r in top),
            "tasked": sum(bool(r.get("tasked")) for r in top),
            "cpu_over_up_p50": statistics.median(cpu) if cpu else None,
            "during": {kind: sum(during(r, kind) for r in top) for kind in ("lifecycle", "scan", "gc")},
            "windows": {kind: sum(1 for *_, k in spans if k == kind) for kind in ("lifecycle", "scan", "gc")}}


def report(phases: list[dict[str, Any]], own: list[dict[str, Any]], concurrencies: list[int], vias: list[str],
           targets: dict[str, float]) -> list[dict[str, Any]]:
    rows = []

    def fmt(ci: tuple[float, float, float], scale: str = "ms") -> str:
        return f"{ci[0]:+.3f} [{ci[1]:+.3f}, {ci[2]:+.3f}]" if scale == "ms" else f"{ci[0]:.4f} [{ci[1]:.4f}, {ci[2]:.4f}]"

    print(f"design: paired-concurrent (one client pool, jobs alternating over {', '.join(['direct', *vias])}); "
          f"added = via - direct, ms, [95 % bootstrap]; targets +{targets['ttft_p50_ms']} ms p50, "
          f"+{targets['ttft_p99_ms']} ms p99, tok/s at most {targets['tok_s_ratio']:.0%} below")
    asked = list(dict.fromkeys(p.get("connections", "fresh") for p in phases))  # in the order first run
    for c, connections in ((c, m) for c in concurrencies for m in asked or ["fresh"]):
        mine = [p for p in phases if p["concurrency"] == c and p.get("connections", "fresh") == connections]
        groups = [g for p in mine for g in p["groups"]]
        within = [r for r in own if any(p["window_ns"][0] <= r["at_ns"] <= p["window_ns"][1] for p in mine)]
        inside = [r for r in within if "up_ns" in r]  # the requests; a "gc" line is a garbage collection's pause
        pauses = collections(within)
        label = f" {connections}" if len(asked) > 1 else ""
        if not groups:
            print(f"c={c}{label}: no complete group (see the errors)")
            continue
        for via in vias:
            row = summarize(c, via, groups, inside, targets)
            row["connections"] = connections
            if via == "gateway" and pauses is not None:
                row["gateway_gc"] = pauses
            slow = slowest(within) if via == "gateway" else None
            if slow is not None:
                row["gateway_slowest"] = slow
            rows.append(row)
            line = (f"c={c:<3}{label} {via:8} n={row['groups']:<5} p50 {row['direct_ttft_p50_ms']:.2f}->"
                    f"{row['via_ttft_p50_ms']:.2f} added {fmt(row['added_ttft_p50_ms'])} | paired median "
                    f"{fmt(row['paired_median_added_ms'])} (order-balanced "
                    f"{fmt(row['order_balanced_median_added_ms']) if row['order_balanced_median_added_ms'] else '-'})"
                    f" | p99 {row['direct_ttft_p99_ms']:.2f}->"
                    f"{row['via_ttft_p99_ms']:.2f} added {fmt(row['added_ttft_p99_ms'])} | tok/s "
                    f"{fmt(row['tok_s_ratio'], 'x')} | {row['verdicts']}")
            if "kept_only" in row:
                k, share = row["kept_only"], row["fresh_share"]
                line += (f"\n      kept alive on both ({k['groups']} groups; on a fresh connection: direct "
                         f"{share['direct']:.0%}, {via} {share[via]:.0%}): added p50 {fmt(k['added_ttft_p50_ms'])} | "
                         f"paired median {fmt(k['paired_median_added_ms'])} (order-balanced "
                         f"{fmt(k['order_balanced_median_added_ms']) if k['order_balanced_median_added_ms'] else '-'})")
            if "inside" in row:
                i = row["inside"]
                line += (f"\n      inside the gateway ({i['requests']} requests): own TTFT p50 {i['own_ttft_p50_ms']:.3f}"
                         f" p99 {i['own_ttft_p99_ms']:.3f} max {i['own_ttft_max_ms']:.3f} ms; per later piece "
                         f"{i['piece_mean_us']:.1f} us mean, worst-per-request p99 {i['piece_max_p99_ms']:.3f} ms"
                         + (f"; {i['resent']} sent again on a new connection (a kept one the engine had closed), "
                            f"own TTFT p50 {i['resent_own_ttft_p50_ms']:.3f} ms" if i.get("resent") else ""))
            if "gateway_gc" in row:
                g = row["gateway_gc"]
                line += (f"\n      the gateway's garbage collections in these windows: {g['count']}, longest "
                         f"{g['longest_ms']:.2f} ms (generation {g['longest_generation']}), {g['full']} full, "
                         f"{g['total_ms']:.1f} ms in all")
            if "gateway_slowest" in row:
                w = row["gateway_slowest"]
                cpu = f"{w['cpu_over_up_p50']:.2f}" if w["cpu_over_up_p50"] is not None else "-"
                line += (f"\n      its slowest {w['requests']} (own TTFT from {w['own_ttft_from_ms']:.3f} ms): "
                         f"{w['up_share']:.0%} of it before the send (median), {w['tasked']} sent from their task, "
                         f"CPU over that time {cpu} (median); during the lifecycle poll {w['during']['lifecycle']}, "
                         f"a scan {w['during']['scan']}, a collection {w['during']['gc']} (of "
                         f"{w['windows']['lifecycle']}, {w['windows']['scan']}, {w['windows']['gc']} in the window)")
            print(line)
    return rows


def markdown(rows: list[dict[str, Any]], command: str, note: str) -> str:
    """The summary as a markdown table (results/*.md beside the JSON)."""
    def ci(x: list[float], digits: int = 2) -> str:
        return f"{x[0]:+.{digits}f} [{x[1]:+.{digits}f}, {x[2]:+.{digits}f}]"

    out = [note, "", "| c | connections (on a fresh one: direct / via) | via | groups | TTFT p50 direct → via (ms) | "
           "added p50 [95 %] | paired median added | order-balanced paired median | added p99 [95 %] | "
           "tok/s ratio [95 %] | gateway's own TTFT p50 / p99 (inside) | verdicts |",
           "|---:|---|---|---:|---|---|---|---|---|---|---|---|"]
    for r in rows:
        inside = r.get("inside")
        own = f"{inside['own_ttft_p50_ms']:.3f} / {inside['own_ttft_p99_ms']:.3f} ms" if inside else "-"
        ratio = r["tok_s_ratio"]
        share = r.get("fresh_share")
        connections = r.get("connections", "fresh") + (f" ({share['direct']:.0%} / {share[r['via']]:.0%})"
                                                        if share else "")
        out.append(f"| {r['concurrency']} | {connections} | {r['via']} | {r['groups']} | "
                   f"{r['direct_ttft_p50_ms']:.2f} → "
                   f"{r['via_ttft_p50_ms']:.2f} | {ci(r['added_ttft_p50_ms'])} | {ci(r['paired_median_added_ms'])} | "
                   f"{ci(r['order_balanced_median_added_ms']) if r.get('order_balanced_median_added_ms') else '-'} | "
                   f"{ci(r['added_ttft_p99_ms'])} | {ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] | {own} | "
                   + ", ".join(f"{k} {v}" for k, v in r["verdicts"].items()) + " |")
    kept = [r for r in rows if "kept_only" in r]
    if kept:
        out += ["", "Kept alive on both (groups whose direct and via requests both went on a kept connection):", "",
                "| c | via | groups | on a fresh connection: direct / via | added p50 [95 %] | paired median added | "
                "order-balanced paired median |", "|---:|---|---:|---|---|---|---|"]
        for r in kept:
            k, share = r["kept_only"], r["fresh_share"]
            balanced = k["order_balanced_median_added_ms"]
            out.append(f"| {r['concurrency']} | {r['via']} | {k['groups']} | {share['direct']:.0%} / "
                       f"{share[r['via']]:.0%} | {ci(k['added_ttft_p50_ms'])} | {ci(k['paired_median_added_ms'])} | "
                       f"{ci(balanced) if balanced else '-'} |")
    out += ["", "```sh", command, "```", ""]
    return "\n".join(out)
