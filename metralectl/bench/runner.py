"""One benchmark run end to end: target, prompts, stages, records, gates. Emits events; never prints."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from metralectl import __version__
from metralectl.bench import gates as G
from metralectl.bench import records, signed
from metralectl.bench.energy import StageEnergy
from metralectl.bench.prompts import RequestFactory, Shaped, shape_prompt
from metralectl.bench.results import RequestResult, aggregate
from metralectl.bench.shard import auto_workers, run_load
from metralectl.bench.suites import WEATHER_TOOL, Stage, get_suite
from metralectl.bench.target import Control, Target, describe
from metralectl.errors import MetralError, UsageError


@dataclass(frozen=True)
class Event:
    kind: str  # "note" | "stage" | "stage-done" | "warning"
    message: str
    data: dict[str, Any] = field(default_factory=dict)


Listener = Callable[[Event], None]


@dataclass
class RunRequest:
    suite: str
    params: dict[str, Any]  # every parameter of the schema, validated
    url: str
    source: str = "cli"
    gates: list[G.Gate] = field(default_factory=list)
    fail_on_verdict: bool = True
    recipe: Any | None = None  # a Recipe whose validated numbers gate `decode`
    managed: dict[str, Any] | None = None  # what metralectl's container labels say about the target
    self_started: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    probe: Any | None = None  # GpuProbe for energy (tests inject fakes)
    unit: dict[str, Any] | None = None  # a peer's remote unit this run is for ({key, requester, digest, campaign})


class RunInterrupted(MetralError):
    exit_code = 1


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _workers(value: str, stage: Stage) -> int:
    if value == "auto":
        return auto_workers(stage.load)
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--param workers={value}: expected a number or auto") from None
    if n < 1:
        raise UsageError("--param workers must be at least 1")
    return n


def _factory(stage: Stage, p: dict[str, Any], model: str, shaped: Shaped | None, nonce: int) -> RequestFactory:
    import json

    return RequestFactory(
        model=model, max_tokens=stage.osl, text=shaped.text if shaped else (stage.prompt or ""),
        expected_prompt_tokens=shaped.tokens if shaped else None, prefix=stage.prefix, nonce=nonce,
        temperature=p.get("temperature", 0.0), seed=p["seed"], ignore_eos=p["ignore_eos"] and not stage.tools,
        continuous_usage=p["continuous_usage"], keep_content=stage.keep_content,
        tools=json.dumps(WEATHER_TOOL) if stage.tools else None, tool_choice=stage.tool_choice)


def run(req: RunRequest, on_event: Listener = lambda e: None) -> dict[str, Any]:
    """Run the suite; returns the final record (also on disk). Raises RunInterrupted on Ctrl-C/SIGTERM,
    after writing the record as interrupted."""
    suite = get_suite(req.suite)
    p = req.params
    stages = suite.stages(p)
    with Control(req.url, headers=req.headers) as control:
        http_status, body = control.health()
        if http_status != 200:
            raise MetralError(f"{req.url} is not ready: /health answered {http_status if http_status is not None else body}",
                              "start it (`metralectl run RECIPE`), or pass --url / --self-start RECIPE")
        target = describe(control, managed=req.managed)
        if req.unit and req.recipe is not None and target.recipe != req.recipe.name:
            raise MetralError(f"the unit is for recipe {req.recipe.name}, but {req.url} serves "
                              f"{target.recipe or 'something metralectl did not start'}",
                              f"on this node: `metralectl run {req.recipe.name}` (or swap to it) first")
        model = p["model"] or target.model or "default"
        run_id = records.new_run_id()
        record: dict[str, Any] = {
            "started_at": _now(), "finished_at": None, "source": req.source, "metralectl_version": __version__,
            "params": p, "target": target.to_dict(), "self_started": req.self_started, "stages": [],
            "gates": [], "verdict": "none", "summary": {}, "client": {}, "error": None, "exit_code": None,
            "telemetry": {}, "prompt_sizing": {}, "model_sent": model}
        if req.unit:
            record["unit"] = dict(req.unit)
        directory = records.start(req.suite, run_id, record)
        on_event(Event("note", f"run {run_id} -> {directory}", {"run_id": run_id, "dir": str(directory)}))
        energy = StageEnergy(req.probe)
        try:
            done = _stages(req, stages, control, model, record, directory, energy, on_event)
        except KeyboardInterrupt:
            done = None
        except Exception as exc:
            # the run itself broke: say so in its record (status failed, exit 1) before the CLI reports it
            record.pop("_partial", None)
            record.update({"status": "failed", "finished_at": _now(), "exit_code": 1,
                           "error": exc.message if isinstance(exc, MetralError) else f"{type(exc).__name__}: {exc}"})
            records.save(directory, record)
            raise
        finally:
            energy.stop()
    runs = done if done is not None else record.pop("_partial", [])
    record.pop("_partial", None)
    record["summary"] = suite.summarize(p, runs) if runs else {}
    interrupted = done is None or record.get("status") == "interrupted"
    bound = [s["name"] for s in record["stages"] if s.get("client_bound")]
    record["client"] = {"client_bound": bool(bound), "stages": bound}
    status = "interrupted" if interrupted else "completed"
    if bound and p["client_bound"] == "fail" and status == "completed":
        status = "client-bound"
        record["error"] = (f"client-bound in {', '.join(bound)}: the load generator, not the server, may have set "
                           "these numbers (try --param workers=N, or less load)")
    verdicts = G.evaluate(_gates(req, target, record, on_event), (record["summary"] or {}).get("headline") or {})
    record["gates"] = [v.to_dict() for v in verdicts]
    record["verdict"] = G.overall(verdicts)
    record["status"] = status
    record["finished_at"] = _now()
    record["exit_code"] = G.exit_code(status, record["verdict"], fail_on_verdict=req.fail_on_verdict)
    if interrupted:
        record["error"] = record.get("error") or "interrupted"
    records.save(directory, record)
    unsigned = signed.sign_run(directory, record)
    if unsigned:
        on_event(Event("note", unsigned, {}))
    record["_dir"] = str(directory)
    if interrupted:
        raise RunInterrupted(f"benchmark interrupted; partial record kept: {run_id}",
                             f"metralectl bench show {run_id}")
    return record


def _gates(req: RunRequest, target: Target, record: dict[str, Any], on_event: Listener) -> list[G.Gate]:
    gates = list(req.gates) + G.param_gates(req.suite, req.params)
    if req.suite == "decode" and req.recipe is not None:
        v = req.recipe.validated
        gate, why = G.recipe_gate(v.decode_tok_s, v.hardware or req.recipe.hardware, target.hardware_class,
                                  req.params["tolerance"], req.recipe.name)
        if gate is not None:
            gates.append(gate)
        else:
            record["gate_notes"] = [why]
            on_event(Event("warning", why))
    return gates


def _stages(req: RunRequest, stages: list[Stage], control: Control, model: str, record: dict[str, Any],
            directory: Path, energy: StageEnergy, on_event: Listener) -> list[tuple[Stage, list[RequestResult], dict[str, Any]]] | None:
    p = req.params
    shaped_by_isl: dict[int, Shaped] = {}
    runs: list[tuple[Stage, list[RequestResult], dict[str, Any]]] = []
    record["_partial"] = runs
    nonce = int(time.time()) % 10000
    path = "/v1/chat/completions"
    for k, stage in enumerate(stages):
        shaped = None
        if stage.isl is not None:
            if stage.isl not in shaped_by_isl:
                on_event(Event("note", f"sizing a {stage.isl}-token prompt with /tokenize"))
                shaped_by_isl[stage.isl] = shape_prompt(
                    stage.isl, lambda msgs: control.tokenize_messages(model, msgs), seed=p["seed"],
                    with_prefix=stage.prefix != "none")
                s = shaped_by_isl[stage.isl]
                record["prompt_sizing"][str(stage.isl)] = {"method": s.method, "tokens": s.tokens}
                if s.method == "estimated":
                    on_event(Event("warning", "the engine offers no /tokenize: prompt lengths are estimates "
                                              "(checked against usage.prompt_tokens afterwards)"))
            shaped = shaped_by_isl[stage.isl]
        factory = _factory(stage, p, model, shaped, nonce + k)
        workers = _workers(p["workers"], stage)
        on_event(Event("stage", f"[{k + 1}/{len(stages)}] {stage.name}", {"workers": workers}))
        window = energy.open()
        outcome = run_load(stage.load, req.url, path, factory, workers=workers, headers=req.headers)
        tokens = sum(r.output_tokens for r in outcome.results)
        agg = aggregate(outcome.results, outcome.window)
        reasons = G.client_bound_reasons(outcome.health, p["max_loop_lag_ms"], p["max_client_cpu"])
        stage_rec = {"name": stage.name, "labels": stage.labels, "load": asdict(stage.load), "workers": workers,
                     "summary": agg, "client_health": outcome.health, "client_bound": reasons,
                     "energy": energy.close(window, tokens), "cancelled": outcome.cancelled}
        record["stages"].append(stage_rec)
        t0 = outcome.t0
        records.append_requests(directory, [{"stage": stage.name, **r.to_record(t0)} for r in outcome.results])
        runs.append((stage, outcome.results, agg))
        record["telemetry"] = {"energy_available": energy.available, "thermal": energy.thermal(),
                               "reason": None if energy.available else f"unavailable: {energy.reason}"}
        records.save(directory, {k2: v for k2, v in record.items() if k2 != "_partial"})
        on_event(Event("stage-done", stage.name, {"summary": agg, "client_bound": reasons}))
        if outcome.cancelled:
            record["status"] = "interrupted"
            return None
    return runs
