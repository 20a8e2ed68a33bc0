"""Test helpers for `metralectl gateway`: start the real CLI's gateway on an owned loopback port, ask it over HTTP.

The port is held (tests/ports.HeldPort) from the moment it is chosen; the gateway binds beside the held socket
(SO_REUSEADDR), as metralectl's own servers do.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.ports import HeldPort

REPO = Path(__file__).resolve().parents[2]


class Gateway:
    """The gateway as a router only (--no-load: what these tests ask of it; loading on demand is
    tests/integration/test_budget_llamacpp.py's)."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.held = HeldPort()
        self.port = self.held.port
        self.proc = subprocess.Popen([sys.executable, "-m", "metralectl", "gateway", "--listen",
                                      f"127.0.0.1:{self.port}", "--json", "--no-load", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.first = self.wait_line(lambda line: line["event"] == "listening")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))  # stdout is data: every line a JSON document

    def wait_line(self, pred: Any, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise AssertionError(f"the gateway exited {self.proc.returncode}: {self.proc.stderr.read()}")
                continue
            if pred(line):
                return line
        raise AssertionError("the gateway never printed the line awaited")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 120,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            reply = conn.getresponse()
            return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
        finally:
            conn.close()

    def chat(self, model: str, *, max_tokens: int = 8, stream: bool = False,
             timeout: float = 120) -> tuple[int, dict[str, str], bytes]:
        return self.request("POST", "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": max_tokens,
            "stream": stream}, timeout=timeout)

    def metric(self, name: str, auth: str | None = None, **labels: str) -> float:
        _, _, text = self.request("GET", "/metrics", headers={"Authorization": f"Bearer {auth}"} if auth else None)
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        total = 0.0
        for line in text.decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                got = line[len(name):].split(" ")[0].strip("{}")
                if all(part in got.split(",") for part in want.split(",") if part):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.held.close()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()


def box_env(home: Path) -> dict[str, str]:
    """A machine of the test's own: config, state, lock, no Docker."""
    for name in ("config", "metrale", "cache", "hf"):
        (home / name).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(home / "config"), "HF_HOME": str(home / "hf"),
           "METRALE_HOME": str(home / "metrale"), "METRALECTL_CACHE_DIR": str(home / "cache"),
           "METRALECTL_LOCK_DIR": str(home), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",
           "DOCKER_HOST": f"unix://{home}/no-docker.sock"}
    env.pop("HF_HUB_CACHE", None)
    return env
