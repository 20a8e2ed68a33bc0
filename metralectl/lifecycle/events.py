"""What the lifecycle reports while it works. The CLI renders these on stderr; the TUI posts them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metralectl.core.images import LayerProgress
    from metralectl.seams.hf.steps import PullEvent


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


# -- JSON: how the agent hands events to the CLI and the dashboard ------------------------------------
# {"kind": CLASS (Warning_ is "Warning"), **fields}; Transfer is {"kind": "Transfer", "transfer": "image" |
# "weights", "progress": {the LayerProgress / PullEvent fields}} (its own `kind` field would collide).
EVENT_CLASSES: dict[str, type[Event]] = {cls.__name__.rstrip("_"): cls for cls in (
    Step, Warning_, Transfer, ContainerStarted, Phase, LogLine, Ready, Failed)}


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


def _progress(kind: str, body: object) -> LayerProgress | PullEvent:
    from dataclasses import fields

    cls: type[LayerProgress] | type[PullEvent]
    if kind == "image":  # images and weights are light at import (their seams are imported inside functions)
        from metralectl.core.images import LayerProgress

        cls = LayerProgress
    elif kind == "weights":
        from metralectl.seams.hf.steps import PullEvent

        cls = PullEvent
    else:
        raise ValueError(f"unknown transfer kind {kind!r}")
    if not isinstance(body, dict):
        raise ValueError(f"a {kind} transfer without its progress")
    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in body.items() if k in names})
    except TypeError as exc:
        raise ValueError(f"a {kind} transfer's progress does not fit: {exc}") from None


def from_json(data: dict[str, Any]) -> Event:
    """The typed event back from to_json's dict; ValueError for a kind or shape this version does not know.

    Keys this version does not know (seq, t, fields of a newer agent) are ignored."""
    cls = EVENT_CLASSES.get(str(data.get("kind")))
    if cls is None:
        raise ValueError(f"unknown event kind {data.get('kind')!r}")
    if cls is Transfer:
        kind = str(data.get("transfer"))
        return Transfer(kind, _progress(kind, data.get("progress")))
    from dataclasses import fields

    names = {f.name for f in fields(cls)}
    values = {k: v for k, v in data.items() if k in names}
    if cls is Failed:
        values["last_lines"] = tuple(values.get("last_lines") or ())
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"a {cls.__name__} event that does not fit: {exc}") from None
