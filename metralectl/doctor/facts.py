"""A fact doctor's checks share: computed once, in its own daemon thread, waited for until an absolute deadline.

A check that needs one gets the value, the error computing it raised, or `Unanswered` once the deadline
(counted from the start of the run) has passed, so a hung daemon or driver never hangs doctor. Also
the values two of them carry (the GPUs as NVML saw them, our containers' PIDs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Unanswered(Exception):
    """A fact did not arrive before its deadline."""

    def __init__(self, name: str, budget_s: float) -> None:
        super().__init__(f"{name} did not answer within {budget_s:g} s")
        self.name = name
        self.budget_s = budget_s


@dataclass(frozen=True)
class GpuFacts:
    system: Any  # GpuSystem | GpuUnavailable (metralectl.core.gpudata)
    samples: tuple[Any, ...] = ()  # GpuSample per GPU, taken right after opening


@dataclass(frozen=True)
class ContainerPids:
    """Running labelled (metralectl's) containers, and which host PIDs belong to which."""

    names: dict[str, str] = field(default_factory=dict)  # container id -> name
    pid_to_container: dict[int, str] = field(default_factory=dict)  # host pid -> container name


class Fact(Generic[T]):
    """A value computed once, in its own daemon thread, that callers wait for until an absolute deadline."""

    def __init__(self, name: str, compute: Callable[[], T], deadline: float, budget_s: float) -> None:
        self.name = name
        self.budget_s = budget_s
        self._deadline = deadline
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(compute,), name=f"doctor-fact-{name}", daemon=True).start()

    def settled(self) -> T | None:
        """The value, when it was computed without error by now; else None (still running, or failed)."""
        return self._value if self._done.is_set() and self._error is None else None

    def _run(self, compute: Callable[[], T]) -> None:
        try:
            self._value = compute()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks, who judges it
            self._error = exc
        finally:
            self._done.set()

    def get(self) -> T:
        if not self._done.wait(max(0.0, self._deadline - time.monotonic())):
            raise Unanswered(self.name, self.budget_s)
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
