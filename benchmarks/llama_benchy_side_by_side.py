#!/usr/bin/env python3
"""metralectl's `depth` suite and llama-benchy on the same real llama-server, in one run (a script, not a test).

One model for both tools and the server: the tiny random Llama of tests/realengines/build_tiny_llama.py
(safetensors + tokenizer.json), converted to a GGUF over the same vocabulary (tests/real_llamacpp/
gguf_from_tiny_llama.py), so llama-benchy's local tokenizer is the server's. llama.cpp's llama-server (CI's cached
CPU build) serves it with one slot. The tools take turns, `--rounds` times each (ABAB, so drift lands on both), with
the same pp, tg, depths and runs; then an agreement table per depth: pp and tg tok/s (mean over every run of every
round) for each tool, their difference, and llama-server's own timing of the very same requests (its log's
`prompt eval time` and `eval time` per task): the prompt tokens each tool made the server process, and its
prefill and decode speeds, an independent third reading.

    PYTHONPATH=. python3 benchmarks/llama_benchy_side_by_side.py [--pp 512] [--tg 32] [--depths 0,1024,2048,3072]
        [--runs 5] [--rounds 2] [--threads 4] [--benchy-venv DIR] [--hf-model DIR] [--json FILE] [--md FILE]

llama-benchy runs offline: `--tokenizer` the model's tokenizer.json, its book placed in its cache beforehand
(tests/realengines/corpus.txt, under a HOME of this script's), `--model` named (no look-up), `--skip-coherence`
(a random model does not answer "Paris"), `--exact-tg` (metralectl forces the length by default too).
The venv: benchmarks/llama_benchy_venv.sh (PyPI, cached outside the clone).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BOOK_URL = "offline://metralectl/tests/realengines/corpus.txt"
TIMING = re.compile(r"task (\d+) \| +(prompt eval|eval) time = +([\d.]+) ms / +(\d+) tokens")


def llama_server() -> str:
    out = subprocess.run(["bash", str(REPO / "images" / "build-llama-server.sh"), "--print-cache-dir"],
                         capture_output=True, text=True, check=True)
    return str(Path(out.stdout.strip()) / "bin" / "llama-server")


def tiny_model(given: str | None) -> Path:
    if given:
        return Path(given)
    found = sorted(glob.glob(str(Path.home() / ".cache" / "metralectl-tests" / "vllm" / "llama-tiny-*")))
    found = [f for f in found if (Path(f) / "tokenizer.json").exists() and (Path(f) / "model.safetensors").exists()]
    if not found:
        sys.exit("no tiny Llama: run tests/realengines/build_tiny_llama.py (the vLLM tests do) or pass --hf-model")
    return Path(found[-1])


def server_timings(log: Path, start: int) -> list[dict[str, Any]]:
    """Per task since byte `start` of the server's log: prompt tokens processed and ms, decode tokens and ms."""
    tasks: dict[int, dict[str, Any]] = {}
    with log.open("rb") as f:
        f.seek(start)
        for line in f.read().decode(errors="replace").splitlines():
            m = TIMING.search(line)
            if m:
                t = tasks.setdefault(int(m.group(1)), {})
                kind = "prompt" if m.group(2) == "prompt eval" else "eval"
                t[kind + "_ms"], t[kind + "_tokens"] = float(m.group(3)), int(m.group(4))
    return [tasks[k] for k in sorted(tasks)]


def run_benchy(venv: Path, url: str, tokenizer: Path, home: Path, a: argparse.Namespace, out: Path) -> tuple[list[str], dict[str, Any]]:
    cmd = [str(venv / "bin" / "llama-benchy"), "--base-url", f"{url}/v1", "--model", "tiny", "--tokenizer", str(tokenizer),
           "--book-url", BOOK_URL, "--pp", str(a.pp), "--tg", str(a.tg), "--depth", *[str(d) for d in a.depths],
           "--runs", str(a.runs), "--exact-tg", "--skip-coherence", "--format", "json", "--save-result", str(out)]
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"llama-benchy failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    errors = done.stdout.count("Error during run") + done.stdout.count("HTTP ")
    if errors:  # its speeds would average over requests that failed (and a depth whose runs all failed has none)
        raise BenchyErrors(errors, done.stdout)
    doc = json.loads(out.read_text())
    rows = {}
    def values(entry: dict[str, Any], key: str) -> list[float]:  # null when it measured none (a busy machine can
        return list((entry.get(key) or {}).get("values") or [])  # deliver a short answer in one read: no tg)

    for b in doc["benchmarks"]:
        rows[b["context_size"]] = {"pp": values(b, "pp_throughput"), "tg": values(b, "tg_throughput"),
                                   "ttft_ms": values(b, "e2e_ttft"), "latency_ms": doc["latency_ms"]}
    return cmd, {"rows": rows, "errors_said": errors, "stdout_tail": done.stdout[-600:]}


class BenchyErrors(Exception):
    """llama-benchy said some of its requests failed: its speeds would average over them."""

    def __init__(self, count: int, stdout: str) -> None:
        super().__init__(f"llama-benchy said {count} request error(s)")
        self.count, self.stdout = count, stdout
        self.disconnects = stdout.count("Server disconnected")


def run_benchy_attempts(venv: Path, url: str, tokenizer: Path, home: Path, a: argparse.Namespace,
                        out: Path) -> tuple[list[str], dict[str, Any]]:
    """run_benchy, again when every error it said was a connection llama-server had closed: llama-benchy 0.4.0 keeps
    connections alive for 600 s and never sends again, llama-server closes one idle for 5 s (cpp-httplib's
    keep-alive), which a busy machine's pauses reach. Any other error, or the last attempt's, is NOT MEASURED."""
    lost: list[int] = []
    for attempt in range(1, max(1, a.benchy_attempts) + 1):
        try:
            cmd, got = run_benchy(venv, url, tokenizer, home, a, out)
        except BenchyErrors as err:
            if err.disconnects < err.count or attempt >= a.benchy_attempts:
                raise SystemExit(f"NOT MEASURED: {err} (attempt {attempt}):\n{err.stdout[-3000:]}") from None
            lost.append(err.disconnects)
            continue
        got["attempts"], got["disconnects_before"] = attempt, lost
        return cmd, got
    raise AssertionError("unreachable")


def run_metralectl(url: str, home: Path, a: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    cmd = [sys.executable, *(["-P"] if a.installed_metralectl else []), "-m", "metralectl", "bench", "run", "depth", "--url", url, "--json",
           "-p", f"depths={','.join(str(d) for d in a.depths)}", "-p", f"pp={a.pp}", "-p", f"tg={a.tg}",
           "-p", f"runs={a.runs}", "-p", "client_bound=warn", *[x for kv in a.metralectl_param for x in ("-p", kv)]]
    env = {k: v for k, v in os.environ.items() if not (a.installed_metralectl and k == "PYTHONPATH")}
    done = subprocess.run(cmd, capture_output=True, text=True, env={**env, "METRALE_HOME": str(home)},
                          cwd=REPO, timeout=1800)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"metralectl said no record ({done.returncode}):\n{done.stderr[-3000:]}") from None
    if done.returncode != 0:
        raise SystemExit(f"metralectl failed ({done.returncode}): {doc.get('error')}\n{done.stderr[-3000:]}")
    rows = {r["depth"]: {"pp": r["pp_tok_s"]["values"], "tg": r["tg_tok_s"]["values"], "ttft_ms": r["ttfr_ms"]["values"],
                         "latency_ms": r["api_rtt_ms"], "prompt_tokens": r["prompt_tokens"]} for r in doc["summary"]["depths"]}
    return cmd, {"rows": rows, "errors": sum(s["summary"]["errors"] for s in doc["stages"]),
                 "requests": sum(s["summary"]["requests"] for s in doc["stages"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1024, 2048, 3072])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--benchy-attempts", type=int, default=1,
                    help="run llama-benchy again, up to this many times, when it lost a request to a connection "
                         "llama-server had closed (`Server disconnected`); each attempt is kept and said")
    ap.add_argument("--benchy-venv", default=None)
    ap.add_argument("--hf-model", default=None)
    ap.add_argument("--llama-server", default=None, help="the binary (default: CI's cached CPU build)")
    ap.add_argument("--gguf", default=None, help="a GGUF already converted (with --tokenizer: no conversion here)")
    ap.add_argument("--tokenizer", default=None, help="the GGUF's tokenizer.json, for llama-benchy")
    ap.add_argument("--installed-metralectl", action="store_true",
                    help="run the metralectl installed in this Python (python -P), not this tree's")
    ap.add_argument("--metralectl-param", action="append", default=[], metavar="K=V",
                    help="one more -p for metralectl's depth run (e.g. continuous_usage=false)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    if a.benchy_venv and not os.access(Path(a.benchy_venv) / "bin" / "llama-benchy", os.X_OK):
        sys.exit(f"NOT MEASURED: llama-benchy's venv {a.benchy_venv} has no bin/llama-benchy")
    venv = Path(a.benchy_venv or subprocess.run(["bash", str(REPO / "benchmarks" / "llama_benchy_venv.sh")],
                                                capture_output=True, text=True, check=True).stdout.strip())
    tmp = Path(tempfile.mkdtemp(prefix="benchy-sbs-"))
    if a.gguf:
        gguf, tokenizer = Path(a.gguf), Path(a.tokenizer)
    else:
        model = tiny_model(a.hf_model)
        sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
        import gguf_from_tiny_llama

        gguf, tokenizer = tmp / "tiny.gguf", model / "tokenizer.json"
        gguf_from_tiny_llama.convert(model, gguf)
    home = tmp / "home"
    (home / ".cache" / "llama-benchy").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "realengines" / "corpus.txt",
                home / ".cache" / "llama-benchy" / (hashlib.md5(BOOK_URL.encode()).hexdigest() + ".txt"))
    log = tmp / "llama-server.log"
    ctx = max(a.depths) + a.pp + a.tg + 64
    binary = a.llama_server or llama_server()
    sys.path.insert(0, str(REPO))
    from tests.ports import PortTaken, port_in_use, start_retrying

    def start(port: int) -> tuple[subprocess.Popen[bytes], list[str], str]:
        """llama-server on `port`; PortTaken when another program took it first (then another port is tried)."""
        cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx), "-np", "1",
               "--alias", "tiny", "-t", str(a.threads)]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(600):
            if proc.poll() is not None:
                said = log.read_text(errors="replace")
                if port_in_use(said, "llama-cpp"):
                    raise PortTaken(said)
                raise SystemExit(f"llama-server exited:\n{said[-3000:]}")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    return proc, cmd, f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.2)
        raise SystemExit("llama-server not ready in 2 minutes")

    server, server_cmd, url = start_retrying(start)
    try:
        per: dict[str, list[dict[str, Any]]] = {"llama-benchy": [], "metralectl": []}
        cmds: dict[str, list[str]] = {}
        for k in range(a.rounds):
            for tool in (("metralectl", "llama-benchy") if k % 2 else ("llama-benchy", "metralectl")):
                start = log.stat().st_size
                if tool == "llama-benchy":
                    cmd, got = run_benchy_attempts(venv, url, tokenizer, home, a, tmp / f"benchy{k}.json")
                else:
                    cmd, got = run_metralectl(url, tmp / f"mhome{k}", a)
                got["server"] = server_timings(log, start)
                per[tool].append(got)
                cmds[tool] = cmd
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    table = agreement(per, a)
    said = subprocess.run([str(venv / "bin" / "llama-benchy"), "--version"], capture_output=True, text=True).stdout
    benchy_version = said.strip().replace("llama-benchy ", "llama-benchy ") or "llama-benchy"
    doc = {"server": " ".join(server_cmd), "commands": {k: " ".join(v) for k, v in cmds.items()}, "benchy": benchy_version,
           "pp": a.pp, "tg": a.tg, "depths": a.depths, "runs": a.runs, "rounds": a.rounds, "table": table, "raw": per}
    md = markdown(doc)
    print(md)
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1, default=str))
    if a.md:
        Path(a.md).write_text(md)
    return 0


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def agreement(per: dict[str, list[dict[str, Any]]], a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    # server-side prompt tokens and speeds per depth: tasks come in the tools' order, a warm-up and `runs` per depth
    for d in a.depths:
        row: dict[str, Any] = {"depth": d}
        for tool, rounds in per.items():
            pp = [x for r in rounds for x in r["rows"].get(d, {}).get("pp", [])]
            tg = [x for r in rounds for x in r["rows"].get(d, {}).get("tg", [])]
            row[tool] = {"pp": _mean(pp), "pp_sd": statistics.pstdev(pp) if len(pp) > 1 else None, "n": len(pp),
                         "tg": _mean(tg), "tg_sd": statistics.pstdev(tg) if len(tg) > 1 else None}
        b, m = row["llama-benchy"], row["metralectl"]
        row["pp_diff"] = (m["pp"] / b["pp"] - 1) if b["pp"] and m["pp"] else None
        row["tg_diff"] = (m["tg"] / b["tg"] - 1) if b["tg"] and m["tg"] else None
        rows.append(row)
    # the server's view: prompt tokens it processed per request, and its own prefill/decode tok/s, per tool
    for tool, rounds in per.items():
        tasks = [t for r in rounds for t in r["server"] if t.get("eval_tokens", 0) > 1]
        for row in rows:
            d = row["depth"]
            near = [t for t in tasks if abs(t.get("prompt_tokens", 0) - (a.pp + d)) <= max(16, 0.05 * (a.pp + d))]
            row[tool]["server_prompt_tokens"] = sorted({t["prompt_tokens"] for t in near})
            row[tool]["server_pp"] = _mean([t["prompt_tokens"] / t["prompt_ms"] * 1000 for t in near if t["prompt_ms"] > 0])
            row[tool]["server_tg"] = _mean([(t["eval_tokens"] - 1) / t["eval_ms"] * 1000 for t in near if t["eval_ms"] > 0])
    return rows


def markdown(doc: dict[str, Any]) -> str:
    def f(x: Any, nd: int = 1) -> str:
        return "–" if x is None else f"{x:.{nd}f}"

    def pct(x: Any) -> str:
        return "–" if x is None else f"{x * 100:+.1f} %"

    lines = [f"# metralectl `depth` vs {doc['benchy']}, one llama-server, one run", "",
             f"pp={doc['pp']} tg={doc['tg']}, {doc['runs']} runs per depth per round, {doc['rounds']} rounds (ABAB).", "",
             "| depth | pp llama-benchy | pp metralectl | Δ pp | tg llama-benchy | tg metralectl | Δ tg | server prompt tokens (benchy / metralectl) | server pp tok/s (benchy / metralectl) | server tg tok/s (benchy / metralectl) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["table"]:
        b, m = r["llama-benchy"], r["metralectl"]
        lines.append(f"| {r['depth']} | {f(b['pp'])} ± {f(b['pp_sd'])} | {f(m['pp'])} ± {f(m['pp_sd'])} | {pct(r['pp_diff'])} | "
                     f"{f(b['tg'])} ± {f(b['tg_sd'])} | {f(m['tg'])} ± {f(m['tg_sd'])} | {pct(r['tg_diff'])} | "
                     f"{b['server_prompt_tokens']} / {m['server_prompt_tokens']} | {f(b['server_pp'])} / {f(m['server_pp'])} | "
                     f"{f(b['server_tg'])} / {f(m['server_tg'])} |")
    retried = [r for r in doc["raw"].get("llama-benchy", []) if r.get("attempts", 1) > 1]
    if retried:
        lines += ["", f"llama-benchy was run again in {len(retried)} of its rounds: it lost "
                      f"{sum(sum(r['disconnects_before']) for r in retried)} request(s) to connections llama-server had "
                      "closed (`Server disconnected`: it keeps them alive 600 s and never sends again; the server closes "
                      "one idle for 5 s); only complete attempts are in the table."]
    lines += ["", "Commands:", "", "```", doc["server"]] + [doc["commands"][k] for k in sorted(doc["commands"])] + ["```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
