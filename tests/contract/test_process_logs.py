"""An engine's log as a host process, with real processes: bounded and rotated without losing a byte, whatever the
engine's pace and the machine's load; followed across rotations (and a follower that fell behind is told what it
missed); a killed log writer replaced with nothing lost, one that keeps ending not replaced forever; with the writer
and the supervisor both killed the engine runs on and `logs` says why its log stopped; a name keeps its last
launches' logs, the newest ones, whatever the clock. Every wait is for a state the test can see, never for a time
(docs/development.md, "Tests that hold on a busy box")."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.render import ContainerSpec
from metralectl.seams.process import group, logs, state, supervise
from metralectl.seams.process.runtime import ProcessRuntime
from tests.contract.test_process_runtime import LABELS, _spec, _until, unique

LINE = 78  # bytes of one chatter line (workload.py)
NUMBERED = re.compile(r"chatter (\d{8}) x{60}$")


def _chatter(count: int) -> bytes:
    """What the workload writes with --lines count: its first line, then the numbered ones."""
    return b"workload up\n" + b"".join(f"chatter {i:08d} {'x' * 60}\n".encode() for i in range(count))


def _folder(name: str) -> Path:
    return Path(os.environ["METRALE_HOME"]) / "logs" / "processes" / name


def _pieces(name: str) -> dict[str, int]:
    """The launch's log files: name -> piece number (0 for the current file)."""
    out = {}
    for path in _folder(name).iterdir():
        tail = path.name.split(".log", 1)[1]
        out[path.name] = int(tail[1:]) if tail else 0
    return out


def _numbers(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for m in map(NUMBERED.match, lines) if m]


def _without_notes(lines: list[str]) -> list[str]:
    """The engine's lines alone: our notes left out, and a line a note was written into joined again."""
    out: list[str] = []
    joining = False
    for line in lines:
        if line.startswith("metralectl:"):
            joining = bool(out) and out[-1].startswith("chatter ") and not NUMBERED.match(out[-1])
        elif joining:
            out[-1] += line
            joining = False
        else:
            out.append(line)
    return out


@pytest.fixture()
def runtimes() -> Any:
    made: list[ProcessRuntime] = []

    def make(**kwargs: int) -> ProcessRuntime:
        made.append(ProcessRuntime(**kwargs))
        return made[-1]

    yield make
    for rt in made:
        for info in rt.containers(managed_only=False):
            rt.remove(info.id, force=True)


def test_rotation_loses_no_byte_of_a_writer_faster_than_the_rotation(runtimes: Any) -> None:
    """1.5 MB as fast as the workload writes it through a 16 KiB bound: about a hundred rotations while it writes.
    Every rotated piece holds exactly the bound, so the two kept pieces must be the stream's bytes at exactly
    those offsets: one byte lost (or doubled) at any earlier rotation would shift them."""
    limit, count = 16 << 10, 20_000
    rt = runtimes(log_limit=limit)
    name = unique("fast")
    rt.create_and_start(_spec("--chatter", "8000,0.0005", "--lines", str(count), name=name))
    assert rt.wait_exit(name, 300) == 0
    stream = _chatter(count)
    rotations = (len(stream) - 1) // limit  # a file is rotated once it holds the bound and more comes
    files = _pieces(name)
    assert sorted(files.values()) == [0, rotations], files
    by_number = {number: (_folder(name) / file).read_bytes() for file, number in files.items()}
    assert by_number[rotations] == stream[(rotations - 1) * limit:rotations * limit]
    assert by_number[0] == stream[rotations * limit:]
    kept = (by_number[rotations] + by_number[0]).decode().splitlines()
    assert not by_number[rotations].endswith(b"\n")  # a line cut in two between the pieces...
    across = len(by_number[0].decode().splitlines()) + 2
    assert rt.log_tail(name, across) == kept[-across:] == stream.decode().splitlines()[-across:]  # ...joined
    assert rt.log_tail(name, 10_000) == kept  # all that is kept (its first line, cut, as it is)


def test_a_follower_reads_every_line_in_order_across_rotations(runtimes: Any) -> None:
    limit = 16 << 10
    rt = runtimes(log_limit=limit)
    name = unique("follow")
    rt.create_and_start(_spec("--chatter", "1000,0.05", name=name))
    followed: list[str] = []
    follower = threading.Thread(target=lambda: followed.extend(rt.follow_logs(name)), daemon=True)
    follower.start()
    _until(lambda: max(_pieces(name).values()) >= 4)
    sizes = {file: (_folder(name) / file).stat().st_size for file in _pieces(name)}
    assert all(size <= limit for size in sizes.values()), sizes
    tailed = rt.log_tail(name, 150)
    assert len(tailed) == 150 and len(_numbers(tailed[:-1])) == 149  # across the pieces (the last one may be in writing)
    rt.stop(name, timeout_s=30)
    follower.join(60)
    assert not follower.is_alive()
    numbers = _numbers(followed)
    assert numbers == list(range(len(numbers))) and len(numbers) * LINE > 4 * limit
    assert followed[0] == "workload up" and "SIGTERM seen, draining" in followed and followed[-1] == "drained"
    assert not [line for line in followed if line.startswith("metralectl:")]
    assert list(rt.follow_logs(name, tail=300)) == rt.log_tail(name, 300)  # it has ended: the tail, then done


def test_a_follower_that_fell_behind_is_told_how_many_pieces_it_missed(runtimes: Any) -> None:
    limit = 16 << 10
    rt = runtimes(log_limit=limit)
    name = unique("behind")
    rt.create_and_start(_spec("--chatter", "4000,0.02", name=name))
    stop = threading.Event()
    lines = rt.follow_logs(name, stop=stop)
    assert next(lines) == "workload up"  # it holds the first piece now, and reads no further until asked
    # the second piece has come and gone meanwhile (removed once the third is in place)
    _until(lambda: 2 not in (now := _pieces(name).values()) and max(now) >= 3)
    got: list[str] = []
    since_note = None
    for line in lines:
        got.append(line)
        if line.startswith("metralectl:"):
            since_note = 0
        elif since_note is not None and NUMBERED.match(line):
            since_note += 1
        if since_note is not None and since_note >= 50 or len(got) > 5_000:  # (none by then: a failure, not a hang)
            stop.set()
    notes = [line for line in got if line.startswith("metralectl:")]
    assert len(notes) == 1 and re.fullmatch(r"metralectl: (\d+) rotated pieces? of this log (was|were) gone before it "
                                            r"could be read \(this reader fell behind the engine's output\)", notes[0])
    skipped = int(notes[0].split()[1])
    at = got.index(notes[0])
    before, after = _numbers(got[:at]), _numbers(got[at + 1:])
    assert before == list(range(len(before))) and after == list(range(after[0], after[0] + len(after)))
    # what it missed is the pieces it was told of: `skipped` pieces of exactly the bound (give or take a cut line)
    assert abs((after[0] - before[-1] - 1) * LINE - skipped * limit) <= 2 * LINE


def test_a_killed_log_writer_is_replaced_and_nothing_is_lost(runtimes: Any) -> None:
    rt = runtimes()
    name = unique("writer")
    rt.create_and_start(_spec("--chatter", "2000,0.01", name=name))
    _until(lambda: len(_numbers(rt.log_tail(name, 200))) >= 100)
    first = state.read(name)["logger"]  # type: ignore[index]
    os.kill(first["pid"], signal.SIGKILL)
    second = _until(lambda: (now := state.read(name)["logger"]) != first and now)  # type: ignore[index]
    assert group.is_running(second) and not group.is_running(first)
    _until(lambda: _numbers(rt.log_tail(name, 1)))  # lines again, after the note
    rt.stop(name, timeout_s=30)
    everything = rt.log_tail(name, 1_000_000)
    notes = [line for line in everything if line.startswith("metralectl:")]
    assert notes == [f"metralectl: the log writer (pid {first['pid']}) ended (signal 9); pid {second['pid']} "
                     "carries on: nothing was lost"], notes
    numbers = _numbers(_without_notes(everything))
    after = everything.index(notes[0])
    assert numbers == list(range(len(numbers))) and _numbers(everything[after:])  # none lost, some after the note
    assert everything[-1] == "drained"


def test_with_its_writer_and_supervisor_killed_the_engine_runs_on_and_logs_says_why_the_log_stopped(
        runtimes: Any, tmp_path: Path) -> None:
    """The engine (a shell loop) writes into a pipe nobody reads any more: its writes fail, and with SIGPIPE
    ignored it runs on. It counts its writes in a file, so the test sees it write on after both are gone."""
    rt = runtimes()
    name = unique("deaf")
    count = tmp_path / "count"
    loop = f'n=0; while :; do n=$((n+1)); echo "tick $n"; echo $n > {count}; sleep 0.02; done'
    rt.create_and_start(ContainerSpec(name=name, image="process:/bin/sh", command=("/bin/sh", "-c", loop, name),
                                      labels=LABELS))
    _until(lambda: "tick 3" in rt.log_tail(name, 10))
    recorded = state.read(name)
    assert recorded is not None
    for who in ("supervisor", "logger"):
        os.kill(recorded[who]["pid"], signal.SIGKILL)
        _until(lambda who=who: not group.is_running(recorded[who]))
    written = int(count.read_text() or 0)
    _until(lambda: int(count.read_text() or 0) >= written + 5)  # it wrote on into the pipe, and lives
    info = rt.inspect(name)
    assert info is not None and info.running
    said = ("metralectl: the log stops here: its writer (pid {}) and the launch's supervisor were killed, so what the "
            "engine writes from now on is lost; the engine still runs, and stopping it still works"
            ).format(recorded["logger"]["pid"])
    assert rt.log_tail(name, 5)[-1] == said
    stop = threading.Event()
    followed = []
    for line in rt.follow_logs(name, tail=1, stop=stop):
        followed.append(line)
        if line == said:
            stop.set()
    assert followed[-1] == said and len(followed) == 2
    rt.stop(name, timeout_s=30)
    after = rt.inspect(name)
    assert after is not None and after.status == "exited" and after.exit_code is None
    assert said not in rt.log_tail(name, 5)  # it has ended: nothing more to say about its log


def test_a_log_writer_that_keeps_ending_is_not_started_again_and_again(runtimes: Any, tmp_path: Path) -> None:
    """Each killed writer is replaced, up to the launch's WRITERS; then the supervisor lets go of the pipe and says
    so, and the engine runs on, its writes failing (a pipe that nobody reads must not stop the engine)."""
    rt = runtimes()
    name = unique("writers")
    count = tmp_path / "count"
    loop = f'n=0; while :; do n=$((n+1)); echo "tick $n"; echo $n > {count}; sleep 0.02; done'
    rt.create_and_start(ContainerSpec(name=name, image="process:/bin/sh", command=("/bin/sh", "-c", loop, name),
                                      labels=LABELS))
    _until(lambda: "tick 3" in rt.log_tail(name, 10))
    for _ in range(supervise.WRITERS - 1):
        killed = state.read(name)["logger"]  # type: ignore[index]
        os.kill(killed["pid"], signal.SIGKILL)
        _until(lambda killed=killed: state.read(name)["logger"] != killed)  # type: ignore[index]
    last = state.read(name)["logger"]  # type: ignore[index]
    os.kill(last["pid"], signal.SIGKILL)
    said = (f"metralectl: the log writer (pid {last['pid']}) ended (signal 9), the {supervise.WRITERS}th to end: no "
            "other is started, and the engine's output from here on is lost (the engine runs on)")
    _until(lambda: said in rt.log_tail(name, 5))
    written = int(count.read_text() or 0)
    _until(lambda: int(count.read_text() or 0) >= written + 5)
    assert rt.inspect(name).running  # type: ignore[union-attr]
    log = rt.log_tail(name, 1_000)
    assert len([line for line in log if line.startswith("metralectl:")]) == supervise.WRITERS
    assert log[-1] == said and state.read(name)["logger"] == last  # type: ignore[index]
    rt.stop(name, timeout_s=30)
    assert rt.inspect(name).exit_code == 143  # type: ignore[union-attr]


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


def test_a_name_keeps_its_last_launches_logs_through_the_runtime(runtimes: Any) -> None:
    rt = runtimes(keep_logs=2)
    name = unique("launches")
    ids = []
    for _ in range(3):
        rt.create_and_start(_spec("--exit", "0", name=name))
        ids.append(state.read(name)["launch"])  # type: ignore[index]
        assert rt.wait_exit(name, 60) == 0
        rt.remove(name)
    assert {path.name.split(".log")[0] for path in _folder(name).iterdir()} == set(ids[-2:])


def test_the_supervisor_names_its_launch_on_its_command_line(runtimes: Any) -> None:
    rt = runtimes()
    name = unique("argv")
    rt.create_and_start(_spec(name=name))
    recorded = state.read(name)
    assert recorded is not None
    for who in ("supervisor", "logger"):
        argv = Path(f"/proc/{recorded[who]['pid']}/cmdline").read_bytes().split(b"\0")[:-1]
        assert argv == [sys.executable.encode(), b"-m", b"metralectl.seams.process.supervise", name.encode()], who
