"""Gates (thresholds -> verdicts), the client-bound judgement, and the exit-code contract (pure).

Exit codes (SPEC §7): 0 ran and every gate passed or there was no verdict; 1 the run failed, was
cancelled, or measured the client instead of the server (client-bound); 2 ran and a gate said no.
`--no-fail-on-verdict` maps 2 to 0.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from metralectl.errors import ExitCode, UsageError

OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, ">": operator.gt,
                                                  "<": operator.lt, "==": operator.eq}
_GATE = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(>=|<=|==|>|<)\s*(-?[0-9.eE+]+)\s*$")


@dataclass(frozen=True)
class Gate:
    metric: str  # a key of the summary's headline
    op: str
    threshold: float
    source: str  # "recipe <name>", "param <key>", "cli"

    def describe(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g} ({self.source})"


@dataclass(frozen=True)
class Verdict:
    gate: Gate
    value: float | None
    passed: bool | None  # None: no data for the metric -> no verdict
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.gate), "value": self.value, "passed": self.passed, "note": self.note}


def parse_gate(text: str) -> Gate:
    m = _GATE.match(text)
    if not m:
        raise UsageError(f"--gate {text!r}: expected METRIC OP NUMBER, e.g. decode_tok_s_p50>=120",
                         "operators: >= <= > < ==; metrics are the keys of the run's headline (`bench show RUN`)")
    return Gate(m.group(1), m.group(2), float(m.group(3)), "cli")


def recipe_gate(validated_tok_s: float | None, validated_hw: str | None, target_hw: str | None, tolerance: float,
                recipe: str) -> tuple[Gate | None, str]:
    """The decode gate a recipe's validated numbers imply: same hardware class only (numbers never
    compare across classes)."""
    if validated_tok_s is None:
        return None, f"recipe {recipe} records no validated decode tok/s"
    if not target_hw:
        return None, "the engine did not say its hardware class (/hardware); no recipe gate"
    if validated_hw and target_hw != validated_hw:
        return None, f"hardware class {target_hw} differs from the recipe's validated {validated_hw}; no recipe gate"
    return Gate("decode_tok_s_p50", ">=", round(validated_tok_s * (1 - tolerance), 3),
                f"recipe {recipe}: validated {validated_tok_s:g} tok/s - {tolerance:.0%}"), ""


def param_gates(suite: str, params: dict[str, Any]) -> list[Gate]:
    gates = []
    if suite == "decode" and params.get("min_tok_s"):
        gates.append(Gate("decode_tok_s_p50", ">=", params["min_tok_s"], "param min_tok_s"))
    if suite == "ttft-prefix" and params.get("min_speedup"):
        gates.append(Gate("prefix_speedup", ">=", params["min_speedup"], "param min_speedup"))
    if suite == "long-decode" and params.get("max_repetition"):
        gates.append(Gate("repetition_max", "<=", params["max_repetition"], "param max_repetition"))
    if suite == "tool-call":
        gates.append(Gate("well_formed_frac", ">=", params["min_well_formed"], "param min_well_formed"))
    if suite == "rate" and params.get("min_slo_attainment") and params.get("rates") == "auto":
        gates.append(Gate("knee.slo_attainment", ">=", params["min_slo_attainment"], "param min_slo_attainment"))
    elif suite == "rate" and params.get("min_slo_attainment"):
        for r in params["rates"]:
            gates.append(Gate(f"rate{r:g}.slo_attainment", ">=", params["min_slo_attainment"], "param min_slo_attainment"))
    return gates


def evaluate(gates: list[Gate], headline: dict[str, Any]) -> list[Verdict]:
    out = []
    for gate in gates:
        value = headline.get(gate.metric)
        if not isinstance(value, (int, float)):
            note = "no such metric in this run" if gate.metric not in headline else "no data"
            out.append(Verdict(gate, None, None, note))
            continue
        out.append(Verdict(gate, float(value), OPS[gate.op](float(value), gate.threshold)))
    return out


def overall(verdicts: list[Verdict]) -> str:
    if any(v.passed is False for v in verdicts):
        return "fail"
    if any(v.passed for v in verdicts):
        return "pass"
    return "none"


def client_bound_reasons(health: dict[str, Any], stamp_error: dict[str, Any] | None, max_error_ms: float,
                         max_lag_ms: float) -> list[str]:
    """Why the load generator, not the server, may have set the numbers (empty: within budget).

    With kernel-stamped reads (the raw transport on Linux) the guard is the estimated error of the
    stamps themselves (results.late_stamp_errors): late reads that merged several of a stream's token
    events into one stamp. The event loop's ready-queue delay does not decide there: a kernel stamp
    is exact however long the read waits, unless a second event of that stream arrives meanwhile.
    Without kernel stamps every stamp is the read time, so the loop's delay is the error."""
    reasons = []
    if stamp_error is not None:
        for key, label in (("p99", "token stamps"), ("ttft_p99", "first-token stamps")):
            value = stamp_error.get(key)
            if value is not None and value > max_error_ms:
                reasons.append(f"late reads shifted {label}: estimated error p99 {value:.2f} ms > {max_error_ms:g} ms "
                               f"({stamp_error.get('late', 0)} of {stamp_error.get('n', 0)} token events)")
    else:
        lag = (health.get("loop_lag_ms") or {}).get("p99")
        if lag is not None and lag > max_lag_ms:
            reasons.append(f"event-loop delay p99 {lag:.2f} ms > {max_lag_ms:g} ms (reads are stamped by the loop)")
    # open loop: a late dispatch bends the arrival process (the request's own times stay exact: they start
    # at its send); p95, because one descheduling on a shared box must not condemn a 20-arrival window
    slip = (health.get("dispatch_slip_ms") or {}).get("p95")
    slip_budget = max(5.0, 2 * max_lag_ms)
    if slip is not None and slip > slip_budget:
        reasons.append(f"arrivals dispatched late: p95 {slip:.2f} ms > {slip_budget:g} ms")
    return reasons


def exit_code(status: str, verdict: str, *, fail_on_verdict: bool = True) -> ExitCode:
    """The book's benchmark meaning: 0 ran, 1 the run failed, 2 ran and a gate said no; 130 Ctrl-C."""
    if status == "interrupted":
        return ExitCode.INTERRUPTED
    if status != "completed":
        return ExitCode.FAILED
    if verdict == "fail":
        return ExitCode.GATE if fail_on_verdict else ExitCode.OK
    return ExitCode.OK
