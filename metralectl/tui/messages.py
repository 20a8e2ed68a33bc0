"""Messages that carry worker results up to the views (the intent messages live with their widgets)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:
    from metralectl.doctor.model import CheckResult
    from metralectl.lifecycle.status import StatusReport
    from metralectl.tui.services import LibrarySnapshot, Outcome, Plan, RunDetail, RunSummary, SuiteInfo


class WorkerFailed(Message):
    """A worker's core call raised; the app turns it into a notification (or a modal)."""

    def __init__(self, where: str, error: BaseException) -> None:
        super().__init__()
        self.where = where
        self.error = error


class LibraryLoaded(Message):
    def __init__(self, snapshot: LibrarySnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class DetailLoaded(Message):
    def __init__(self, name: str, text: str) -> None:
        super().__init__()
        self.name = name
        self.text = text


class PlanReady(Message):
    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan


class ActionEvent(Message):
    """One core event of a running action (Step, Phase, Ready, LayerProgress, PullEvent, ...)."""

    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event


class LinesReady(Message):
    """Lines are waiting in a Coalescer; the receiver drains it."""


class ActionFinished(Message):
    def __init__(self, outcome: Outcome) -> None:
        super().__init__()
        self.outcome = outcome


class StatusLoaded(Message):
    def __init__(self, report: StatusReport) -> None:
        super().__init__()
        self.report = report


class TelemetryReady(Message):
    """TopViews are waiting in the telemetry Coalescer."""


class DoctorDone(Message):
    def __init__(self, results: list[CheckResult], elapsed_s: float) -> None:
        super().__init__()
        self.results = results
        self.elapsed_s = elapsed_s


class SuitesLoaded(Message):
    def __init__(self, suites: list[SuiteInfo], unavailable: str | None) -> None:
        super().__init__()
        self.suites = suites
        self.unavailable = unavailable


class HistoryLoaded(Message):
    def __init__(self, runs: list[RunSummary]) -> None:
        super().__init__()
        self.runs = runs


class RunDetailLoaded(Message):
    def __init__(self, details: list[RunDetail], into_results: bool = False) -> None:
        super().__init__()
        self.details = details
        self.into_results = into_results  # a run just finished: fill the results table, no modal


class ServedChanged(Message):
    """An action changed what is served: views refresh (posted to the app)."""


class BenchTick(Message):
    """Benchmark progress is waiting in the view's Coalescer (only the newest matters)."""


class BenchFinished(Message):
    def __init__(self, run: RunSummary | None, status: str, text: str, hint: str | None = None) -> None:
        super().__init__()
        self.run = run
        self.status = status  # done | failed | cancelled
        self.text = text
        self.hint = hint
