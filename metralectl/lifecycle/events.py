"""What the lifecycle reports while it works. The CLI renders these on stderr; the TUI posts them; the agent
numbers them in its job log (to_json) for its page."""

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
    """An engine boot phase (engine/metrale.yaml log-phases: kernel-select, loading, kv-sizing, ready, ...;
    "ready" from /health when the engine prints no ready line)."""

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


# -- JSON: the agent's job log, numbered events its page follows (docs/agent.md, Events) ---------------------
# {"kind": CLASS (Warning_ is "Warning"), **fields}; Transfer is {"kind": "Transfer", "transfer": "image" |
# "weights", "progress": {the LayerProgress / PullEvent fields}} (its own `kind` field would collide).
def to_json(event: Any) -> dict[str, Any]:
    """A JSON-ready dict for any lifecycle event (anything else: {"kind": its type, "text": str(it)})."""
    from dataclasses import asdict, is_dataclass

    if isinstance(event, Transfer):
        progress = event.progress
        plain = is_dataclass(progress) and not isinstance(progress, type)
        body = asdict(progress) if plain else {"text": str(progress)}
        return {"kind": "Transfer", "transfer": event.kind, "progress": body}
    kind = type(event).__name__.rstrip("_")
    if isinstance(event, Event):
        return {"kind": kind, **asdict(event)}
    return {"kind": kind, "text": str(event)}
