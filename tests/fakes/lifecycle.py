"""What the launch and swap tests share: a catalog recipe moved to a port the test owns (tests.ports.own_port),
a recording listener that can press Ctrl-C, or cancel a token, on a chosen event, and the event sequence in a
form a test can compare."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from metralectl.cancel import CancelToken
from metralectl.core.catalog import Catalog
from metralectl.core.overrides import apply_sets
from metralectl.core.recipe import Recipe
from metralectl.lifecycle.events import (ContainerStarted, Event, Failed, LogLine, Phase, Ready, Step, Transfer,
                                         Warning_)
from metralectl.lifecycle.launch import port_free
from tests.fakes.runtime import FakeRuntime, image

E = TypeVar("E", bound=Event)
GB10_IMAGE = "metrale/metrale-inference-gb10:latest"  # the image of the gb10 recipes used here (linux/arm64)


def on_port(catalog: Catalog, name: str, port: int) -> tuple[Recipe, list[str]]:
    """The shipped recipe with its port moved to `port` (as `--set resources.port=N` does)."""
    sets = [f"resources.port={port}"]
    return apply_sets(catalog, catalog.recipe(name), sets), sets


def gb10_runtime() -> FakeRuntime:
    return FakeRuntime(images=[image(GB10_IMAGE, "linux/arm64")])


@dataclass
class Recorder:
    """The listener: keeps every event; raises KeyboardInterrupt (Ctrl-C) at the first event `interrupt_on` accepts,
    or cancels `token` there (`cancel_on`: it raises nothing itself; the lifecycle's next check of the token does)."""

    interrupt_on: Callable[[Event], bool] | None = None
    events: list[Event] = field(default_factory=list)
    interrupted: Event | None = None
    cancel_on: Callable[[Event], bool] | None = None
    token: CancelToken = field(default_factory=CancelToken)

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if self.interrupted is not None:
            return
        if self.interrupt_on is not None and self.interrupt_on(event):
            self.interrupted = event
            raise KeyboardInterrupt
        if self.cancel_on is not None and self.cancel_on(event):
            self.interrupted = event
            self.token.cancel("cancelled by the test")

    def marks(self) -> list[str]:
        """The events as short marks, log lines and /health answers left out (how many arrive depends on timing)."""
        out = []
        for e in self.events:
            if isinstance(e, LogLine) or (isinstance(e, Step) and e.name == "health") or isinstance(e, Transfer):
                continue
            if isinstance(e, Step):
                out.append(f"step:{e.name}")
            elif isinstance(e, Phase):
                out.append(f"phase:{e.phase}")
            elif isinstance(e, ContainerStarted):
                out.append(f"started:{e.name}")
            elif isinstance(e, Ready):
                out.append("ready")
            elif isinstance(e, Failed):
                out.append(f"failed:{e.cause}")
            elif isinstance(e, Warning_):
                out.append("warning")
        return out

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


def in_order(marks: list[str], expected: list[str]) -> bool:
    """Whether `expected` occurs in `marks` in this order (other marks may come between)."""
    rest = iter(marks)
    return all(any(m == want for m in rest) for want in expected)


def port_released(port: int) -> bool:
    return port_free("127.0.0.1", port)
