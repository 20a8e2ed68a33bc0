"""A campaign as the operator writes it: a plan file (YAML) and/or --unit options, checked with positions.

    name: nightly                     # a label (default: the run id)
    nodes: [10.10.10.2, dgx3.local]   # peer addresses (--node adds more)
    reference: 10.10.10.2             # hosts every speed-class unit (default: most free memory, then coolest)
    recipe: qwen3.5-35b-a3b           # the recipe every node must be serving (a unit may name its own)
    units:
      - suite: decode
        params: {repeats: 10}
        gates: [decode_tok_s_p50>=120]
      - suite: concurrency-sweep
        id: sweep                     # default: the suite's name (numbered when repeated)
        params: {concurrencies: [1, 2, 4, 8]}
        shards: 2                     # cut into shard=0/2 and 1/2 (suites with a shard parameter)
        expected_s: 120               # default: estimated from the parameters, refined from history

`--unit "SUITE KEY=VALUE ..."` adds one entry from the command line. Every problem names the file,
line and key (the suite's parameters are checked against its schema here, before any node is asked).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metralectl.campaign.plan import PlannedUnit, estimate_s, expand
from metralectl.errors import ExitCode, MetralError, Problem, RecipeInvalid, UsageError

TOP_KEYS = ("name", "nodes", "reference", "recipe", "units")
UNIT_KEYS = ("suite", "id", "params", "gates", "recipe", "shards", "expected_s")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,47}")


class CampaignInvalid(RecipeInvalid):
    """The plan file (or a --unit) is not a campaign: every problem with its place."""

    exit_code = ExitCode.DATA


@dataclass(frozen=True)
class CampaignSpec:
    name: str | None
    nodes: tuple[str, ...]
    reference: str | None
    units: tuple[PlannedUnit, ...]


@dataclass(frozen=True)
class _Entry:
    where: tuple[str, tuple[Any, ...]]  # (source, keypath) for messages
    suite: str
    id: str | None
    params: dict[str, Any]
    gates: tuple[str, ...]
    recipe: str | None
    shards: int
    expected_s: float | None


def parse_cli_unit(text: str) -> dict[str, Any]:
    """`"concurrency-sweep concurrencies=1,2,4 duration_s=10"` -> an entry mapping."""
    words = text.split()
    if not words:
        raise UsageError("--unit needs a suite, e.g. --unit decode or --unit \"decode repeats=5\"")
    params: dict[str, Any] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise UsageError(f"--unit {text!r}: {word!r} is not KEY=VALUE",
                             "write --unit \"SUITE KEY=VALUE KEY=VALUE\" (quoted, space-separated)")
        params[key] = value
    return {"suite": words[0], "params": params}


def load(path: Path | None, cli_units: list[str], cli_nodes: list[str], reference: str | None,
         recipe: str | None) -> CampaignSpec:
    from metralectl.core import yamlsrc
    from metralectl.core.schema import Checker

    data: dict[str, Any] = {}
    problems: list[Problem] = []
    doc = None
    if path is not None:
        try:
            doc = yamlsrc.load_file(path)
        except yamlsrc.YamlSyntax as exc:
            raise CampaignInvalid([exc.problem]) from None
        checker = Checker(doc)
        data = checker.mapping(doc.data if doc.data is not None else {}, (), "a campaign plan")
        checker.known_keys(data, (), TOP_KEYS, "the campaign plan")
        problems = checker.problems
    entries: list[tuple[Any, tuple[Any, ...], str]] = []
    raw_units = data.get("units", [])
    if not isinstance(raw_units, list):
        problems.append(doc.problem(("units",), "units must be a list of units") if doc else
                        Problem("plan", 0, 0, "units", "units must be a list"))
        raw_units = []
    for k, raw in enumerate(raw_units):
        entries.append((raw, ("units", k), str(path)))
    for k, text in enumerate(cli_units):
        entries.append((parse_cli_unit(text), ("--unit", k), "command line"))
    nodes = [str(n) for n in (data.get("nodes") or [])] + list(cli_nodes)
    if doc is not None and "nodes" in data and not isinstance(data["nodes"], list):
        problems.append(doc.problem(("nodes",), "nodes must be a list of addresses"))
        nodes = list(cli_nodes)
    default_recipe = recipe if recipe is not None else data.get("recipe")
    checked = [_check_entry(raw, keypath, source, doc, problems, default_recipe) for raw, keypath, source in entries]
    if not entries:
        problems.append(Problem(str(path) if path else "command line", 1, 1, "units", "the campaign has no units",
                                "add `units:` to the plan, or --unit SUITE"))
    if any(p.severity == "error" for p in problems):
        raise CampaignInvalid(problems)
    units = _units([e for e in checked if e is not None], problems, doc)
    if any(p.severity == "error" for p in problems):
        raise CampaignInvalid(problems)
    name = data.get("name")
    return CampaignSpec(str(name) if name else None, tuple(dict.fromkeys(nodes)),
                        reference if reference is not None else (str(data["reference"]) if data.get("reference") else None),
                        tuple(units))


def _problem(doc: Any, source: str, keypath: tuple[Any, ...], message: str, hint: str | None = None) -> Problem:
    if doc is not None and source != "command line":
        return doc.problem(keypath, message, hint)
    return Problem(source, 0, 0, ".".join(str(k) for k in keypath), message, hint)


def _check_entry(raw: Any, keypath: tuple[Any, ...], source: str, doc: Any, problems: list[Problem],
                 default_recipe: Any) -> _Entry | None:
    from metralectl.bench.gates import parse_gate
    from metralectl.bench.suites import get_suite

    def bad(key: str | None, message: str, hint: str | None = None) -> None:
        problems.append(_problem(doc, source, keypath + ((key,) if key else ()), message, hint))

    if not isinstance(raw, dict):
        bad(None, "a unit must be a mapping with at least `suite:`")
        return None
    for key in raw:
        if key not in UNIT_KEYS:
            bad(str(key), f"unknown key {key!r} in a unit", f"valid keys: {', '.join(UNIT_KEYS)}")
    try:
        suite = get_suite(str(raw.get("suite") or ""))
    except MetralError as exc:
        bad("suite", exc.message, exc.hint)
        return None
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        bad("params", "params must be a mapping of NAME: VALUE")
        return None
    gates = raw.get("gates") or []
    if not isinstance(gates, list) or not all(isinstance(g, str) for g in gates):
        bad("gates", "gates must be a list of strings like decode_tok_s_p50>=120")
        gates = []
    for g in gates:
        try:
            parse_gate(g)
        except MetralError as exc:
            bad("gates", exc.message, exc.hint)
    shards = raw.get("shards", 1)
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 64:
        bad("shards", f"shards must be an integer from 1 to 64, not {shards!r}")
        shards = 1
    if shards > 1 and "shard" not in {p.name for p in suite.schema}:
        bad("shards", f"suite {suite.id} cannot be sharded (it has no shard parameter)",
            "suites with a shard parameter: concurrency-sweep")
    expected = raw.get("expected_s")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, (int, float)) or expected <= 0):
        bad("expected_s", f"expected_s must be a positive number of seconds, not {expected!r}")
        expected = None
    unit_id = raw.get("id")
    if unit_id is not None and (not isinstance(unit_id, str) or not _ID.fullmatch(unit_id)):
        bad("id", f"id must be 1-48 characters of A-Z a-z 0-9 . _ -, not {unit_id!r}")
        unit_id = None
    recipe = raw.get("recipe", default_recipe)
    if recipe is not None and not isinstance(recipe, str):
        bad("recipe", "recipe must be a recipe name")
        recipe = None
    return _Entry((source, keypath), suite.id, unit_id, params, tuple(gates), recipe, shards,
                  float(expected) if expected is not None else None)


def _units(entries: list[_Entry], problems: list[Problem], doc: Any) -> list[PlannedUnit]:
    from metralectl.bench.params import parse_params
    from metralectl.bench.suites import get_suite
    from metralectl.peers.unit_spec import param_text

    out: list[PlannedUnit] = []
    used: dict[str, int] = {}
    for e in entries:
        suite = get_suite(e.suite)
        try:
            texts = {str(k): param_text(v, f"params.{k}") for k, v in e.params.items()}
            parse_params(suite.id, suite.schema, [f"{k}={v}" for k, v in texts.items()])
        except MetralError as exc:
            problems.append(_problem(doc, e.where[0], e.where[1] + ("params",), exc.message, exc.hint))
            continue
        base_id = e.id or e.suite
        used[base_id] = used.get(base_id, 0) + 1
        entry_id = base_id if used[base_id] == 1 else f"{base_id}-{used[base_id]}"
        for unit in expand(entry_id, suite.id, texts, e.shards, gates=e.gates, recipe=e.recipe):
            shaped = parse_params(suite.id, suite.schema, [f"{k}={v}" for k, v in unit.params.items()])
            expected = e.expected_s or refine(unit, shaped) or estimate_s(suite.id, shaped)
            out.append(PlannedUnit(unit.id, unit.suite, unit.params, unit.gates, unit.recipe, float(expected), unit.group))
    ids = [u.id for u in out]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(Problem("campaign", 0, 0, "id", f"two units are both called {dup!r}", "give one an `id:`"))
    return out


def refine(unit: PlannedUnit, shaped: dict[str, Any], *, newest: int = 50) -> float | None:
    """The wall time of the newest completed run here of the same suite with the same parameters."""
    from datetime import datetime

    from metralectl.bench import records
    for run in records.list_runs(unit.suite)[:newest]:
        if run.get("status") != "completed" or run.get("params") != shaped:
            continue
        try:
            began = datetime.fromisoformat(str(run["started_at"]))
            ended = datetime.fromisoformat(str(run["finished_at"]))
        except (KeyError, ValueError):
            continue
        seconds = (ended - began).total_seconds()
        if seconds > 0:
            return seconds
    return None
