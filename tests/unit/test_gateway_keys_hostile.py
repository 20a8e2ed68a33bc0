"""An attacker's pass over the gateway's keys file (core/gateway_keys.py, `gateway keys add|list|rm`): a file nested past
Python's stack or not UTF-8, shown fields carrying escapes, a link, a FIFO, a sparse giant, names with control
characters. Each is refused with exit 65 (64 for a name given on the command line), never 70, never a hang, never
raw escapes on a terminal; a running gateway's watch keeps its last good keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.core import gateway_keys as keys


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(tmp_path / "config"), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "metralectl", "gateway", "keys", *args], capture_output=True,
                          text=True, env=env, timeout=30)


def _keys_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "config" / keys.FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path


def _clean_failure(done: subprocess.CompletedProcess[str], code: int) -> None:
    assert done.returncode == code, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr and "\x1b" not in done.stderr


@pytest.mark.parametrize("data", [b"[" * 500_000, b'{"schema": 1, "keys": [' + b"{" * 100_000, b"\xff\xfe{}"],
                         ids=["deep-list", "deep-object", "not-utf8"])
def test_a_keys_file_past_pythons_stack_or_not_utf8_is_refused(tmp_path: Path, data: bytes) -> None:
    _keys_file(tmp_path, data)
    for args in (("list",), ("add", "ci", "--all-models"), ("rm", "ci")):
        _clean_failure(_cli(tmp_path, *args), 65)


def test_a_gateway_watching_keeps_its_last_good_keys_when_the_file_turns_deep(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    token, _ = keys.add("first", ("m",), path)
    watch = keys.KeyWatch(path)
    path.write_bytes(b"[" * 500_000)
    os.utime(path, ns=(1, 1))
    assert watch.poll() is False and watch.ring.check(token) is not None and "not JSON" in (watch.error or "")


def test_shown_fields_of_the_file_are_never_raw_text(tmp_path: Path) -> None:
    """prefix and created are only shown: anything but what `add` writes is shown blank, not as escapes."""
    entry = {"name": "ci", "sha256": "a" * 64, "models": ["m"], "prefix": "\x1b]0;owned\x07",
             "created": "\x1b[2J\u202e2026"}
    _keys_file(tmp_path, json.dumps({"schema": 1, "keys": [entry]}).encode())
    listed = _cli(tmp_path, "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["keys"][0]["prefix"] == ""
    assert json.loads(listed.stdout)["keys"][0]["created"] == ""
    table = _cli(tmp_path, "list")
    assert table.returncode == 0 and "\x1b" not in table.stdout and "\u202e" not in table.stdout
    removed = _cli(tmp_path, "rm", "ci")
    assert removed.returncode == 0 and "\x1b" not in removed.stderr, removed.stderr


def test_a_link_a_fifo_or_a_sparse_giant_is_refused_without_a_hang(tmp_path: Path) -> None:
    path = tmp_path / "config" / keys.FILE_NAME
    path.parent.mkdir(parents=True)
    real = tmp_path / "elsewhere.json"
    real.write_text('{"schema": 1, "keys": []}')
    real.chmod(0o600)
    path.symlink_to(real)
    _clean_failure(_cli(tmp_path, "list"), 65)
    path.unlink()
    os.mkfifo(path, 0o600)
    _clean_failure(_cli(tmp_path, "list"), 65)  # the open does not wait for a writer (timeout=30 would say)
    path.unlink()
    with open(path, "wb") as out:
        out.truncate(8 << 30)  # 8 GiB of nothing, sparse
    path.chmod(0o600)
    done = _cli(tmp_path, "list")
    _clean_failure(done, 65)
    assert "1 MiB" in done.stderr


def test_key_names_with_control_characters_are_refused_escaped(tmp_path: Path) -> None:
    for name in ("ci\x1b]0;owned\x07", "ci\n", "c\u202ei"):
        done = _cli(tmp_path, "add", name, "--all-models")
        _clean_failure(done, 64)
        assert "\u202e" not in done.stderr
    assert not (tmp_path / "config" / keys.FILE_NAME).exists()


def test_a_key_is_shown_once_and_never_again(tmp_path: Path) -> None:
    token = _cli(tmp_path, "add", "ci", "--model", "m").stdout.strip()
    assert keys.KEY_RE.fullmatch(token)
    for args in (("list",), ("list", "--json"), ("rm", "ci", "--json")):
        done = _cli(tmp_path, *args)
        assert done.returncode == 0 and token not in done.stdout + done.stderr
        assert keys.digest(token) not in done.stdout + done.stderr
    assert token not in (tmp_path / "config" / keys.FILE_NAME).read_text()


def test_the_agents_gateway_setting_nested_past_pythons_stack_is_off_and_said(tmp_path: Path) -> None:
    """<config>/gateway.json, read by the agent every few seconds: a bad one must leave the gateway off, said, and
    the agent running (a RecursionError escaped the reader)."""
    from metralectl.agent.gateway_child import load_setting

    path = tmp_path / "gateway.json"
    for data in (b"[" * 60_000, b'{"enabled": true, "listen": "0.0.0.0:80\\n--allow-remote"}', b"\xff"):
        path.write_bytes(data)
        setting = load_setting(path)
        assert setting["enabled"] is False and setting["error"], setting
