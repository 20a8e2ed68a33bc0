"""The real-engine fixture itself: the model is deterministic and cached, the server leaves nothing behind."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.realengines.transformers_serve import BUILDER, TfServe, engine_python, transformers_serve

pytestmark = pytest.mark.integration


def _digest(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir()) if f.is_file()}


def test_the_model_is_built_byte_for_byte_the_same_twice(tfserve_versions: dict[str, str], tmp_path: Path) -> None:
    for name in ("a", "b"):
        subprocess.run([engine_python(), str(BUILDER), "--out", str(tmp_path / name)], check=True,
                       capture_output=True, timeout=600)
    a, b = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert set(a) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                      "generation_config.json"}
    assert a == b


def test_the_cache_builds_once_and_keys_on_the_parameters(tfserve_versions: dict[str, str], tmp_path: Path) -> None:
    def ensure(*extra: str) -> dict[str, object]:
        out = subprocess.run([engine_python(), str(BUILDER), "--cache-root", str(tmp_path), "--json", *extra],
                             check=True, capture_output=True, text=True, timeout=600)
        return dict(json.loads(out.stdout))

    first, again, other = ensure(), ensure(), ensure("--eos", "suppressed")
    assert (first["built"], again["built"], other["built"]) == (True, False, True)
    assert first["model_dir"] == again["model_dir"] != other["model_dir"]
    assert Path(str(first["model_dir"])).parent == tmp_path
    assert tfserve_versions["transformers"] in Path(str(first["model_dir"])).name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.is_dir()]  # no half-built leftovers


def test_a_tokenizer_config_other_tools_can_load(tfserve: TfServe) -> None:
    config = json.loads((tfserve.model_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # not transformers 5's own class name
    assert "chat_template" in config


def test_stop_leaves_no_process_and_no_listener(tfserve_versions: dict[str, str]) -> None:
    with transformers_serve() as srv:
        pid, port, workdir = srv.proc.pid, srv.port, srv.workdir
        os.killpg(pid, 0)  # running, in its own process group
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    assert not workdir.exists()
