"""What a run's results mean: which stages succeeded, whether the served model stayed the same, and the
run's status. A benchmark never reports success over failure:

  completed     every measured request of every stage succeeded (or the failures stay within
                --param max_error_frac, with at least one success), the model never changed
  errors        a stage had failed requests beyond the allowance, no success at all, or stopped
                sending because its requests kept failing
  invalid       the served model changed under the run (its numbers mix two models)
  client-bound  the load generator, not the server, may have set the numbers
  interrupted   Ctrl-C / SIGTERM; what was measured is kept
Every status but completed exits 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from metralectl.bench.records import effective_status  # noqa: F401  (re-exported: readers use outcome's)
from metralectl.bench.results import RequestResult
from metralectl.bench.target import Control, Target, managed_container
from metralectl.safetext import clean

FAILED_STATUSES = ("errors", "invalid", "client-bound", "interrupted", "failed")


def stage_ok(stage: Mapping[str, Any], max_error_frac: float) -> bool:
    agg = stage.get("summary") or {}
    requests, ok = agg.get("requests") or 0, agg.get("ok") or 0
    if requests == 0 or ok == 0 or stage.get("aborted") or stage.get("invalid"):
        return False
    return (requests - ok) <= max_error_frac * requests


def top_kinds(agg: dict[str, Any], top: int = 3) -> list[dict[str, Any]]:
    kinds = agg.get("error_kinds") or {}
    examples = agg.get("error_examples") or {}
    ordered = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [{"kind": k, "count": n, "example": examples.get(k, "")} for k, n in ordered]


def error_summary(stages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every stage's failed requests by kind, most frequent first, with one example and the stages."""
    merged: dict[str, dict[str, Any]] = {}
    for stage in stages:
        agg = stage.get("summary") or {}
        for kind, count in (agg.get("error_kinds") or {}).items():
            slot = merged.setdefault(kind, {"kind": kind, "count": 0, "stages": [],
                                            "example": (agg.get("error_examples") or {}).get(kind, "")})
            slot["count"] += count
            slot["stages"].append(stage.get("name"))
    return sorted(merged.values(), key=lambda k: (-k["count"], k["kind"]))


def describe_kinds(kinds: list[dict[str, Any]], top: int = 3) -> str:
    return ", ".join(f"{k['kind']} ×{k['count']}" for k in kinds[:top])


def judge(record: Mapping[str, Any], params: dict[str, Any], *, interrupted: bool) -> tuple[str, str | None]:
    """(status, error) of a finished run, from its stage records."""
    stages = record.get("stages") or []
    if interrupted:
        return "interrupted", record.get("error") or "interrupted"
    invalid = next((s["invalid"] for s in stages if s.get("invalid")), None)
    if invalid:
        return "invalid", f"invalid: {invalid}"
    if not stages:
        return "errors", "no stage ran"
    requests = sum((s.get("summary") or {}).get("requests") or 0 for s in stages)
    ok = sum((s.get("summary") or {}).get("ok") or 0 for s in stages)
    failing = [s for s in stages if not s.get("ok")]
    if failing or ok == 0:
        parts = [f"{requests - ok} of {requests} measured requests failed"]
        kinds = describe_kinds(record.get("errors") or [])
        if kinds:
            parts.append(f"({kinds})")
        for s in failing:
            if s.get("aborted"):
                parts.append(f"; stage {s['name']}: {s['aborted']}")
            elif not (s.get("summary") or {}).get("requests"):
                parts.append(f"; stage {s['name']}: no measured request was sent")
        allowed = params.get("max_error_frac") or 0
        if allowed and ok:
            parts.append(f"; more than the {allowed:g} allowed (--param max_error_frac)")
        return "errors", " ".join(parts).replace(" ;", ";")
    bound = [s["name"] for s in stages if s.get("client_bound")]
    if bound and params.get("client_bound") == "fail":
        return "client-bound", (f"client-bound in {', '.join(bound)}: the load generator, not the server, may have "
                                "set these numbers (try --param workers=N, or less load)")
    return "completed", None


class ServedModelWatch:
    """Notices the served model changing under a run: the `model` its responses name, what /v1/models
    lists, and, when metralectl serves the target, its lifecycle state (a run, swap or stop in progress
    holds the lifecycle lock) and which container serves."""

    def __init__(self, control: Control, target: Target, managed: dict[str, Any] | None, url: str) -> None:
        self.control = control
        self.listed = target.model  # /v1/models when the run started
        self.named: str | None = None  # what the first stage's responses named
        self.managed = managed
        self.url = url
        self.measured: str | None = target.model

    def after_stage(self, k: int, name: str, results: list[RequestResult]) -> str | None:
        """None, or why this stage did not measure the model the run started on."""
        where = f"at stage {k + 1}, {name}"
        named = [r.model for r in sorted(results, key=lambda r: r.t_send) if r.phase == "measure" and r.model]
        if named:
            self.named = self.named or named[0]
            self.measured = named[0]
            other = next((m for m in named if m != self.named), None)
            if other is not None:
                return f"the served model changed ({clean(self.named, 120)} → {clean(other, 120)} {where})"
        listed = self.control.served_model()
        if self.listed is not None and listed is not None and listed != self.listed:
            return f"the served model changed ({clean(self.listed, 120)} → {clean(listed, 120)} {where})"
        if not named:
            self.measured = listed or self.listed
        if self.managed:
            from metralectl.seams import store
            holder = store.lock_holder()
            if holder and not holder.startswith(store.UNIT_HOLDER):  # a unit is this very run, on a peer's behalf
                return (f"the served model changed: metralectl is changing what is served ({clean(holder, 120)}) "
                        f"{where}")
            now = managed_container(self.url)
            if now is not None and (now.get("container"), now.get("spec_hash")) != (
                    self.managed.get("container"), self.managed.get("spec_hash")):
                return (f"the served model changed ({self.managed.get('recipe')} → {now.get('recipe')} {where}: "
                        f"metralectl now serves container {now.get('container')})")
        return None
