"""The gateway's API keys (metralectl/core/gateway_keys.py, auth.py, cli/gateway_keys_cmd.py): hashes at rest, a file
another user could write refused, each bad entry named, scopes by recipe or served id, a revoked key refused on
the next poll while a broken file keeps the last good keys, the CLI's errors and `--listen` with keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.errors import UsageError
from metralectl.core import gateway_keys as keys
from metralectl.gateway import auth
from metralectl.gateway.routes import Route


def test_a_new_key_is_shown_once_and_kept_as_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    token, entry = keys.add("laptop", ("qwen3-8b",), path)
    assert keys.KEY_RE.fullmatch(token) and token not in path.read_text()
    assert entry.digest in path.read_text() and os.stat(path).st_mode & 0o777 == 0o600
    ring = keys.load(path)
    other = token[:-1] + ("B" if token.endswith("A") else "A")  # one character off (the same 1 time in 64 before)
    assert ring.check(token) == entry and ring.check(token + "\n") is None and ring.check(other) is None
    assert ring.check("Bearer " + token) is None and ring.check("") is None


@pytest.mark.parametrize("text, where", [
    ("not json", "not JSON"),
    ('{"schema": 2, "keys": []}', "schema 1"),
    ('{"schema": 1, "keys": [{"name": "Bad Name", "sha256": "' + "a" * 64 + '", "models": ["m"]}]}', "keys[0].name"),
    ('{"schema": 1, "keys": [{"name": "ok", "sha256": "xyz", "models": ["m"]}]}', "keys[0].sha256"),
    ('{"schema": 1, "keys": [{"name": "ok", "sha256": "' + "a" * 64 + '", "models": ["../x\\n"]}]}', "keys[0].models"),
    ('{"schema": 1, "keys": [{"name": "ok", "sha256": "' + "a" * 64 + '", "models": []}]}', "keys[0].models"),
    ('{"schema": 1, "keys": [{"name": "ok", "sha256": "' + "a" * 64 + '", "models": ["m"]}, '
     '{"name": "ok", "sha256": "' + "b" * 64 + '", "models": ["m"]}]}', "used twice"),
])
def test_a_bad_keys_file_is_refused_naming_the_entry(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "keys.json"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(keys.KeysFileError, match=where.replace("[", r"\[").replace("]", r"\]")) as caught:
        keys.load(path)
    assert str(path) in str(caught.value)


def test_a_keys_file_others_could_write_or_a_link_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    keys.add("a", ("*",), path)
    path.chmod(0o620)
    with pytest.raises(keys.KeysFileError, match="another user"):
        keys.load(path)
    path.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(keys.KeysFileError, match="not a regular file"):
        keys.load(link)


def test_scopes_by_recipe_or_served_id() -> None:
    route = Route("qwen3-8b", "http://127.0.0.1:1", "127.0.0.1", 1, ("qwen3-8b", "Qwen/Qwen3-8B"), ("Qwen/Qwen3-8B",))
    scoped = keys.ApiKey("a", "0" * 64, "mk-", ("qwen3-8b",), "")
    assert auth.may_use(scoped, "Qwen/Qwen3-8B", route) and auth.may_use(scoped, "qwen3-8b", None)
    assert not auth.may_use(scoped, "other", None) and not auth.may_use(scoped, "Qwen/Qwen3-8B", None)
    assert auth.may_use(keys.ApiKey("b", "0" * 64, "mk-", ("*",), ""), "anything", None)
    assert auth.may_use(None, "anything", None)


def test_authorize_without_keys_lets_in_unless_a_key_is_required(tmp_path: Path) -> None:
    watch = keys.KeyWatch(tmp_path / "none.json")
    assert auth.authorize(watch, False, None) is None
    with pytest.raises(auth.Unauthorized, match="no API key is configured"):
        auth.authorize(watch, True, "Bearer whatever")
    token, entry = keys.add("a", ("m",), watch.path)
    assert watch.poll() is True
    assert auth.authorize(watch, False, f"Bearer {token}") == entry
    assert auth.authorize(watch, False, f"bearer  {token}") == entry
    for header in (None, token, f"Basic {token}", "Bearer mk-" + "x" * 43):
        with pytest.raises(auth.Unauthorized, match="gateway keys add"):
            auth.authorize(watch, False, header)


def test_a_revoked_key_goes_at_the_next_poll_and_a_broken_file_keeps_the_last_good_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    first, _ = keys.add("first", ("m",), path)
    second, _ = keys.add("second", ("m",), path)
    watch = keys.KeyWatch(path)
    keys.remove("first", path)
    assert watch.poll() and watch.ring.check(first) is None and watch.ring.check(second) is not None
    path.chmod(0o666)
    os.utime(path, ns=(1, 1))
    assert watch.poll() is False and watch.ring.check(second) is not None and "another user" in (watch.error or "")
    path.chmod(0o600)
    os.utime(path, ns=(2, 2))
    watch.poll()
    assert watch.error is None


def test_listen_beyond_loopback_needs_keys_or_allow_remote() -> None:
    from metralectl.cli.gateway_cmd import parse_listen

    with pytest.raises(UsageError, match="no API key is configured"):
        parse_listen("192.0.2.1:8090", False, False)
    assert parse_listen("192.0.2.1:8090", False, True) == ("192.0.2.1", 8090)
    assert parse_listen("192.0.2.1:8090", True, False) == ("192.0.2.1", 8090)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(tmp_path / "config"), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "metralectl", "gateway", "keys", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_the_keys_cli(tmp_path: Path) -> None:
    out = _cli(tmp_path, "add", "ci")
    assert out.returncode == 64 and "--model" in out.stderr and "Traceback" not in out.stderr
    out = _cli(tmp_path, "add", "Bad Name", "--all-models")
    assert out.returncode == 64 and "key name" in out.stderr
    out = _cli(tmp_path, "add", "ci", "--model", "qwen3-8b", "--model", "Qwen/Qwen3-8B")
    token = out.stdout.strip()
    assert out.returncode == 0 and keys.KEY_RE.fullmatch(token) and token not in out.stderr, out
    assert _cli(tmp_path, "add", "ci", "--all-models").returncode == 64  # the name is taken
    listed = json.loads(_cli(tmp_path, "list", "--json").stdout)["keys"]
    assert [(k["name"], k["models"], k["prefix"]) for k in listed] == [("ci", ["qwen3-8b", "Qwen/Qwen3-8B"], token[:11])]
    assert "sha256" not in listed[0]
    out = _cli(tmp_path, "rm", "nope")
    assert out.returncode == 64 and "keys: ci" in out.stderr
    out = _cli(tmp_path, "rm", "ci")
    assert out.returncode == 0 and "no API key is left" in out.stderr
    (tmp_path / "config" / "gateway-keys.json").chmod(0o666)
    out = _cli(tmp_path, "list")
    assert out.returncode == 65 and "chmod 600" in out.stderr and "Traceback" not in out.stderr
