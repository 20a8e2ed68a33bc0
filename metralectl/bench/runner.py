"""One benchmark run end to end: target, prompts, stages, records, gates. Emits events; never prints."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from metralectl import __version__
from metralectl.bench import gates as G
from metralectl.bench import outcome, records, signed, sizing
from metralectl.bench.dialect import Dialect
from metralectl.bench.energy import StageEnergy
from metralectl.bench.prompts import RequestFactory, Shaped
from metralectl.bench.results import RequestResult, aggregate
from metralectl.bench.run_record import RunOutcome, RunRecord, StageRecord
from metralectl.bench.shard import auto_workers, run_load
from metralectl.bench.suites import WEATHER_TOOL, Stage, get_suite
from metralectl.bench.target import Control, Target, api_rtt_ms, describe, served_context
from metralectl.errors import ExitCode, MetralError, UsageError
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.core.contract import EngineContract
    from metralectl.core.recipe import Recipe


EventKind = Literal["note", "stage", "stage-done", "warning", "progress"]


@dataclass(frozen=True)
class Event:
    kind: EventKind
    message: str
    data: dict[str, Any] = field(default_factory=dict)


Listener = Callable[[Event], None]
# What a suite's summary is computed from: each measured stage, its results and their aggregate.
Measured = list[tuple[Stage, list[RequestResult], dict[str, Any]]]


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
    """Ctrl-C or SIGTERM ended the run; its record is kept as `interrupted` with what was measured."""

    exit_code = ExitCode.INTERRUPTED


CHAT_PATH = "/v1/chat/completions"


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


def _factory(stage: Stage, p: dict[str, Any], model: str, shaped: Shaped | None, nonce: int,
             dialect: Dialect, context: Shaped | None = None) -> RequestFactory:
    import json

    force = p["ignore_eos"] and not stage.tools
    return RequestFactory(
        model=model, max_tokens=stage.osl, text=shaped.text if shaped else (stage.prompt or ""),
        expected_prompt_tokens=(context or shaped).tokens if shaped else None, prefix=stage.prefix, nonce=nonce,
        context=context.text if context else "",
        temperature=p.get("temperature", 0.0), seed=p["seed"] if dialect.seed else None,
        ignore_eos=force and dialect.ignore_eos, min_tokens=force and dialect.min_tokens,
        include_usage=dialect.stream_usage, continuous_usage=p["continuous_usage"] and dialect.continuous_usage,
        keep_content=stage.keep_content, tools=json.dumps(WEATHER_TOOL) if stage.tools else None,
        tool_choice=stage.tool_choice)


def run(req: RunRequest, on_event: Listener = lambda e: None) -> RunOutcome:
    """Run the suite; returns the final record (also on disk) and its directory. Raises RunInterrupted on
    Ctrl-C/SIGTERM, after writing the record as interrupted."""
    from metralectl.lifecycle.engine_token import engine_headers

    suite = get_suite(req.suite)
    # the engine token when metralectl's engine there asks it (its labels); --header's own win
    req = replace(req, headers={**engine_headers((req.managed or {}).get("labels")), **req.headers})
    p = req.params
    stages = suite.stages(p)
    if p.get("tokenizer"):
        from metralectl.bench.tokcount import counter

        counter(p["tokenizer"])  # a bad path or a missing package is a usage error now, not in a worker
    with Control(req.url, headers=req.headers) as control:
        http_status, body = control.health()
        if http_status is None:  # as `chat` says it: an endpoint that does not answer is a service not reached
            raise MetralError(f"nothing answers at {req.url}: {body}",
                              "`metralectl ps` shows what is served and whether it is healthy",
                              exit_code=ExitCode.UNAVAILABLE)
        if http_status != 200:
            raise MetralError(f"{req.url} is not ready: /health answered {http_status}",
                              "`metralectl ps` shows its health; `metralectl logs` what the engine says")
        target = describe(control, managed=req.managed)
        _name_engine(req, target, on_event)
        context_note = None
        if "max_context" in p and not p["max_context"]:  # the served context caps the depths
            limit, context_note = served_context(control)
            if limit:
                p = {**p, "max_context": limit}
                stages = suite.stages(p)
                if not stages:
                    raise UsageError(f"no depth of {p.get('depths')} fits the served context: {context_note}",
                                     "lower the depths, pp or tg (each depth needs depth + pp + tg tokens)")
        if req.unit and req.recipe is not None and target.recipe != req.recipe.name:
            raise MetralError(f"the unit is for recipe {req.recipe.name}, but {req.url} serves "
                              f"{target.recipe or 'something metralectl did not start'}",
                              f"on this node: `metralectl run {req.recipe.name}` (or swap to it) first")
        model = p["model"] or target.model or "default"
        run_id = records.new_run_id()
        record: RunRecord = {
            **records.header(req.suite, run_id),
            "started_at": _now(), "finished_at": None, "source": req.source, "metralectl_version": __version__,
            "params": p, "target": target.to_json(), "self_started": req.self_started, "stages": [],
            "gates": [], "verdict": "none", "summary": {}, "client": {}, "error": None, "exit_code": None,
            "telemetry": {}, "prompt_sizing": {}, "model_sent": model, "dialect": None, "errors": []}
        if context_note:
            record["context_limit"] = context_note
        if req.unit:
            record["unit"] = dict(req.unit)
        directory = records.start(req.suite, run_id, record)
        on_event(Event("note", f"run {run_id} -> {directory}", {"run_id": run_id, "dir": str(directory)}))
        energy = StageEnergy(req.probe)
        measured: Measured = []  # filled stage by stage: what an interrupted run still summarises
        try:
            dialect = _dialect(req, target, model, record, on_event)
            rtt = api_rtt_ms(control) if p.get("latency_mode") == "api" else None
            if rtt is not None:
                record["api_rtt_ms"] = rtt
            finished = _stages(req, p, stages, control, model, dialect, target, record, directory, energy,
                               measured, on_event, rtt_ms=rtt)
        except KeyboardInterrupt:
            finished = False
        except Exception as exc:
            # the run itself broke: say so in its record (status failed, exit 1) before the CLI reports it
            record.update({"status": "failed", "finished_at": _now(), "exit_code": ExitCode.FAILED,
                           "error": exc.message if isinstance(exc, MetralError) else f"{type(exc).__name__}: {exc}"})
            records.save(directory, record)
            raise
        finally:
            energy.stop()
    record["summary"] = suite.summarize(p, measured) if measured else {}
    interrupted = not finished or record["status"] == "interrupted"
    bound = [s["name"] for s in record["stages"] if s.get("client_bound")]
    record["client"] = {"client_bound": bool(bound), "stages": bound}
    record["errors"] = outcome.error_summary(record["stages"])
    status, error = outcome.judge(record, p, interrupted=interrupted)
    verdicts = G.evaluate(_gates(req, target, record, on_event), (record["summary"] or {}).get("headline") or {})
    record["gates"] = [v.to_json() for v in verdicts]
    record["verdict"] = G.overall(verdicts)
    record["status"] = status
    record["error"] = error
    record["finished_at"] = _now()
    record["exit_code"] = G.exit_code(status, record["verdict"], fail_on_verdict=req.fail_on_verdict)
    records.save(directory, record)
    unsigned = signed.sign_run(directory, record)
    if unsigned:
        on_event(Event("note", unsigned, {}))
    if interrupted:
        raise RunInterrupted(f"benchmark interrupted; partial record kept: {run_id}",
                             f"metralectl bench show {run_id}")
    return RunOutcome(record, directory)


def _dialect(req: RunRequest, target: Target, model: str, record: RunRecord, on_event: Listener) -> Dialect:
    """What the requests may carry (bench/dialect.py), said once and recorded."""
    from metralectl.bench import dialect as D
    choice = req.params["dialect"]
    chosen: Dialect | None = {"full": D.FULL, "plain": D.PLAIN}.get(choice)
    if chosen is None and choice == "auto":
        chosen = _engine_dialect(req)
    if chosen is None:
        on_event(Event("note", "probing which request fields the server accepts (one request)"))
        chosen = D.probe(req.url, CHAT_PATH, model, req.headers, timeout_s=min(req.params["timeout_s"], 120.0),
                         transport=req.params["transport"])
    forced = chosen.forces_length(req.params["ignore_eos"])
    record["dialect"] = {**chosen.to_json(), "output_length_forced": forced}
    if chosen.refused:
        on_event(Event("warning", f"the server refused {', '.join(chosen.refused)} ({chosen.refusal}): not sending "
                                  "them in this run", {"refused": list(chosen.refused)}))
    if req.params["ignore_eos"] and not forced:
        on_event(Event("warning", "output length is not forced (the server takes neither ignore_eos nor min_tokens): "
                                  "outputs may end early at EOS, and tok/s is over the outputs as they came"))
    if chosen.sends_usage is False:
        how = ("counted with the tokenizer given" if req.params.get("tokenizer") else
               "counted one per stream event (a lower bound when an event carries several; "
               "--param tokenizer=DIR counts them exactly)")
        on_event(Event("warning", f"the server reports no token usage: output tokens are {how}"))
    return chosen


def _engine_dialect(req: RunRequest) -> Dialect | None:
    """The engine data's dialect, when metralectl serves the target and its engine declares every field."""
    from metralectl.bench import dialect as D
    if not req.managed or req.recipe is None:
        return None
    contract = _contract(req.recipe.engine)
    return D.from_engine(contract.name, contract.request_dialect) if contract is not None else None


def _contract(engine: str) -> EngineContract | None:
    """The engine's contract (engine/<name>.yaml) from the catalog; None when it cannot be loaded."""
    try:
        from metralectl.core.catalog import load_catalog

        return load_catalog().engines.get(engine)
    except MetralError:
        return None


def _catalog_recipe(name: str) -> Recipe | None:
    """The catalog's recipe of this name (a served recipe the run is not gated on); None when there is none."""
    if not name:
        return None
    try:
        from metralectl.core.catalog import load_catalog

        return load_catalog().recipes.get(name)
    except MetralError:
        return None


def _name_engine(req: RunRequest, target: Target, on_event: Listener) -> None:
    """The engine on record (target.engine): the recipe's when metralectl serves the target from it (its container's
    labels say so), else what the server's answers showed (describe() put that there), else unknown."""
    from metralectl.bench import engine_id
    from metralectl.safetext import clean

    detected = target.engine or engine_id.detect(engine_id.Answers())
    served = str(req.managed.get("recipe") or "") if req.managed else ""
    recipe = req.recipe
    served_recipe = recipe if recipe is not None and served == recipe.name else _catalog_recipe(served)
    if served_recipe is not None:
        contract = _contract(served_recipe.engine)
        revision = contract.revision(served_recipe.engine_revision) if contract is not None else None
        target.engine = engine_id.from_recipe(
            served_recipe.engine, served_recipe.name,
            revision.label if revision is not None else served_recipe.engine_revision or None,
            (req.managed or {}).get("container"), detected)
    else:
        if served:  # metralectl serves a recipe this catalog no longer has: its engine is not known from it
            detected["evidence"] = (f"metralectl serves recipe {clean(served, 80)} there, not in this catalog; "
                                    f"{detected['evidence']}")
        target.engine = detected
    gated_on = recipe.engine if recipe is not None and recipe is not served_recipe else None
    why = engine_id.disagreement(target.engine, gated_on)
    if why:
        on_event(Event("warning", f"{why}: check that {req.url} is the server you meant", {"engine": dict(target.engine)}))


def _gates(req: RunRequest, target: Target, record: RunRecord, on_event: Listener) -> list[G.Gate]:
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


def _stages(req: RunRequest, p: dict[str, Any], stages: list[Stage], control: Control, model: str, dialect: Dialect,
            target: Target, record: RunRecord, directory: Path, energy: StageEnergy, measured: Measured,
            on_event: Listener, rtt_ms: float | None = None) -> bool:
    """Run the stages, appending each to `measured` and to the record; False when the run was cancelled.
    A suite with `more` plans its next stages from what was measured (appended as the run goes)."""
    stages = list(stages)
    more = get_suite(req.suite).more
    shaped_by_key: dict[tuple[int, int], Shaped] = {}
    nonce = int(time.time()) % 10000
    watch = outcome.ServedModelWatch(control, target, req.managed, req.url)

    def progress(kind: str, data: dict[str, Any]) -> None:
        if kind == "drain":
            on_event(Event("progress", f"draining: {count(data['in_flight'], 'measured request')} still running "
                                       f"({data['elapsed_s']:g} s of the {data['timeout_s']:g} s drain timeout)", data))

    for k, stage in enumerate(stages):  # `stages` may grow while it is walked (`more`)
        shaped = context = None
        note = lambda text: on_event(Event("note", text))  # noqa: E731
        warn = lambda text: on_event(Event("warning", text))  # noqa: E731
        tokens_of = lambda msgs: control.tokenize_messages(model, msgs)  # noqa: E731
        if stage.isl is not None:
            shaped, context = sizing.size_stage(stage, p["seed"], tokens_of, record["prompt_sizing"], shaped_by_key,
                                                note, warn)
        factory = _factory(stage, p, model, shaped, nonce + k, dialect, context)
        if stage.turns:
            factory = replace(factory, turns=stage.turns)
        if stage.trace:
            factory = replace(factory, per_request=sizing.size_trace(stage, p["seed"], tokens_of,
                                                                     record["prompt_sizing"], note))
        workers = _workers(p["workers"], stage)
        on_event(Event("stage", f"[{k + 1}/{len(stages)}] {stage.name}", {"workers": workers}))
        window = energy.open()
        result = run_load(stage.load, req.url, CHAT_PATH, factory, workers=workers, headers=req.headers,
                          on_progress=progress)
        tokens = sum(r.output_tokens for r in result.results)
        agg = aggregate(result.results, result.window)
        if rtt_ms is not None:
            agg["api_rtt_ms"] = rtt_ms
        reasons = G.client_bound_reasons(result.health, agg.get("stamp_error_ms"), p["max_stamp_error_ms"],
                                         p["max_loop_lag_ms"])
        changed = watch.after_stage(k, stage.name, result.results)
        stage_rec: StageRecord = {
            "name": stage.name, "labels": stage.labels, "load": asdict(stage.load), "workers": workers,
            "summary": agg, "client_health": result.health, "client_bound": reasons,
            "energy": energy.close(window, tokens), "cancelled": result.cancelled,
            "t0_unix_ns": result.t0_unix_ns, "model": watch.measured, "aborted": result.aborted,
            "drain_timed_out": result.drain_timed_out, "invalid": changed, "ok": False}  # ok: judged next
        stage_rec["ok"] = outcome.stage_ok(stage_rec, p["max_error_frac"])
        record["stages"].append(stage_rec)
        records.append_requests(directory, [{"stage": stage.name, **r.to_record(result.t0)} for r in result.results])
        measured.append((stage, result.results, agg))
        record["telemetry"] = {"energy_available": energy.available, "thermal": energy.thermal(),
                               "reason": None if energy.available else f"unavailable: {energy.reason}"}
        records.save(directory, record)
        on_event(Event("stage-done", stage.name, {"summary": agg, "client_bound": reasons, "ok": stage_rec["ok"],
                                                  "aborted": result.aborted, "invalid": changed,
                                                  "drain_timed_out": result.drain_timed_out,
                                                  "errors": outcome.top_kinds(agg)}))
        if result.cancelled:
            record["status"] = "interrupted"
            return False
        if changed:
            break  # every later stage would measure another model
        if more is not None and k == len(stages) - 1 and not result.aborted:
            stages.extend(more(p, measured))
    return True
