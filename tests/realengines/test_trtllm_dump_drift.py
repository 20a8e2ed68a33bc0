"""The pinned TensorRT-LLM option dump is what trtllm-serve's own click command says, byte for byte.

The flags come from the release's SOURCE at a pinned commit, not an installed package (PyPI's `tensorrt-llm` is a
stub whose build fetches the wheel from NVIDIA's own index, which this machine and CI cannot reach: docs/engines.md,
"TensorRT-LLM"). The source is cached outside the clone, keyed by the revision, under
/var/cache/metralectl/trtllm-src/<revision>/ (or $METRALECTL_TRTLLM_SRC); scripts/trtllm-options.py imports its
tensorrt_llm/commands/serve.py with the heavy imports stubbed and walks the click command's params. Skipped, with
the reason, only where that source is not on the machine; a changed command fails here until the dump is
regenerated, its sha256 recorded and `scripts/engine-contract.py generate trtllm` run.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.core.serve_options import sha256_file
from metralectl.core.yamlsrc import load_file

REPO = Path(__file__).resolve().parents[2]
REVISION = "4c05a748"


def source_dir() -> Path:
    return Path(os.environ.get("METRALECTL_TRTLLM_SRC") or f"/var/cache/metralectl/trtllm-src/{REVISION}")


def test_the_pinned_dump_is_trtllm_serves_click_command() -> None:
    src = source_dir()
    if not (src / "tensorrt_llm" / "commands" / "serve.py").is_file():
        pytest.skip(f"TensorRT-LLM source at {REVISION} is not cached at {src} (docs/engines.md, TensorRT-LLM: "
                    "how to put it there)")
    revision = load_file(REPO / "engine" / "trtllm.yaml").data["revisions"][REVISION]
    pinned = REPO / "engine" / revision["serve-options"]
    assert sha256_file(pinned) == revision["sha256"]
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "trtllm-options.py"), str(src),
                          "--version", REVISION], capture_output=True, cwd=REPO, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
    if out.stdout != pinned.read_bytes():
        diff = difflib.unified_diff(pinned.read_text().splitlines(), out.stdout.decode().splitlines(),
                                    "pinned", "source", lineterm="", n=1)
        pytest.fail("trtllm-serve's options drifted from the pinned dump (regenerate it: docs/engines.md, "
                    "TensorRT-LLM):\n" + "\n".join(list(diff)[:80]))


def test_an_unknown_flag_is_named_from_the_pinned_commands_own_error() -> None:
    """The pinned serve command, run by click itself (its imports stubbed) with a flag it lacks: its usage error is
    what the engine file's bad-flag signature names."""
    from metralectl.lifecycle.boot import BootLog
    from tests.unit.recipe_helpers import catalog

    src = source_dir()
    if not (src / "tensorrt_llm" / "commands" / "serve.py").is_file():
        pytest.skip(f"TensorRT-LLM source at {REVISION} is not cached at {src}")
    code = ("import importlib.util, sys; from pathlib import Path\n"
            f"spec = importlib.util.spec_from_file_location('o', {str(REPO / 'scripts' / 'trtllm-options.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"m.load_serve(Path({str(src)!r})).main(['org/model', '--bogus-flag', '1'], prog_name='trtllm-serve')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "bogus-flag" in out.stderr, out.stderr
    log = BootLog(catalog().engines["trtllm"], "127.0.0.1", 8000)
    for line in out.stderr.splitlines():
        log.feed(line)
    assert log.failure is not None and log.failure.cause == "bad-flag", out.stderr
    assert "--bogus-flag" in log.failure.message
