"""metralectl's `depth` suite beside llama-benchy (PyPI 0.4.0) on one real llama-server (issue 34 item 6), through the
side-by-side script itself (benchmarks/llama_benchy_side_by_side.py): llama-benchy from its venv cached outside the
clone (benchmarks/llama_benchy_venv.sh; .ci/run builds it), llama-server from CI's cached CPU build serving the tiny
random Llama as a GGUF over the same vocabulary, so llama-benchy's local tokenizer is the server's.

What it holds, with small sizes (pp 128, tg 16, depths 0 and 256, 2 runs per depth, 2 rounds each, ABAB):
- every run counted: metralectl with no failed request, llama-benchy one prompt-processing speed per run at every
  depth, metralectl one for each run whose first token came later than its measured round trip (a busy machine can
  answer a tiny model's prefill sooner: that run has no prefill speed, left out rather than made up), at least one;
- the same work asked of the server: llama-server's own log says how many prompt tokens each tool's requests made it
  process at each depth, and both are pp + depth within a chat template's few tokens (a tool that sized its prompts
  by another tokenizer, or forgot the depth's context, is off by tens to hundreds);
- llama-benchy run again only for what its own design loses: it keeps a connection alive for 600 s and never sends
  again, while llama-server closes one idle for 5 s, which a busy machine's pauses reach (`Server disconnected`, 2 to
  4 of 10 llama-benchy runs on this 2-core box); the script runs that round again (up to 6 times here) and says so,
  and any other error is NOT MEASURED, as before.
Speeds are not held to a band here: on 2 shared cores a 16-token answer may arrive in one read (llama-benchy's tg
then read 13,070 ± 13,162 tok/s where the server's own log said 3,512), and the tools' turns are seconds apart; on a
quiet 16-core machine the comparison is benchmarks/results/llama_benchy_side_by_side.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_bench_workloads_real import _fail_or_skip, llama_server_binary

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
PP, TG, DEPTHS, RUNS, ROUNDS, ATTEMPTS = 128, 16, (0, 256), 2, 2, 6


def benchy_venv() -> Path:
    said = subprocess.run(["bash", str(REPO / "benchmarks" / "llama_benchy_venv.sh"), "--print-dir"],
                          capture_output=True, text=True, timeout=60)
    venv = Path(said.stdout.strip())
    if said.returncode != 0 or not (venv / ".complete").exists():
        _fail_or_skip(f"llama-benchy's venv is not built here ({venv}): run `bash benchmarks/llama_benchy_venv.sh` "
                      "once (.ci/run does; seconds the first time)")
    return venv


def test_depth_sweep_side_by_side_with_llama_benchy_counts_every_run_and_asks_the_server_the_same(
        tmp_path: Path) -> None:
    venv = benchy_venv()
    binary = llama_server_binary()  # fails under CI, skips elsewhere, when CI's llama-server is not built
    try:
        import gguf  # noqa: F401  (the GGUF's writer)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    from tests.realengines.transformers_serve import ensure_model

    model = ensure_model()  # the tiny random Llama (safetensors + tokenizer.json), built once per machine
    out, md = tmp_path / "sbs.json", tmp_path / "sbs.md"
    cmd = [sys.executable, str(REPO / "benchmarks" / "llama_benchy_side_by_side.py"), "--benchy-venv", str(venv),
           "--hf-model", str(model), "--llama-server", str(binary), "--pp", str(PP), "--tg", str(TG),
           "--depths", ",".join(map(str, DEPTHS)), "--runs", str(RUNS), "--rounds", str(ROUNDS), "--threads", "1",
           "--benchy-attempts", str(ATTEMPTS),
           "--json", str(out), "--md", str(md)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and out.exists(), f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    doc = json.loads(out.read_text())
    assert doc["benchy"].endswith("0.4.0"), doc["benchy"]
    assert [row["depth"] for row in doc["table"]] == list(DEPTHS)
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in doc["raw"]["metralectl"]), doc["raw"]["metralectl"]
    for row in doc["table"]:
        depth, b, m = row["depth"], row["llama-benchy"], row["metralectl"]
        assert b["n"] == RUNS * ROUNDS and 1 <= m["n"] <= RUNS * ROUNDS, (depth, b, m)  # pp figures per run
        for tool in (b, m):  # the prompt tokens the server processed for each tool's requests at this depth (a
            # few fewer when its slot kept the chat template's first tokens from the request before)
            assert tool["server_prompt_tokens"], (depth, row)
            assert all(-12 <= t - (PP + depth) <= 4 for t in tool["server_prompt_tokens"]), (depth, row)
        assert f"| {depth} | " in md.read_text()
    assert all(1 <= r["attempts"] <= ATTEMPTS for r in doc["raw"]["llama-benchy"]), doc["raw"]["llama-benchy"]
