"""A running action's progress as values: the core's events in, lines and a bar out. Pure.

The ProgressScreen renders this; the same events the CLI prints on stderr (lifecycle Step, Phase,
Ready, Failed, Warning_; image LayerProgress; weights PullEvent) become steps with a state mark,
boot phases with their time, and one progress bar for bytes (weights) or layers (image).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metralectl.wording import count

DONE, ACTIVE, WARN, FAIL = "✔", "▸", "!", "✘"


@dataclass
class Line:
    mark: str
    text: str


@dataclass
class Bar:
    label: str
    done: float
    total: float | None
    detail: str = ""


@dataclass
class ProgressModel:
    lines: list[Line] = field(default_factory=list)
    bar: Bar | None = None
    phase: str | None = None
    layers: dict[str, tuple[str, int | None, int | None]] = field(default_factory=dict)
    ready_url: str | None = None
    failed: bool = False

    def _advance(self, mark: str, text: str) -> None:
        for line in self.lines:
            if line.mark == ACTIVE:
                line.mark = DONE
        self.lines.append(Line(mark, text))

    def apply(self, event: Any) -> bool:
        """Take one event; True when what is shown changed."""
        kind = type(event).__name__
        if kind == "Step":
            self._advance(ACTIVE, f"{event.name:<10} {event.detail}".rstrip())
        elif kind == "ContainerStarted":
            self._advance(ACTIVE, f"{'started':<10} {event.name} (run {event.run_id})")
        elif kind == "Phase":
            self.phase = event.phase
            self._advance(ACTIVE, f"{event.phase:<10} {event.line.strip()[:80]}  [{event.elapsed_s:.1f} s]")
        elif kind == "Ready":
            self.ready_url = event.url
            self._advance(DONE, f"ready in {event.elapsed_s:.1f} s at {event.url}")
        elif kind == "Failed":
            self.failed = True
            self._advance(FAIL, f"failed ({event.cause}): {event.message}")
        elif kind == "Warning_":
            self.lines.append(Line(WARN, event.message))
        elif kind == "LayerProgress":
            return self._layer(event)
        elif kind == "PullEvent":
            return self._weights(event)
        else:
            return False
        return True

    def _layer(self, e: Any) -> bool:
        if e.layer is None:
            self._advance(ACTIVE, f"image      {e.ref}: {e.status}")
            return True
        self.layers[e.layer] = (e.status, e.current, e.total)
        finished = sum(1 for s, _, _ in self.layers.values() if s in ("Pull complete", "Already exists"))
        done = sum((c or 0) for s, c, t in self.layers.values() if s == "Downloading")
        total = sum((t or 0) for s, c, t in self.layers.values() if s == "Downloading")
        self.bar = Bar(f"image {e.ref}", finished, len(self.layers),
                       f"{finished}/{count(len(self.layers), 'layer')}" + (f", {_bytes(done)}/{_bytes(total)} downloading"
                                                                   if total else ""))
        return True

    def _weights(self, e: Any) -> bool:
        if e.phase in ("note", "resolve"):
            self._advance(ACTIVE, f"weights    {e.repo}: {e.message}")
            return True
        label = {"download": "downloading", "verify": "verifying", "done": "verified"}.get(e.phase, e.phase)
        rate = f" {_bytes(e.rate_bps)}/s" if e.rate_bps and e.phase != "done" else ""
        eta = f" ETA {_duration(e.eta_s)}" if e.eta_s is not None and e.phase != "done" else ""
        self.bar = Bar(f"{e.repo} {label}", e.done, e.total or None,
                       f"{_bytes(e.done)}/{_bytes(e.total)}{rate}{eta} · {e.files_done}/{count(e.files_total, 'file')}")
        if e.phase == "done":
            self._advance(DONE, f"weights    {e.repo}: {e.message or 'verified'}")
        return True


def _bytes(n: float | None) -> str:
    from metralectl.core.progress import human_bytes

    return human_bytes(n)


def _duration(s: float | None) -> str:
    from metralectl.core.progress import human_duration

    return human_duration(s)
