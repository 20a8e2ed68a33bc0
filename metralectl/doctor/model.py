"""What a check produces: values, never output. The CLI renders them, `--json` prints them, the agent and
the TUI reuse them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from metralectl.errors import ExitCode

if TYPE_CHECKING:
    from metralectl.doctor.context import Context

Status = Literal["ok", "warn", "problem", "skipped"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "problem", "skipped")


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict. `remedy` is what to type or do; `data` holds the facts behind the verdict
    (JSON-ready: str, int, float, bool, None, lists and dicts of those)."""

    id: str
    title: str
    status: Status
    detail: str
    remedy: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status, "detail": self.detail,
                "remedy": self.remedy, "data": self.data}


@dataclass(frozen=True)
class Finding:
    """What a check function returns; the runner adds the check's id and title."""

    status: Status
    detail: str
    remedy: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


def ok(detail: str, remedy: str | None = None, /, **data: Any) -> Finding:
    return Finding("ok", detail, remedy, data)


def warn(detail: str, remedy: str | None = None, /, **data: Any) -> Finding:
    return Finding("warn", detail, remedy, data)


def problem(detail: str, remedy: str | None = None, /, **data: Any) -> Finding:
    return Finding("problem", detail, remedy, data)


def skipped(detail: str, remedy: str | None = None, /, **data: Any) -> Finding:
    return Finding("skipped", detail, remedy, data)


@dataclass(frozen=True)
class Check:
    """A check is data: an id, a title, the function that judges, and how long it may take.

    `timeout_s` counts from the start of the whole run (all checks run at once), so it is also the
    latest moment this check's verdict can arrive. `general` checks are dropped when `--recipe`
    narrows the run to what one recipe needs.
    """

    id: str
    title: str
    fn: Callable[[Context], Finding]
    timeout_s: float = 2.8
    general: bool = False


def has_problem(results: list[CheckResult]) -> bool:
    """The exit-code rule: non-zero if and only if a check found a problem."""
    return any(r.status == "problem" for r in results)


def exit_code(results: list[CheckResult]) -> ExitCode:
    return ExitCode.FAILED if has_problem(results) else ExitCode.OK


def counts(results: list[CheckResult]) -> dict[str, int]:
    return {s: sum(1 for r in results if r.status == s) for s in STATUSES}
