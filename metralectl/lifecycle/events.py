"""What the lifecycle reports while it works. The CLI renders these on stderr; the TUI posts them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    pass


@dataclass(frozen=True)
class Step(Event):
    """A preflight or orchestration step (checking, pulling, draining, stopping, ...)."""

    name: str
    detail: str = ""


@dataclass(frozen=True)
class Warning_(Event):
    message: str


@dataclass(frozen=True)
class Transfer(Event):
    """Staging progress: an image layer (images.LayerProgress) or weights (weights.PullEvent)."""

    kind: str  # "image" | "weights"
    progress: Any


@dataclass(frozen=True)
class ContainerStarted(Event):
    name: str
    container_id: str
    run_id: str


@dataclass(frozen=True)
class Phase(Event):
    """An engine boot phase seen in its log (loading, capturing-graphs, ready)."""

    phase: str
    line: str
    elapsed_s: float
    rank: int | None = None  # which rank's log, in a multi-rank launch


@dataclass(frozen=True)
class LogLine(Event):
    line: str
    rank: int | None = None  # which rank's log, in a multi-rank launch


@dataclass(frozen=True)
class Ready(Event):
    url: str
    model: str | None
    elapsed_s: float


@dataclass(frozen=True)
class Failed(Event):
    cause: str
    message: str
    remedy: str
    last_lines: tuple[str, ...] = field(default_factory=tuple)


Listener = Callable[[Event], None]


def ignore(_: Event) -> None:
    pass
