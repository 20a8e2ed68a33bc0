"""What the dashboard needs from the core, as one injectable object.

The App receives a `Services`; its workers call these (blocking) methods on threads and post the
results as messages. `CoreServices` (core_services.py) is the real thing — the same core calls the
CLI makes; tests pass fakes (tests/unit/tui_fakes.py). Widgets never see this object.

Values are the core's own where it has them (LibraryRow, StatusReport, CheckResult, TopView and
the lifecycle events); the few below exist only because a view needs two core values side by side.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from metralectl.doctor.model import CheckResult
    from metralectl.app.library import LibraryRow
    from metralectl.lifecycle.status import StatusReport
    from metralectl.telemetry.view import TopView
    from metralectl.cancel import CancelToken

Action = Literal["pull", "run", "swap", "stop"]
ACTIONS: tuple[Action, ...] = ("pull", "run", "swap", "stop")
OutcomeStatus = Literal["done", "failed", "cancelled"]
Listener = Callable[[Any], None]


@dataclass(frozen=True)
class LibraryItem:
    row: LibraryRow
    image_ref: str
    image_present: bool | None  # None: Docker not reachable, so unknown
    serving: bool = False  # a container of this recipe runs now
    blocked: str | None = None  # why r/w cannot go whatever serves (the launch's words); None: they may
    blocked_hint: str | None = None  # what to do about it (`p pulls it`, or the launch's own hint)


@dataclass(frozen=True)
class LibrarySnapshot:
    items: tuple[LibraryItem, ...]
    judged_on: str  # "fit judged on: gb10 (detected NVIDIA GB10)"
    notes: tuple[str, ...] = ()  # refused user recipes, Docker unreachable, ...


@dataclass(frozen=True)
class Plan:
    """What an action will do, shown for confirmation before anything happens."""

    action: Action
    recipe: str | None
    title: str
    steps: tuple[str, ...]
    command: str | None = None  # the rendered `docker run`
    warnings: tuple[str, ...] = ()
    blocked: str | None = None  # known refusal: the confirmation offers only "close"
    hint: str | None = None
    cancellable: bool = True


@dataclass(frozen=True)
class Outcome:
    action: Action
    recipe: str | None
    status: OutcomeStatus
    summary: str
    hint: str | None = None
    lines: tuple[str, ...] = ()  # e.g. the engine's last log lines of a failed start


class TelemetryFeed(Protocol):
    """GPU sampler + engine /metrics poller (telemetry.watch.TopSession behind it)."""

    interval_s: float

    def start(self) -> None: ...

    def view(self) -> TopView: ...

    def close(self) -> None: ...


# -- benchmarks -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParamSpec:
    name: str
    kind: str  # int | float | str | bool | int-list | float-list | choice
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None


@dataclass(frozen=True)
class SuiteInfo:
    id: str
    title: str
    description: str = ""
    params: tuple[ParamSpec, ...] = ()


@dataclass(frozen=True)
class BenchProgress:
    done: int
    total: int | None
    message: str = ""


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    suite: str
    started: float | None  # wall time
    source: str  # "tui" | "cli" | "?"
    target: str  # recipe or endpoint
    outcome: str  # "ok" | "failed" | "cancelled" | "pass" | "fail" ...
    headline: str  # the one number people quote
    path: str = ""
    engine: str = "-"  # the engine on record (`?`: the run could not tell; `-`: a record from before engines were named)


@dataclass(frozen=True)
class RunDetail:
    summary: RunSummary
    params: dict[str, Any] = field(default_factory=dict)
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    notes: tuple[str, ...] = ()


class BenchService(Protocol):
    @property
    def unavailable(self) -> str | None:
        """None when suites can be run; else why not (the History pane still works)."""

    def suites(self) -> list[SuiteInfo]: ...

    def check_params(self, suite: str, values: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        """(parsed parameters, {name: why refused}) for the form's raw text values."""

    def run(self, suite: str, params: dict[str, Any], on_event: Callable[[BenchProgress], None],
            cancel: CancelToken) -> RunSummary: ...

    def history(self, limit: int = 200) -> list[RunSummary]: ...

    def detail(self, run: RunSummary) -> RunDetail: ...


class Services(Protocol):
    @property
    def bench(self) -> BenchService: ...

    def now(self) -> float:
        """Wall-clock time for display (fixed in snapshot tests)."""

    def library(self) -> LibrarySnapshot: ...

    def detail(self, name: str) -> str:
        """The recipe as `metralectl show` prints it: provenance, memory breakdown, command."""

    def plan(self, action: Action, name: str | None) -> Plan: ...

    def perform(self, action: Action, name: str | None, on_event: Listener, cancel: CancelToken) -> Outcome:
        """Run the action, calling on_event with the core's events; Cancelled propagates."""

    def status(self) -> StatusReport: ...

    def follow_logs(self, container: str, stop: threading.Event) -> Iterator[str]: ...

    def telemetry(self) -> TelemetryFeed: ...

    def doctor(self) -> list[CheckResult]: ...
