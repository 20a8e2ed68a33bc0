"""An engine from a third party's package (issue 30 items 1 and 6): examples/engine-plugin installed into a
fresh venv (`--no-index`, from the tree), found through its `metralectl.engines` entry point, its data (engine
file, pinned --help, image, recipe) loaded as shipped data, its class asked for what differs; and its recipe
served through the host-process runtime: run → ps → chat → stop, the venv's Python named in engines.yaml."""

from __future__ import annotations

import json
import socket
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_llamacpp_process import _verified
from tests.ports import HeldPort
from tests.unit.recipe_helpers import REPO

pytestmark = [pytest.mark.integration]
EXAMPLE = REPO / "examples" / "engine-plugin"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv that sees metralectl (this tree) and its dependencies, and has the example installed in it."""
    root = tmp_path_factory.mktemp("plugin")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    target = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    (Path(target) / "metralectl-tree.pth").write_text(f"{REPO}\n{site.getsitepackages()[0]}\n")
    source = root / "src"  # a copy: a build writes its egg-info beside the sources
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
                          "--no-build-isolation", "--no-deps", "-q", str(source)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return python


def metralectl(python: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what the venv sees
    env.update(METRALECTL_CONFIG_DIR=str(tmp_path / "config"), METRALECTL_CACHE_DIR=str(tmp_path / "cache"),
               NO_COLOR="1")
    return subprocess.run([str(python), "-m", "metralectl", *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, stdin=subprocess.DEVNULL, timeout=120)


def test_the_plugins_recipe_is_listed_by_its_engine(venv: Path, tmp_path: Path) -> None:
    out = metralectl(venv, tmp_path, "list", "--engine", "echo", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["recipes"]
    assert [r["name"] for r in rows] == ["echo-tiny"]
    assert rows[0]["memory_gb"] is not None  # the class's kv_pool answered (no KV cache), not the generic "unknown"


def test_the_plugins_recipe_renders_its_process_argv(venv: Path, tmp_path: Path) -> None:
    out = metralectl(venv, tmp_path, "run", "echo-tiny", "--print")
    assert out.returncode == 0, out.stderr
    assert "-m metralectl_echo.server Qwen/Qwen2.5-0.5B-Instruct" in out.stdout
    assert "--host 127.0.0.1 --port 8000 --served-name echo-tiny --max-tokens 32" in out.stdout


def test_without_the_plugin_its_engine_is_unknown(tmp_path: Path) -> None:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(tmp_path / "config"),
           "METRALECTL_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "metralectl", "list", "--engine", "echo"], capture_output=True,
                         text=True, cwd=REPO, env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert out.returncode == 64 and "no recipe is for engine 'echo'" in out.stderr


def _hf_home(root: Path) -> Path:
    """The recipe's checkpoint as `metralectl pull` leaves it (the echo server reads no weights: two small files)."""
    repo, commit = "Qwen/Qwen2.5-0.5B-Instruct", "0" * 40
    base = root / "hf" / "hub" / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"model_type": "echo"}')
    (snap / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(commit)
    _verified(root / "hf" / "hub", repo)
    return root / "hf"


def test_the_plugins_recipe_serves_as_a_host_process(venv: Path, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "engines.yaml").write_text(f"echo:\n  interpreter: {venv}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_CACHE")}
    env.update(METRALECTL_CONFIG_DIR=str(config), METRALECTL_CACHE_DIR=str(tmp_path / "cache"),
               HF_HOME=str(_hf_home(tmp_path)), METRALE_HOME=str(tmp_path / "metrale"),
               METRALECTL_LOCK_DIR=str(tmp_path), DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock", NO_COLOR="1")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv), "-m", "metralectl", *args], capture_output=True, text=True, cwd=tmp_path,
                              env=env, stdin=subprocess.DEVNULL, timeout=120)

    with HeldPort() as held:  # the echo server binds beside it (SO_REUSEADDR): nobody else takes the port
        try:
            out = cli("run", "echo-tiny", "--set", f"resources.port={held.port}")
            assert out.returncode == 0, out.stderr
            serving = json.loads(cli("ps", "--json").stdout)["serving"]
            assert [(s["recipe"], s["engine"], s["health"]) for s in serving] == [("echo-tiny", "echo", "ok")]
            answer = cli("chat", "hello plugin world")
            assert answer.returncode == 0 and answer.stdout.strip() == "hello plugin world", answer.stderr
        finally:
            stopped = cli("stop")
        assert stopped.returncode == 0, stopped.stderr
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", held.port), timeout=2).close()
