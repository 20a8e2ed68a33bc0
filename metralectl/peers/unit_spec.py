"""A remote benchmark unit as a peer submits it: what to run, under an idempotency key (pure).

    {"key": "certify-<run>-<node>-<unit>",      the idempotency key (1-128 of A-Z a-z 0-9 . _ -)
     "suite": "decode",                        a suite of `metralectl bench list`
     "params": {"repeats": "5"},               suite parameters, as `--param KEY=VALUE` takes them
     "recipe": null,                           the recipe the node must be serving (and is gated against)
     "gates": ["decode_tok_s_p50>=120"],       extra thresholds on the headline
     "timeout_s": 3600,                        the node stops the unit after this long
     "campaign": "c-20261201-..."}             the campaign it belongs to (a label on the record)

Submitting the same key with the same body returns the unit already there; the same key with another
body is refused. "The same body" is decided on the canonical form (`digest`), after the node has
checked the suite and every parameter against the suite's schema, so `{"repeats": 5}` and
`{"repeats": "5"}` are one unit.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from metralectl.errors import ExitCode, MetralError
from metralectl.wording import noun

KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
FIELDS = ("key", "suite", "params", "recipe", "gates", "timeout_s", "campaign")
MAX_TIMEOUT_S = 48 * 3600.0


class UnitSpecError(MetralError):
    """A unit body the node refuses (400): names the field and what it must be."""

    exit_code = ExitCode.DATA


def param_text(value: Any, where: str) -> str:
    """A parameter value as `--param KEY=VALUE` takes it (lists of numbers comma-joined)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return ",".join(str(v) for v in value)
    raise UnitSpecError(f"{where}: expected a string, number, boolean or list of numbers, not {value!r}")


@dataclass(frozen=True)
class UnitSpec:
    key: str
    suite: str
    params: dict[str, str] = field(default_factory=dict)
    recipe: str | None = None
    gates: tuple[str, ...] = ()
    timeout_s: float = 3600.0
    campaign: str | None = None

    def body(self) -> dict[str, Any]:
        return {"key": self.key, "suite": self.suite, "params": dict(sorted(self.params.items())),
                "recipe": self.recipe, "gates": list(self.gates), "timeout_s": self.timeout_s,
                "campaign": self.campaign}

    def canonical(self) -> bytes:
        return json.dumps(self.body(), sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    def param_pairs(self) -> list[str]:
        return [f"{k}={v}" for k, v in sorted(self.params.items())]

    @classmethod
    def from_json(cls, raw: Any) -> UnitSpec:
        """Parse and check a submitted body (suite, parameters and gates against the bench schema)."""
        if not isinstance(raw, dict):
            raise UnitSpecError("a unit must be a JSON object", f"fields: {', '.join(FIELDS)}")
        unknown = sorted(set(raw) - set(FIELDS))
        if unknown:
            raise UnitSpecError(f"unknown unit {noun(len(unknown), 'field')}: {', '.join(map(str, unknown))}", f"fields: {', '.join(FIELDS)}")
        key = raw.get("key")
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise UnitSpecError(f"key: expected 1-128 characters of A-Z a-z 0-9 . _ - (starting alphanumeric), "
                                f"not {key!r}")
        suite = raw.get("suite")
        if not isinstance(suite, str) or not suite:
            raise UnitSpecError("suite: expected a suite name (`metralectl bench list`)")
        params_raw = raw.get("params") or {}
        if not isinstance(params_raw, dict):
            raise UnitSpecError("params: expected an object of NAME: VALUE")
        params = {str(k): param_text(v, f"params.{k}") for k, v in params_raw.items()}
        recipe = raw.get("recipe")
        if recipe is not None and (not isinstance(recipe, str) or not recipe):
            raise UnitSpecError("recipe: expected a recipe name or null")
        gates_raw = raw.get("gates") or []
        if not isinstance(gates_raw, list) or not all(isinstance(g, str) for g in gates_raw):
            raise UnitSpecError("gates: expected a list of strings like decode_tok_s_p50>=120")
        timeout = raw.get("timeout_s", 3600.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 1 <= timeout <= MAX_TIMEOUT_S:
            raise UnitSpecError(f"timeout_s: expected seconds from 1 to {MAX_TIMEOUT_S:.0f}, not {timeout!r}")
        campaign = raw.get("campaign")
        if campaign is not None and (not isinstance(campaign, str) or not KEY_RE.fullmatch(campaign)):
            raise UnitSpecError(f"campaign: expected a label of A-Z a-z 0-9 . _ -, not {campaign!r}")
        spec = cls(key, suite, params, recipe, tuple(gates_raw), float(timeout), campaign)
        spec.check_against_schema()
        return spec

    def check_against_schema(self) -> None:
        """The suite exists, every parameter parses, every gate parses (the node refuses before queueing)."""
        from metralectl.bench.gates import parse_gate
        from metralectl.bench.params import parse_params
        from metralectl.bench.suites import get_suite

        try:
            suite = get_suite(self.suite)
            parse_params(suite.id, suite.schema, self.param_pairs())
            for gate in self.gates:
                parse_gate(gate)
        except MetralError as exc:
            raise UnitSpecError(exc.message, exc.hint) from None
