"""The suites: parameter schemas, the stages each one runs, and how its results are summarised (pure).

One module per family (decode, sweep, prefix, long, tool, rate, ...), each with its `SUITE`; this registry
lists them in the order `bench list` shows them. A new family is a new module and one line here.
"""

from __future__ import annotations

from metralectl.bench.suites import decode, depth, long, multiturn, prefix, rate, shared, sweep, tool, trace
from metralectl.bench.suites.base import COMMON, Measured, Stage, Suite
from metralectl.bench.suites.decode import FRANCE
from metralectl.bench.suites.long import repetition
from metralectl.bench.suites.rate import goodput
from metralectl.bench.suites.tool import WEATHER_TOOL, tool_call_problems
from metralectl.core.schema import did_you_mean
from metralectl.errors import NotFound

__all__ = ["COMMON", "FRANCE", "SUITES", "WEATHER_TOOL", "Measured", "Stage", "Suite", "get_suite", "goodput",
           "repetition", "tool_call_problems"]

SUITES: dict[str, Suite] = {s.id: s for s in (
    decode.SUITE, sweep.SUITE, prefix.SUITE, long.SUITE, tool.SUITE, rate.SUITE, depth.SUITE, shared.SUITE, multiturn.SUITE, trace.SUITE,
)}


def get_suite(name: str) -> Suite:
    if name in SUITES:
        return SUITES[name]
    guess = did_you_mean(name, SUITES)
    raise NotFound(f"no benchmark suite named {name!r}",
                   f"did you mean `{guess}`?" if guess else f"suites: {', '.join(SUITES)}")
