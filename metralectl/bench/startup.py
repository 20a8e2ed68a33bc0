"""The startup suite's numbers (pure): how long from `run` to ready and to the first token of a first request,
split by phase, from the lifecycle's own events (`metralectl bench startup RECIPE`, cli/bench_startup.py).

Each repeat's timeline is the lifecycle's events as they arrived (seconds after the `run` began) plus the first
request's send and first token. The phases, in order, end to end (they add up to the time to first token):

- preflight: from `run` to the first staging step (the lock, the catalog, the recipe's refusals);
- pull: staging — the image or the engine's program, and the weights: pulled when missing, checked when present
  (from the first staging step, `image` or `program`, to the `port` step that follows staging);
- create: the port check and creating and starting the container or host process (to `ContainerStarted`);
- load: the engine loading until it answers ready (to `Ready`), with the engine's own log phases inside it
  (`engine_phases`: e.g. llama-server's loading, kv-sizing, loaded, ready, each at its arrival);
- warm-up: from ready to the first token of the first request (the first request is the warm-up: it pays for
  whatever the engine does lazily).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from metralectl.bench.results import RequestResult
from metralectl.bench.stats import summarize

SUITE = "startup"
PHASES = ("preflight", "pull", "create", "load", "warm-up")
STAGING_STEPS = ("image", "program")


class Timeline:
    """A repeat's events as they arrive: (seconds after the run began, the event's JSON form)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []

    def add(self, t: float, event: Mapping[str, Any]) -> None:
        self.events.append((t, dict(event)))

    def first(self, kind: str, name: str | Sequence[str] | None = None) -> float | None:
        names = (name,) if isinstance(name, str) else name
        for t, event in self.events:
            if event.get("kind") == kind and (names is None or event.get("name") in names):
                return t
        return None


def phases(timeline: Timeline, first_token_s: float | None) -> dict[str, Any]:
    """{"phases": {name: seconds}, "missing": [names], "engine_phases": {..}, "time_to_ready_s", ...}."""
    stage_at = timeline.first("Step", STAGING_STEPS)
    port_at = next((t for t, e in timeline.events if e.get("kind") == "Step" and e.get("name") == "port"
                    and (stage_at is None or t >= stage_at)), None)
    started_at = timeline.first("ContainerStarted")
    ready_at = timeline.first("Ready")
    marks = [0.0, stage_at, port_at, started_at, ready_at, first_token_s]
    out: dict[str, float | None] = {}
    for name, begin, end in zip(PHASES, marks, marks[1:]):
        out[name] = round(end - begin, 4) if begin is not None and end is not None else None
    engine: dict[str, float] = {}
    for t, event in timeline.events:
        if event.get("kind") == "Phase" and event.get("rank") in (None, 0) and event.get("phase") not in engine:
            engine[str(event.get("phase"))] = round(t, 4)
    return {"phases": out, "missing": [n for n, v in out.items() if v is None],
            "ordered": all(b is not None and a is not None and b >= a for a, b in zip(marks, marks[1:])),
            "engine_phases": engine, "time_to_ready_s": None if ready_at is None else round(ready_at, 4),
            "time_to_first_token_s": None if first_token_s is None else round(first_token_s, 4)}


def headline(repeats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """p50 (and min/max) over the repeats of the times to ready and to first token, and of each phase."""
    out: dict[str, Any] = {}
    series: dict[str, list[float]] = {"time_to_ready_s": [], "time_to_first_token_s": []}
    for r in repeats:
        for key in series:
            if isinstance(r.get(key), (int, float)):
                series[key].append(float(r[key]))
        for name, value in (r.get("phases") or {}).items():
            if isinstance(value, (int, float)):
                series.setdefault(f"{name}_s", []).append(float(value))
    for key, values in series.items():
        stats = summarize(values)
        out.update({f"{key}.p50": stats["p50"], f"{key}.min": stats["min"], f"{key}.max": stats["max"]})
    return out


def first_request(url: str, model: str, prompt: str, max_tokens: int, timeout_s: float) -> RequestResult:
    """One streamed chat request through the benchmark's own transport (its clock: perf_counter_ns), analysed as
    every benchmark request is (results.analyse): a RequestResult."""
    import asyncio
    import json

    from metralectl.bench.dialect import _one
    from metralectl.bench.results import analyse
    from metralectl.bench.transport import make_transport

    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    raw = asyncio.run(_one(make_transport("raw", url, "/v1/chat/completions", 1), json.dumps(body).encode(),
                           timeout_s))
    return analyse(raw, index=0, worker=0, phase="measure", asked_tokens=max_tokens)
