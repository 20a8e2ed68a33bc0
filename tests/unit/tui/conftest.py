"""Dashboard tests: Pilot against fake core services (tests/unit/tui/fakes.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.unit.tui.fakes import FakeServices

pytest.importorskip("textual")


@pytest.fixture()
def services() -> FakeServices:
    return FakeServices()


async def until(pilot: object, predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Let the app run until predicate() is true (workers report asynchronously); fail after timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await pilot.pause(0.02)  # type: ignore[attr-defined]
