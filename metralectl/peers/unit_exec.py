"""Run a remote unit as `metralectl bench run` in a child process (the operator's own command line).

A child, not a thread: the load generator's timing never competes with the agent's threads for one
interpreter, Ctrl-C semantics (SIGINT -> the record is written as interrupted) are the CLI's own, and
a crash in a unit cannot take the agent down. The child signs its record with this node's key
(METRALECTL_CONFIG_DIR) and names the unit in it (`--unit`), and reports its progress as JSON lines
on an inherited pipe (`--events-fd`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metralectl.errors import ExitCode
from metralectl.peers.units import Emit, ExecOutcome, Unit

KILL_AFTER_S = 30.0  # SIGINT first (the record is written as interrupted), SIGKILL if it does not stop


class SubprocessExecutor:
    def __init__(self, base: Path, home: Path, endpoint: Callable[[], str | None] = lambda: None,
                 python: str = sys.executable) -> None:
        self.base = base  # the node's config dir: its identity signs the record
        self.home = home  # METRALE_HOME: where the record lands
        self.endpoint = endpoint  # bench.yaml's endpoint, or None: what metralectl serves here
        self.python = python

    def command(self, unit: Unit, events_fd: int) -> list[str]:
        spec = unit.spec
        argv = [self.python, "-m", "metralectl", "bench", "run", spec.suite]
        for pair in spec.param_pairs():
            argv += ["--param", pair]
        for gate in spec.gates:
            argv += ["--gate", gate]
        url = self.endpoint()
        if url:
            argv += ["--url", url]
        if spec.recipe:
            argv += ["--recipe", spec.recipe]
        unit_label = {"key": spec.key, "requester": unit.requester, "digest": spec.digest, "campaign": spec.campaign}
        return argv + ["--format", "json", "--source", f"peer:{unit.requester}",
                       "--unit", json.dumps(unit_label, sort_keys=True), "--events-fd", str(events_fd)]

    def run(self, unit: Unit, emit: Emit, cancel: threading.Event) -> ExecOutcome:
        read_fd, write_fd = os.pipe()
        env = {**os.environ, "METRALECTL_CONFIG_DIR": str(self.base), "METRALE_HOME": str(self.home), "NO_COLOR": "1"}
        env.pop("METRALECTL_DEBUG", None)
        try:
            proc = subprocess.Popen(self.command(unit, write_fd), env=env, pass_fds=(write_fd,),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    start_new_session=True)
        finally:
            os.close(write_fd)
        run_dir: list[Path] = []
        tail: deque[str] = deque(maxlen=20)
        readers = [threading.Thread(target=self._events, args=(read_fd, emit, run_dir), daemon=True),
                   threading.Thread(target=self._stderr, args=(proc, tail), daemon=True)]
        for t in readers:
            t.start()
        why = self._wait(proc, cancel, unit.spec.timeout_s)
        for t in readers:
            t.join(5.0)
        record = _load_record(run_dir[0]) if run_dir else None
        error = why
        ran = proc.returncode in (ExitCode.OK, ExitCode.GATE)  # the run completed (a gate may have said no)
        if error is None and not ran and not (record and record.get("error")):
            error = tail[-1].removeprefix("metralectl: ") if tail else f"exit code {proc.returncode}"
        return ExecOutcome(run_dir[0] if run_dir else None, ExitCode.of(proc.returncode), error, record)

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], cancel: threading.Event, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        why: str | None = None
        interrupted_at: float | None = None
        while proc.poll() is None:
            if why is None and cancel.is_set():
                why = "cancelled"
            elif why is None and time.monotonic() > deadline:
                why = f"timed out after {timeout_s:g} s"
            if why is not None and interrupted_at is None:
                proc.send_signal(signal.SIGINT)  # the CLI's Ctrl-C path: record written as interrupted
                interrupted_at = time.monotonic()
            elif interrupted_at is not None and time.monotonic() - interrupted_at > KILL_AFTER_S:
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(0.2)
            except subprocess.TimeoutExpired:
                pass
        return why

    @staticmethod
    def _events(fd: int, emit: Emit, run_dir: list[Path]) -> None:
        with os.fdopen(fd, "rb") as stream:
            for line in stream:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                data = event.get("data")
                if isinstance(data, dict) and data.get("dir") and not run_dir:
                    run_dir.append(Path(str(data["dir"])))
                emit(event)

    @staticmethod
    def _stderr(proc: subprocess.Popen[bytes], tail: deque[str]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                tail.append(line)


def _load_record(directory: Path) -> dict[str, Any] | None:
    from metralectl.bench import records
    return records.load(directory)
