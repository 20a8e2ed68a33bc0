"""Run checks at once, each in its own daemon thread, and collect every verdict by its deadline.

A check that has not answered by its deadline is reported as such (and left behind: its thread is a
daemon, so it cannot keep the process alive); a check that raises is reported with the error. The
runner itself never blocks longer than the largest check timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from metralectl.doctor.context import Context
from metralectl.doctor.facts import Unanswered
from metralectl.doctor.model import Check, CheckResult, Finding
from metralectl.errors import MetralError


class _Slot:
    def __init__(self, check: Check) -> None:
        self.check = check
        self.done = threading.Event()
        self.finding: Finding | None = None

    def run(self, ctx: Context) -> None:
        try:
            self.finding = self.check.fn(ctx)
        except Unanswered as exc:
            self.finding = Finding("warn", f"could not judge: {exc}", None, {"unanswered": exc.name})
        except MetralError as exc:
            self.finding = Finding("warn", f"could not judge: {exc.message}", exc.hint, {"error": type(exc).__name__})
        except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others' verdicts
            self.finding = Finding("warn", f"the check itself failed: {type(exc).__name__}: {exc}",
                                   "report it (`metralectl --debug doctor`)", {"error": type(exc).__name__})
        finally:
            self.done.set()


def run_checks(ctx: Context, checks: Sequence[Check]) -> list[CheckResult]:
    """Every check's verdict, in the order given, within max(timeout_s) of the start."""
    ctx.begin()
    slots = [_Slot(check) for check in checks]
    for slot in slots:
        threading.Thread(target=slot.run, args=(ctx,), name=f"doctor-{slot.check.id}", daemon=True).start()
    results = []
    for slot in slots:
        slot.done.wait(max(0.0, ctx.started + slot.check.timeout_s - time.monotonic()))
        finding = slot.finding if slot.done.is_set() else None
        if finding is None:
            finding = Finding("warn", f"did not finish within {slot.check.timeout_s:g} s",
                              "run `metralectl doctor` again; if this check always hangs, report it",
                              {"timed_out": True})
        results.append(CheckResult(slot.check.id, slot.check.title, finding.status, finding.detail,
                                   finding.remedy, dict(finding.data)))
    return results
