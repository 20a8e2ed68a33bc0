"""Issue 19 item 8, made certain: Ctrl-C while the daemon is still creating the container leaves nothing.

A proxy in front of the real daemon holds the create request for a few seconds (tests/docker_image/
slow_proxy.py); `metralectl run` is interrupted while it waits, so any lookup it makes at once finds
nothing — the daemon creates the container afterwards. metralectl must still remove it."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from tests.integration.conftest import REPO, Box

PROXY = REPO / "tests" / "docker_image" / "slow_proxy.py"


class _Lines:
    """The proxy's stdout, line by line, through a reader thread: a line that never comes fails the test after
    `timeout` instead of hanging it (a `run` that died early is named, with its stderr)."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self._lines.put(line.strip()) for line in stream], daemon=True).start()

    def next(self, run: subprocess.Popen[str] | None = None, timeout: float = 60) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            if run is not None and run.poll() is not None:
                raise AssertionError(f"metralectl run exited {run.returncode} first: {run.communicate()[1]}") from None
            return ""


def test_ctrl_c_during_a_slow_create_leaves_no_container(box: Box, tmp_path: Path) -> None:
    name = box.recipe("slowcreate")
    box.weights_complete()
    sock = tmp_path / "slow-docker.sock"
    proxy = subprocess.Popen([sys.executable, str(PROXY), "--listen", str(sock), "--delay", "3"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout is not None
        said = _Lines(proxy.stdout)
        assert said.next() == "listening"
        env = {**box.env, "DOCKER_HOST": f"unix://{sock}"}
        run = subprocess.Popen([sys.executable, "-m", "metralectl", "run", name], env=env, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert said.next(run) == "create-seen"  # the create is in flight, held by the proxy
        time.sleep(0.3)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=90)
        assert said.next() == "create-forwarded"  # the daemon got it after the Ctrl-C
        assert run.returncode == 130, err
        assert "Traceback" not in err
        time.sleep(1.0)  # anything the daemon was still doing for that create is done by now
        assert box.containers(all_=True) == [], box.containers(all_=True)
    finally:
        proxy.kill()
        proxy.wait()
