"""An attacker's pass over the gateway's state records (<state>/gateways/<pid>.json, read by `ps`): a record that
points off this machine, a link out of the state dir, a sparse giant, another user's process, and a "gateway" on
loopback whose /health answer is nested past Python's stack. `ps` never contacts another host on a record's word,
never follows a link out, and never fails with an internal error."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from metralectl.cli import ps_report
from metralectl.gateway import state
from metralectl.seams.process import group


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("METRALE_HOME", str(tmp_path / "home"))
    state.records_dir().mkdir(parents=True)
    return tmp_path


def _record(url: str, pid: int | None = None) -> dict[str, Any]:
    identity = group.identity_of(pid or os.getpid())  # a process that runs: this test's own
    assert identity is not None
    return {"schema": 1, "url": url, "keys": 0, "identity": identity, "started": "2026-12-04T00:00:00Z"}


def _write(path: Path, record: dict[str, Any]) -> Path:
    path.write_text(json.dumps(record))
    path.chmod(0o600)
    return path


@pytest.fixture()
def deep_health() -> Iterator[str]:
    """A "gateway" on loopback whose /health is 60 000 '[' (under the 64 KiB read, past Python's stack)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"[" * 60_000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # bound here: the port is ours from now
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_health_answer_nested_past_pythons_stack_is_not_answering(home: Path, deep_health: str) -> None:
    _write(state.records_dir() / f"{os.getpid()}.json", _record(deep_health))
    [shown] = ps_report._gateways()
    assert shown["url"] == deep_health and shown["answering"] is False


def test_a_record_naming_another_host_is_never_contacted(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metralectl.seams import httpclient

    asked: list[str] = []

    def get_once(host: str, *args: object, **kwargs: object) -> object:
        asked.append(host)
        raise httpclient.Failed("ConnectError", "not in this test")

    monkeypatch.setattr(httpclient, "get_once", get_once)
    for address in ("203.0.113.5", "[2001:db8::5]"):  # documentation ranges: never this machine's
        _write(state.records_dir() / f"{os.getpid()}.json", _record(f"http://{address}:8090"))
        [shown] = ps_report._gateways()
        assert asked == []
        assert shown.get("here") is False and shown["answering"] is False
    _write(state.records_dir() / f"{os.getpid()}.json", _record("http://127.0.0.1:9"))
    [shown] = ps_report._gateways()
    assert shown["here"] is True and asked == ["127.0.0.1"]  # loopback is asked


def test_a_record_that_is_a_link_out_of_the_state_dir_is_not_followed(home: Path) -> None:
    outside = _write(home / "elsewhere.json", _record("http://127.0.0.1:9"))
    (state.records_dir() / f"{os.getpid()}.json").symlink_to(outside)
    assert state.running() == []
    state.forget_stale()
    assert outside.exists()  # the link's target is never removed through it


def test_a_sparse_giant_or_a_fifo_record_is_skipped_at_once(home: Path) -> None:
    with open(state.records_dir() / f"{os.getpid()}.json", "wb") as out:
        out.truncate(4 << 30)
    os.mkfifo(state.records_dir() / "1234567.json", 0o600)
    assert state.running() == []


def test_a_record_naming_another_users_process_or_another_pid_is_not_shown(home: Path) -> None:
    if os.geteuid() != 0:
        init = group.identity_of(1)
        if init is not None:  # pid 1 is root's: never "our" gateway
            _write(state.records_dir() / "1.json", {**_record("http://127.0.0.1:9"), "identity": init})
    _write(state.records_dir() / "4242424.json", _record("http://127.0.0.1:9"))  # this process, under another name
    assert state.running() == []


def test_top_never_asks_a_record_naming_another_host_nor_sends_it_the_credential(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`top`, the dashboard and the page (gateway/watch.py) read /metrics with the record's credential: a record
    whose address is not this machine's is shown, not asked, and the credential goes nowhere."""
    from metralectl.gateway import watch
    from metralectl.seams import httpclient

    asked: list[tuple[str, object]] = []

    def get_once(host: str, *args: object, **kwargs: object) -> object:
        asked.append((host, kwargs.get("headers")))
        raise httpclient.Failed("ConnectError", "not in this test")

    monkeypatch.setattr(httpclient, "get_once", get_once)
    record = {**_record("http://203.0.113.5:8090"), "monitor": "m" * 40}
    _write(state.records_dir() / f"{os.getpid()}.json", record)
    [row] = watch.observe(timeout=0.2)
    assert asked == []
    assert "not asked" in str(row) and "m" * 40 not in str(row)
    _write(state.records_dir() / f"{os.getpid()}.json", {**record, "url": "http://127.0.0.1:9"})
    watch.observe(timeout=0.2)
    assert [host for host, _ in asked] == ["127.0.0.1"]  # loopback is asked, with the credential


@pytest.mark.parametrize(("written", "shown"), [("14-15", "14-15"), ("15,14", "14-15"), ("\x1b[2J0-3", None),
                                                ("1;rm -rf /", None), ("0-99999", None), (["1"], None), (7, None),
                                                ("1," * 150, None), (None, None)])
def test_a_records_cpu_list_is_shown_only_as_a_cpu_list(home: Path, written: Any, shown: str | None) -> None:
    """The gateway's own CPUs (`gateway --cpus`) in its record: `ps` shows what parses as a CPU list, rendered anew;
    anything else someone left there is shown as none, never raw."""
    _write(state.records_dir() / f"{os.getpid()}.json", {**_record("http://127.0.0.1:9"), "cpus": written})
    [found] = state.running()
    assert found["cpus"] == shown


@pytest.mark.parametrize(("written", "shown"), [(50, 50.0), (0.5, 0.5), (0, 0.0), (-1, 0.0), (10_001, 0.0),
                                                (float("nan"), 0.0), (True, 0.0), ("50", 0.0), ([50], 0.0), (None, 0.0)])
def test_a_records_busy_poll_window_is_shown_only_as_a_number_in_range(home: Path, written: Any, shown: float) -> None:
    """`gateway --busy-poll` in its record: `ps` shows a number of milliseconds from 0 to 10 s, else none."""
    _write(state.records_dir() / f"{os.getpid()}.json", {**_record("http://127.0.0.1:9"), "busy_poll_ms": written})
    [found] = state.running()
    assert found["busy_poll_ms"] == shown
