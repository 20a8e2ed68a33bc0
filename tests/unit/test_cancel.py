"""Cooperative cancellation (metralectl/cancel.py): the token, its checks and waits, and the rule that no code
pushes an exception into another thread (ctypes' PyThreadState_SetAsyncExc) anywhere in the package."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import pytest

from metralectl import cancel
from metralectl.cancel import Cancelled, CancelToken

PACKAGE = Path(__file__).resolve().parents[2] / "metralectl"
FORBIDDEN = re.compile(r"PyThreadState_SetAsyncExc|\bpythonapi\b")


def forbidden_uses(root: Path) -> list[str]:
    """Every line under root that names PyThreadState_SetAsyncExc or ctypes.pythonapi, as path:line."""
    return [f"{path.relative_to(root.parent)}:{n}" for path in sorted(root.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if FORBIDDEN.search(line)]


def test_no_exception_is_pushed_into_a_thread_anywhere_in_the_package() -> None:
    found = forbidden_uses(PACKAGE)
    assert found == [], ("cancel cooperatively (metralectl/cancel.py: a token checked at phase boundaries and in "
                         f"waits), never by injecting an exception into a thread: {found}")


def test_the_rule_finds_what_it_forbids(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text("import ctypes\nctypes.pythonapi.PyThreadState_SetAsyncExc(1, None)\n")
    (root / "b.py").write_text("import ctypes\napi = ctypes.pythonapi\n")
    (root / "c.py").write_text("x = 'no thread state here'\n")
    assert forbidden_uses(root) == ["pkg/a.py:2", "pkg/b.py:2"]


def test_a_cancelled_check_raises_once_a_keyboard_interrupt_with_the_reason() -> None:
    token = CancelToken()
    token.check()  # not cancelled: nothing
    assert token.cancel("cancelled by a client") and not token.cancel("again")  # the first reason stays
    with pytest.raises(Cancelled) as raised:
        token.check()
    assert isinstance(raised.value, KeyboardInterrupt)  # so every cleanup written for Ctrl-C runs
    assert raised.value.reason == "cancelled by a client" and token.raised
    token.check()  # the cleanup after it passes further checks untouched


def test_checkpoint_sees_the_token_bound_to_this_thread_only() -> None:
    token = CancelToken()
    cancel.checkpoint()  # nothing bound (the CLI): nothing to check
    token.cancel()
    seen: list[object] = []
    other = threading.Thread(target=lambda: (cancel.checkpoint(), seen.append(cancel.current())))
    with token.bound():
        other.start()
        other.join(5)
        assert cancel.current() is token
        with pytest.raises(Cancelled):
            cancel.checkpoint()
    assert seen == [None] and cancel.current() is None  # another thread, and after the block: not bound


def test_a_sleep_ends_at_the_cancel_and_a_cleanups_sleep_is_whole() -> None:
    token = CancelToken()
    threading.Timer(0.1, token.cancel).start()
    started = time.monotonic()
    with token.bound(), pytest.raises(Cancelled):
        cancel.sleep(30)
    assert time.monotonic() - started < 20  # at the cancel, not the 30 s sleep's end
    started = time.monotonic()
    with token.bound():
        cancel.sleep(0.2)  # after the Cancelled: the cleanup's own wait keeps its length
    assert time.monotonic() - started >= 0.19
    started = time.monotonic()
    cancel.sleep(0.05)  # nothing bound: time.sleep
    assert time.monotonic() - started >= 0.045


def test_asyncio_tasks_see_the_token_of_the_thread_that_runs_them() -> None:
    token = CancelToken()

    async def inner() -> CancelToken | None:
        return cancel.current()

    with token.bound():
        assert asyncio.run(inner()) is token


def test_a_cancel_that_lands_inside_a_check_does_not_deadlock() -> None:
    """The CLI's Ctrl-C handler cancels the token on the main thread, between any two bytecodes: possibly while
    that same thread is inside check(), holding the token's lock."""
    token = CancelToken()
    done = threading.Event()

    def signal_lands_mid_check() -> None:
        with token._lock:  # where check() is when the handler runs
            token.cancel("interrupted")
        done.set()

    threading.Thread(target=signal_lands_mid_check, daemon=True).start()
    assert done.wait(2), "cancel() waited for a lock its own thread held"
    assert token.cancelled and token.reason == "interrupted"
