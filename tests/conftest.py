"""Shared fixtures: every test runs with its own config dir, HF cache and METRALE_HOME."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import release_owned

REPO = Path(__file__).resolve().parent.parent

# The tools installed beside the interpreter running the tests (the project venv's metralectl, uv,
# pipx, mypy) are found by name, as in an activated venv: README's test command is
# `.venv/bin/python -m pytest`, with nothing activated.
# A suite started from a background job (`cmd &`, nohup, a runner script) inherits SIGINT *ignored*, and an
# ignored signal stays ignored across exec: every metralectl the tests start would then shrug off the
# Ctrl-C they send. Python's own handler instead (exec resets a caught signal to the default in children).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_BIN = os.path.dirname(sys.executable)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "env"
    for name in ("config", "cache", "hf", "metrale"):
        (home / name).mkdir(parents=True)
    monkeypatch.setenv("METRALECTL_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("METRALECTL_CACHE_DIR", str(home / "cache"))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("METRALE_HOME", str(home / "metrale"))
    monkeypatch.setenv("METRALECTL_LOCK_DIR", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    return home


@pytest.fixture(autouse=True)
def owned_ports() -> Iterator[None]:
    """The ports a test took with tests.ports.own_port() are its own until it ends (then released)."""
    yield
    release_owned()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into each test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """README's test command runs the suite on pytest-xdist workers (`-n auto --dist loadgroup`, pyproject.toml).
    Every test that drives the one Docker daemon (all of tests/integration: containers, private dockerds, agents
    that ask the daemon) joins one group, which runs on one worker in collection order, so no two of them ever
    see each other's containers; the rest (no daemon: unit, installer, real-engine, truth-server tests, each
    with its own config dir, HF cache and ports) is spread over the workers beside it."""
    for item in items:
        if item.get_closest_marker("docker") or "tests/integration/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("docker"))

