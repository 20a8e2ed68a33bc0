"""An engine's log as a host process: a name keeps its last launches' logs, the newest ones, whatever the clock."""

from __future__ import annotations

from pathlib import Path

from metralectl.seams.process import logs, state


def test_a_name_keeps_its_last_launches_logs_the_newest_ones(tmp_path: Path) -> None:
    """Launch ids sort as they were made, to the nanosecond: ids made within one second used to sort by their random
    suffix, and "keep the last two" kept the wrong ones (or the new launch's own file went)."""
    made = [state.new_launch_id() for _ in range(200)]
    assert made == sorted(made) and len(set(made)) == len(made)
    store = logs.logs_dir()
    launches: list[str] = []
    for _ in range(6):
        launches.append(state.new_launch_id())
        logs.prepare("metralectl-pr-keep", launches[-1], keep=2, store=store)
        kept = {entry.split(".log")[0] for entry in store.listdir("metralectl-pr-keep")}
        assert kept == set(launches[-2:]), (kept, launches)
    # a launch whose id sorts first (the clock was set back) keeps its own log, and the newest other one
    logs.prepare("metralectl-pr-keep", "20000101T000000000000000-00000000", keep=2, store=store)
    kept = {entry.split(".log")[0] for entry in store.listdir("metralectl-pr-keep")}
    assert kept == {"20000101T000000000000000-00000000", launches[-1]}
