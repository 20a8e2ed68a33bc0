"""Which engine a benchmark measured, as its record says it (`target.engine`). Pure, but for probe().

When metralectl serves the target, the engine is the recipe's: the container's labels tie the URL to the
recipe, the recipe names its engine. Otherwise it is what the server's own answers show, each answer a
signature only that engine gives. Each engine's class says its own (core/engines/: `owned_by` in
`/v1/models`, its `/metrics` prefix, `signatures()` such as llama.cpp's `/props` or Metrale's `/serve-config`
digests, `supporting()` for answers any server may give, `version()`); here only what no engine class owns:
- `transformers serve`: nothing above (its `owned_by` is the model's organisation or "local", it has no
  /metrics), but its `GET /openapi.json` lists its own routes `/load_model` and `/reset`.

No signature, or signatures of two engines, is "unknown": the record says so, with what was seen, and never
guesses. The name is the engine file's (`engine/<name>.yaml`) where metralectl has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metralectl.bench.run_record import EngineIdentity
from metralectl.safetext import clean
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.seams.endpoint import EngineClient


@dataclass(frozen=True)
class Answers:
    """What the server answered: each GET's JSON (None when it gave no 200 JSON), /metrics as text."""

    models: Any = None
    serve_config: Any = None
    hardware: Any = None
    props: Any = None
    metrics: str | None = None
    openapi: Any = None


TRANSFORMERS_ROUTES = ("/load_model", "/reset")
Signal = tuple[str, str]  # (engine, the evidence)
__all__ = ["Answers", "EngineIdentity", "describe", "detect", "disagreement", "from_recipe", "probe", "short",
           "signals", "version"]


def probe(control: EngineClient, *, models: Any, serve_config: Any, hardware: Any) -> Answers:
    """The answers describe() already has, plus /props, /metrics and /openapi.json (three GETs, before any load)."""
    from metralectl.errors import MetralError

    try:
        metrics: str | None = control.metrics_text()
    except MetralError:
        metrics = None
    return Answers(models, serve_config, hardware, control.get_json("/props"), metrics,
                   control.get_json("/openapi.json"))


def signals(a: Answers) -> list[Signal]:
    """Every engine signature in the answers, in the order above."""
    from metralectl.core.engines.registry import engines

    out: list[Signal] = []
    owners_of = {word: engine.name for engine in engines().values() for word in engine.owned_by}
    entries = a.models.get("data") if isinstance(a.models, dict) else None
    owners = [e.get("owned_by") for e in entries or [] if isinstance(e, dict)]
    for owner in dict.fromkeys(o for o in owners if isinstance(o, str)):
        if owner in owners_of:
            out.append((owners_of[owner], f'GET /v1/models: owned_by "{owner}"'))
    out += [(engine.name, why) for engine in engines().values() for why in engine.signatures(a)]
    out += _metric_signals(a.metrics)
    paths = a.openapi.get("paths") if isinstance(a.openapi, dict) else None
    if isinstance(paths, dict) and all(route in paths for route in TRANSFORMERS_ROUTES):
        out.append(("transformers", "GET /openapi.json: transformers serve's routes " + ", ".join(TRANSFORMERS_ROUTES)))
    return out


def _metric_signals(text: str | None) -> list[Signal]:
    from metralectl.core.engines.registry import engines

    prefixes = [(e.metric_prefix, e.name) for e in engines().values() if e.metric_prefix]
    counts: dict[str, int] = {}
    for line in (text or "").splitlines():
        if line.startswith("#"):
            continue
        for prefix, _engine in prefixes:
            if line.startswith(prefix):
                counts[prefix] = counts.get(prefix, 0) + 1
    return [(engine, f"GET /metrics: {count(counts[prefix], prefix + '* sample')}")
            for prefix, engine in prefixes if counts.get(prefix)]


def detect(a: Answers) -> EngineIdentity:
    """What the answers alone show: one engine's signatures, else unknown (none, or two engines')."""
    found = signals(a)
    names = list(dict.fromkeys(name for name, _ in found))
    if len(names) == 1:
        name = names[0]
        evidence = "; ".join(why for _, why in found) + _supporting(name, a)
        return _identity(name, "detected", evidence, name, None, version(name, a))
    if not names:
        return _identity(None, "unknown", "the server showed no engine's signature (" + _seen(a) + ")", None, None, None)
    return _identity(None, "unknown", "the server showed signatures of several engines: "
                     + "; ".join(f"{name} ({why})" for name, why in found), None, None, None)


def from_recipe(engine: str, recipe: str, revision: str | None, container: str | None,
                detected: EngineIdentity) -> EngineIdentity:
    """The recipe's engine, for a target metralectl serves; the server's own signatures are checked against it."""
    evidence = f"recipe {recipe}" + (f", served by metralectl in container {container}" if container else
                                     ", served by metralectl")
    if detected["name"] == engine:
        evidence += f"; the server agrees ({detected['evidence']})"
    elif detected["name"] is not None:
        evidence += f"; but the server answers like {detected['name']} ({detected['evidence']})"
    return _identity(engine, "recipe", evidence, detected["name"], revision,
                     detected["version"] if detected["name"] == engine else None)


def disagreement(identity: EngineIdentity, gate_engine: str | None = None) -> str | None:
    """Why the numbers may not be what they seem; None when nothing disagrees. The server answers like another
    engine than the served recipe's; or the recipe the run is gated against (`--recipe`) is for another engine
    than the one measured."""
    name, seen = identity["name"], identity["detected"]
    if identity["source"] == "recipe" and seen is not None and seen != name:
        return f"the recipe's engine is {name}, but the server answers like {seen}"
    if gate_engine is None or name is None or name == gate_engine:
        return None
    if identity["source"] == "recipe":
        return f"the recipe gated on is for {gate_engine}, but metralectl serves {name} there"
    return f"the recipe's engine is {gate_engine}, but the server answers like {name}"


def version(name: str, a: Answers) -> str | None:
    """The build the server reports, as it spells it (capped)."""
    from metralectl.core.engines.registry import engine_for

    value = engine_for(name).version(a)
    return clean(value, 80) if isinstance(value, str) and value else None


def _supporting(name: str, a: Answers) -> str:
    """Answers that agree but prove nothing alone; and a server that says it is a test double."""
    from metralectl.core.engines.registry import engine_for

    extra = "".join("; " + why for why in engine_for(name).supporting(a))
    if any(isinstance(x, dict) and x.get("test_double") is True for x in (a.serve_config, a.hardware)):
        extra += "; it says it is a test double (test_double: true)"
    return extra


def _seen(a: Answers) -> str:
    """What answered at all, for an unknown engine's evidence."""
    parts = []
    entries = a.models.get("data") if isinstance(a.models, dict) else None
    owners = sorted({str(e.get("owned_by")) for e in entries or [] if isinstance(e, dict) and "owned_by" in e})
    parts.append(f"/v1/models owned_by {', '.join(clean(o, 40) for o in owners)}" if owners else
                 "/v1/models without owned_by" if isinstance(a.models, dict) else "no /v1/models")
    for label, answer in (("/props", a.props), ("/serve-config", a.serve_config), ("/hardware", a.hardware),
                          ("/openapi.json", a.openapi)):
        parts.append(f"{label} answered" if answer is not None else f"no {label}")
    parts.append("/metrics without a known prefix" if a.metrics else "no /metrics")
    return ", ".join(parts)


def _identity(name: str | None, source: str, evidence: str, detected: str | None, revision: str | None,
              version_: str | None) -> EngineIdentity:
    return {"name": name, "source": source, "evidence": clean(evidence, 600), "detected": detected,
            "revision": revision, "version": version_}


def describe(identity: dict[str, Any] | None) -> str:
    """One line for `bench show` and the dashboard: `llama-cpp (detected: …)`; a record from before engines were
    named says so. Escaped: the record may come from a peer."""
    if not isinstance(identity, dict):
        return "not recorded (a record from before metralectl named engines)"
    name = identity.get("name")
    head = clean(str(name), 40) if name else "unknown"
    bits = [str(identity.get("source") or "?")]
    if identity.get("revision"):
        bits.append(f"revision {clean(str(identity['revision']), 40)}")
    if identity.get("version"):
        bits.append(f"build {clean(str(identity['version']), 80)}")
    return f"{head} ({', '.join(bits)}: {clean(str(identity.get('evidence') or ''), 300)})"


def short(identity: Any) -> str:
    """The engine's name for a table cell: its name, `?` when unknown, `-` when the record predates engines."""
    if not isinstance(identity, dict):
        return "-"
    return clean(str(identity["name"]), 24) if identity.get("name") else "?"
