"""The shape of a benchmark run's record (run.json), and what a finished run hands back.

The record stays a dict on purpose: run.json is signed byte for byte (bench/signed.py), peers and
`bench history` read records written by every earlier version, and readers must keep keys they do not
know. So the type is a TypedDict: the writer (bench/runner.py, bench/records.py) is checked against it,
the JSON on disk is what it always was. What the runner needs for itself (the stages measured so far,
the run's directory) is not in the record: it is runner state, or `RunOutcome.directory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

# Every key below is written by metralectl; nested summaries stay dict[str, Any] (their keys are each
# suite's headline metrics, documented in docs/benchmarks.md).


class EngineIdentity(TypedDict):
    """Which engine the run measured, and how metralectl knows (bench/engine_id.py; docs/bench.md)."""

    name: str | None  # the engine's short name (engine/<name>.yaml where metralectl has one); None: unknown
    source: str  # recipe | detected | unknown
    evidence: str  # the recipe and its container, or the answers that showed it (or what was seen instead)
    detected: str | None  # what the server's answers alone show (checked against the recipe's when there is one)
    revision: str | None  # the engine revision the recipe targets (source "recipe" only)
    version: str | None  # the build the server reports (llama.cpp's build_info, Metrale's engine_version)


class TargetRecord(TypedDict):
    """What was measured (bench/target.py's Target). Records from before a key existed lack it: readers .get()."""

    url: str
    model: str | None
    serve_config_digests: dict[str, Any]
    hardware: dict[str, Any] | None
    hardware_class: str | None
    engine_version: str | None
    recipe: str | None
    spec_hash: str | None
    image: str | None
    image_revision: str | None
    container: str | None
    serve_flags: dict[str, Any]
    engine: EngineIdentity | None


class StageRecord(TypedDict):
    name: str
    labels: dict[str, Any]
    load: dict[str, Any]  # the stage's LoadSpec
    workers: int
    summary: dict[str, Any]  # results.aggregate()
    client_health: dict[str, Any]
    client_bound: list[str]  # why the load generator may have set the numbers; empty: it did not
    energy: dict[str, Any] | str  # the stage's energy, or why there is none
    cancelled: bool
    t0_unix_ns: int
    model: str | None  # the model the stage's responses named
    aborted: str | None  # why the stage stopped sending early
    drain_timed_out: bool
    invalid: str | None  # why the stage did not measure the model the run started on
    ok: bool


class RunHeader(TypedDict):
    """What records.start() stamps on a record when its run begins."""

    schema: int
    kind: str
    run_id: str
    suite: str
    status: str  # running | completed | errors | invalid | client-bound | interrupted | failed
    pid: int
    host: str
    requests_file: str


class _RunRecordRequired(RunHeader):
    started_at: str
    finished_at: str | None
    source: str  # cli | tui | a peer's unit
    metralectl_version: str
    params: dict[str, Any]
    target: TargetRecord  # target.Target.to_json()
    self_started: dict[str, Any] | None
    stages: list[StageRecord]
    gates: list[dict[str, Any]]  # gates.Verdict.to_json() each
    verdict: str  # pass | fail | none
    summary: dict[str, Any]
    client: dict[str, Any]
    error: str | None
    exit_code: int | None
    telemetry: dict[str, Any]
    prompt_sizing: dict[str, dict[str, Any]]
    model_sent: str
    dialect: dict[str, Any] | None
    errors: list[dict[str, Any]]  # failed requests by kind (outcome.error_summary)


class RunRecord(_RunRecordRequired, total=False):
    unit: dict[str, Any]  # the peer's remote unit this run is for
    gate_notes: list[str]  # why a recipe gate could not be set
    status_recorded: str  # (readers only) the status on disk, when the shown one differs
    context_limit: str  # the served context that capped the depths, and where the server said it
    api_rtt_ms: float | None  # network latency (mean of three GET /v1/models) when the suite takes it off


@dataclass(frozen=True)
class RunOutcome:
    """A finished run: its record (as written to run.json) and where it lies."""

    record: RunRecord
    directory: Path
