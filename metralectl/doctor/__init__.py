"""`metralectl doctor`: every setup problem found and explained (SPEC §5), as data.

    ctx = Context(port=8888, recipe=None)
    results = run_checks(ctx, select(ctx.recipe_name))   # list[CheckResult], within ~3 s, never hangs
    ctx.close()                                           # waits (bounded) for a probe container's removal

The CLI renders the results (`metralectl doctor`, `--json`); the agent and the TUI reuse them.
Nothing here prints, and nothing imports docker or pynvml at module level.
"""

from __future__ import annotations

from metralectl.doctor.context import Context
from metralectl.doctor.identity import Identity, current_identity
from metralectl.doctor.model import Check, CheckResult, Finding, Status, counts, exit_code, has_problem
from metralectl.doctor.registry import CHECKS, RECIPE_CHECKS, select
from metralectl.doctor.runner import run_checks


def diagnose(ctx: Context) -> list[CheckResult]:
    """Run the checks this context asks for (all, or those its recipe needs)."""
    return run_checks(ctx, select(ctx.recipe_name))


__all__ = [
    "CHECKS", "RECIPE_CHECKS", "Check", "CheckResult", "Context", "Finding", "Identity", "Status", "counts",
    "current_identity", "diagnose", "exit_code", "has_problem", "run_checks", "select",
]
