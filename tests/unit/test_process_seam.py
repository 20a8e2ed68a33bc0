"""seams/hostproc (imported as seams.process by its callers): the two pid questions and what each caller asks; SIGTERM as Ctrl-C for a `with` block;
the agent's stop signals. Real signals to this very process (pytest runs tests on the main thread)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from metralectl.seams import hostproc
from metralectl.seams.process import on_stop_signals, pid_alive, pid_is_ours, sigterm_as_interrupt


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names no process now
    return child.pid


@pytest.fixture
def foreign_pid(monkeypatch: pytest.MonkeyPatch) -> int:
    """A pid that exists but is another user's: kill(pid, 0) answers EPERM (faked: tests run as one user)."""
    pid = 424242
    real_kill = os.kill

    def kill(target: int, sig: int) -> None:
        if target == pid and sig == 0:
            raise PermissionError(1, "Operation not permitted")
        real_kill(target, sig)

    monkeypatch.setattr(os, "kill", kill)
    return pid


def test_this_process_is_alive_and_ours() -> None:
    assert pid_alive(os.getpid()) and pid_is_ours(os.getpid())


def test_a_dead_pid_is_neither() -> None:
    pid = dead_pid()
    assert not pid_alive(pid) and not pid_is_ours(pid)


def test_another_users_process_is_alive_but_not_ours(foreign_pid: int) -> None:
    assert pid_alive(foreign_pid)
    assert not pid_is_ours(foreign_pid)


@pytest.mark.parametrize("pid", [None, 0, -1])
def test_no_pid_and_group_addresses_are_never_a_process(pid: int | None) -> None:
    assert not pid_alive(pid) and not pid_is_ours(pid)  # kill(0, 0) would ask about our own group


def _write_agent_state(pid: int) -> None:
    from metralectl.seams.agent_files import state_path, token_path

    state_path().parent.mkdir(parents=True, exist_ok=True)
    state_path().write_text(json.dumps({"pid": pid, "api_port": 8897}))
    token_path().write_text("t" * 43 + "\n")
    token_path().chmod(0o600)


def test_a_stale_agent_json_whose_pid_is_another_users_is_no_agent(foreign_pid: int) -> None:
    """Issue 19 item 4: the CLI must not send its bearer token to whatever now has the old agent's pid."""
    from metralectl.app.agent_client import running_agent
    from metralectl.seams.agent_files import read_state

    _write_agent_state(foreign_pid)
    assert read_state() is None
    assert running_agent() is None
    _write_agent_state(os.getpid())  # the same file naming a live process of ours is an agent
    assert read_state() is not None and running_agent() is not None


def test_the_agent_client_calls_a_foreign_pid_gone(foreign_pid: int) -> None:
    from metralectl.app.agent_client import AgentClient, AgentGone
    from metralectl.seams.httpclient import Failed

    refused = Failed("ConnectionRefusedError", "refused")  # what the one HTTP client raises when nothing answers
    assert isinstance(AgentClient(1, "t" * 43, foreign_pid)._unreachable(refused), AgentGone)
    assert not isinstance(AgentClient(1, "t" * 43, os.getpid())._unreachable(refused), AgentGone)


def test_a_run_record_of_another_users_live_process_stays_running(foreign_pid: int) -> None:
    """The opposite choice for records: a live writer under another account is not 'interrupted' (and
    `repair` must never rewrite a live run's record)."""
    from metralectl.bench import records

    directory = records.start("decode", "r-foreign", {"started_at": "2026-12-01T00:00:00+00:00"})
    records.save(directory, {**(records.load(directory) or {}), "pid": foreign_pid})
    assert (records.repair(directory) or {}).get("status") == "running"
    records.save(directory, {**(records.load(directory) or {}), "pid": dead_pid()})
    assert (records.repair(directory) or {}).get("status") == "interrupted"
    assert json.loads((directory / "run.json").read_text())["status"] == "interrupted"


# -- signals ------------------------------------------------------------------------------------------
def _deliver(sig: signal.Signals, until: Callable[[], object] = lambda: False) -> None:
    os.kill(os.getpid(), sig)
    for _ in range(500):  # the handler runs at the next bytecode boundary of the main thread
        if until():
            return
        time.sleep(0.01)


def test_sigterm_raises_keyboardinterrupt_inside_and_the_old_handler_is_back() -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigterm_as_interrupt() as installed:
                assert installed
                _deliver(signal.SIGTERM)
        assert calls == []  # ours ran, not the outer one
        _deliver(signal.SIGTERM, until=lambda: calls)  # after the block: the outer handler again
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_handler_is_restored_after_a_normal_exit_too() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_as_interrupt():
        assert signal.getsignal(signal.SIGTERM) is hostproc._raise_interrupt
    assert signal.getsignal(signal.SIGTERM) is before


def test_off_the_main_thread_it_installs_nothing_and_says_so() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def worker() -> None:
        with sigterm_as_interrupt() as installed:
            seen.append(installed)
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [False, before]


def test_stop_signals_call_back_instead_of_interrupting() -> None:
    stops: list[str] = []
    before_int, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with on_stop_signals(lambda: stops.append("stop")):
        _deliver(signal.SIGINT, until=lambda: len(stops) == 1)  # no KeyboardInterrupt: a graceful stop
        _deliver(signal.SIGTERM, until=lambda: len(stops) == 2)
    assert stops == ["stop", "stop"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == (before_int, before_term)


def test_a_cli_command_cleans_up_on_sigterm(tmp_path: Path) -> None:
    """End to end in a child process: the until-exit form turns `kill` into the Ctrl-C path (exit 130 from
    the KeyboardInterrupt, its `finally` ran), where the default would have died silently (-15)."""
    done = tmp_path / "cleaned"
    code = ("import os, signal, sys, time\n"
            "from metralectl.seams.process import sigterm_as_interrupt_until_exit\n"
            "sigterm_as_interrupt_until_exit()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(5)\n"
            "except KeyboardInterrupt:\n"
            f"    open({str(done)!r}, 'w').write('yes')\n"
            "    sys.exit(130)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert result.returncode == 130 and done.read_text() == "yes"
