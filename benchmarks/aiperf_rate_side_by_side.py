#!/usr/bin/env python3
"""metralectl's `rate` suite and AIPerf's `--request-rate` on the same real llama-server, in one run (a script).

One llama-server (CI's cached CPU build, or --llama-server) serves a GGUF of tests/real_llamacpp/build_tiny_gguf.py
(the tiny preset, or --gguf: e.g. the 1b preset on the H200); AIPerf sizes its prompts with that GGUF's own tokenizer
(tests/real_llamacpp/tiny_gguf_tokenizer.py writes it as a Hugging Face folder). The prompts are matched on the
SERVER's count: AIPerf's `--isl` counts the prompt text only and llama-server's chat template adds tokens, so a few
AIPerf probe requests read `usage.prompt_tokens` and `--isl` is corrected until the server counts --prompt-tokens;
metralectl sizes its prompt with the server's /tokenize (chat template included). Then, per rate, both tools take
turns (ABBA: metralectl first on even rates, AIPerf first on odd), open loop, the same arrival process, prompt and
output length (`ignore_eos`, temperature 0, usage only at the end of the stream for both):

    metralectl bench run rate -p rates=R -p arrival=A -p isl=P -p osl=O -p duration_s=D -p warmup_s=W
    aiperf profile --request-rate R --arrival-pattern A --request-count R*D --warmup-request-count R*W --isl X ...

metralectl runs from a wheel of this tree installed into a fresh venv (--metralectl wheel, the default; `tree` runs
this checkout; a path runs that Python's installed metralectl). Per rate the table has, for each tool, output tok/s
(its own definition), TTFT p50/p99, ITL p50, requests ok/failed and the server-side prompt tokens, then the ratio and
whether they agree within --tolerance, or why not. A second throughput computed the same way for both (every
measured request's output tokens over last end − first send, AIPerf's definition) separates the definitions from
the measurements.

    PYTHONPATH=. python3 benchmarks/aiperf_rate_side_by_side.py [--rates 2,4,8,16|auto] [--arrival constant]
        [--prompt-tokens 128] [--osl 32] [--duration-s 10] [--warmup-s 2] [--slots 4] [--threads 2]
        [--aiperf-venv DIR] [--llama-server BIN] [--gguf FILE] [--workdir DIR] [--json FILE] [--md FILE]

`--rates auto` lets metralectl's `rates=auto` find saturation first (short windows) and compares on the rates it ran.
Exit 1 when a tool failed to run or a request failed in either tool (the table is still written, and says so).
"""

from __future__ import annotations

import argparse
import json
import os
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
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import aiperf_rate_table as T  # noqa: E402  (beside this script)


def sh(argv: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done


# --- the pieces: AIPerf, metralectl, the model, the server --------------------------------------------------------
def aiperf_venv(given: str | None) -> Path:
    if given:
        if not os.access(Path(given) / "bin" / "aiperf", os.X_OK):  # found out before any server or wheel is made
            raise SystemExit(f"NOT MEASURED: AIPerf's venv {given} has no bin/aiperf")
        return Path(given)
    return Path(sh(["bash", str(REPO / "benchmarks" / "aiperf_venv.sh")], "building AIPerf's venv").stdout.strip())


def metralectl_python(how: str, tmp: Path) -> tuple[list[str], dict[str, str], str]:
    """The command that runs metralectl, its environment, and what it is. `wheel`: this tree built into a wheel and
    installed (--no-deps) into a fresh venv that sees this interpreter's packages (its dependencies)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if how == "tree":
        return [sys.executable, "-m", "metralectl"], {**env, "PYTHONPATH": str(REPO)}, f"this tree ({REPO})"
    if how != "wheel":
        return [how, "-P", "-m", "metralectl"], env, f"installed in {how}"
    sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO), "-w", str(tmp / "whl")],
       "building the metralectl wheel")
    wheel = next((tmp / "whl").glob("metralectl_cockpit-*.whl"))
    venv = tmp / "mvenv"
    sh([sys.executable, "-m", "venv", str(venv)], "making metralectl's venv")
    py = venv / "bin" / "python"
    site = sh([str(py), "-c", "import site; print(site.getsitepackages()[0])"], "site").stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "metralectl-deps.pth").write_text("\n".join(deps) + "\n")  # after the venv's own: the wheel wins
    sh([str(py), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", str(wheel)], "installing the wheel")
    where = sh([str(py), "-P", "-c", "import metralectl; print(metralectl.__file__)"], "importing metralectl",
               env=env, cwd=tmp).stdout.strip()
    if not where.startswith(str(venv)):
        raise SystemExit(f"the venv imports metralectl from {where}, not from the wheel")
    return [str(py), "-P", "-m", "metralectl"], env, f"wheel {wheel.name} in a fresh venv"


def model(a: argparse.Namespace, tmp: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
    import tiny_gguf_tokenizer

    tok = Path(a.tokenizer) if a.tokenizer else tiny_gguf_tokenizer.write(tmp / "tokenizer")
    if a.gguf:
        return Path(a.gguf), tok
    import build_tiny_gguf

    return Path(build_tiny_gguf.install(tmp / "hub")["file"]), tok


def llama_server_binary(given: str | None) -> str:
    if given:
        return given
    out = sh(["bash", str(REPO / "images" / "build-llama-server.sh"), "--print-cache-dir"], "finding llama-server")
    return str(Path(out.stdout.strip()) / "bin" / "llama-server")


def serve(a: argparse.Namespace, gguf: Path, log: Path) -> tuple[subprocess.Popen[bytes], list[str], str]:
    from tests.ports import PortTaken, port_in_use, start_retrying

    binary = llama_server_binary(a.llama_server)

    def start(port: int) -> tuple[subprocess.Popen[bytes], list[str], str]:
        cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-c", str(a.ctx), "-np", str(a.slots),
               "--alias", "tiny", "--threads-http", str(a.threads_http), *(["-t", str(a.threads)] if a.threads else []),
               *a.server_arg]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(900):
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
        os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit("llama-server not ready in 3 minutes")

    return start_retrying(start)


# --- one run of each tool -----------------------------------------------------------------------------------------
def aiperf_cmd(a: argparse.Namespace, venv: Path, url: str, tok: Path, isl: int, out: Path, *, rate: float | None,
               count: int, warmup: int, seed: int) -> list[str]:
    load = (["--request-rate", f"{rate:g}", "--arrival-pattern", a.arrival] if rate else ["--concurrency", "1"])
    if warmup:
        load += ["--warmup-request-count", str(warmup), *(["--warmup-request-rate", f"{rate:g}"] if rate else [])]
    return [str(venv / "bin" / "aiperf"), "profile", "-m", "tiny", "--url", url, "--endpoint-type", "chat", "--streaming",
            *load, "--request-count", str(count), "--isl", str(isl), "--isl-stddev", "0", "--osl", str(a.osl),
            "--osl-stddev", "0", "--random-seed", str(seed), "--use-server-token-count", "--tokenizer", str(tok),
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0", "--ui-type", "none",
            "--artifact-dir", str(out)]


def run_aiperf(cmd: list[str], out: Path, home: Path) -> dict[str, Any]:
    # no HF_HUB_OFFLINE: AIPerf 0.13 then refuses a local tokenizer folder ("Repo id must be in the form ...")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HOME=str(home), NO_COLOR="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent, timeout=900)
    if done.returncode != 0 or not (out / "profile_export_aiperf.json").exists():
        return {"run_failed": f"aiperf exit {done.returncode}: {(done.stderr or done.stdout)[-1500:]}"}
    return T.aiperf_result(out)


def run_metralectl(mctl: list[str], env: dict[str, str], url: str, home: Path, params: list[str], cwd: Path) -> tuple[list[str], dict[str, Any]]:
    cmd = [*mctl, "bench", "run", "rate", "--url", url, "--json"] + [x for p in params for x in ("-p", p)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**env, "METRALE_HOME": str(home), "NO_COLOR": "1"},
                          cwd=cwd, timeout=1800)
    try:
        doc = json.loads(done.stdout)
        lines = (home / "runs" / "rate" / doc["run_id"] / doc["requests_file"]).read_text().splitlines()
    except (ValueError, TypeError, KeyError, OSError) as exc:  # no record, or one without its requests: not measured
        return cmd, {"run_failed": f"metralectl exit {done.returncode}, no usable record ({type(exc).__name__}: "
                                   f"{exc}): {done.stderr[-1500:]}"}
    return cmd, T.metralectl_result(doc, [json.loads(x) for x in lines if x.strip()], done.returncode)


def calibrate(a: argparse.Namespace, venv: Path, url: str, tok: Path, tmp: Path, target: int) -> tuple[int, list[dict[str, Any]]]:
    """AIPerf's --isl such that the server counts `target` prompt tokens (what it counted for metralectl's prompts):
    a few requests one at a time, their usage.prompt_tokens read, --isl corrected by the difference."""
    isl, tries = target, []
    for k in range(4):
        out = tmp / f"aiperf-calibrate{k}"
        got = run_aiperf(aiperf_cmd(a, venv, url, tok, isl, out, rate=None, count=3, warmup=0, seed=100 + k), out, tmp / "ahome")
        if "run_failed" in got:
            raise SystemExit(f"AIPerf's calibration run failed: {got['run_failed']}")
        server = statistics.median(got["prompt_tokens"])
        tries.append({"isl": isl, "server_prompt_tokens": sorted(set(got["prompt_tokens"]))})
        if server == target:
            return isl, tries
        isl = max(1, isl + round(target - server))
    raise SystemExit(f"AIPerf's prompts never came to {target} server tokens: {tries}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="2,4,8,16", help="requests/s, comma-separated, or auto")
    ap.add_argument("--arrival", choices=("constant", "poisson"), default="constant")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="the prompt as the SERVER counts it")
    ap.add_argument("--osl", type=int, default=32)
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--slots", type=int, default=4, help="llama-server -np")
    ap.add_argument("--ctx", type=int, default=4096, help="llama-server -c (split over the slots)")
    ap.add_argument("--threads", type=int, default=0, help="llama-server -t (0: its default)")
    ap.add_argument("--threads-http", type=int, default=320,
                    help="llama-server --threads-http: one thread serves one connection, its default (slots + 2) leaves "
                         "connections beyond it waiting for an idle one's 5-s keep-alive timeout; metralectl's rate "
                         "suite opens max_inflight (256) up front, AIPerf as many as it needs")
    ap.add_argument("--server-arg", action="append", default=[], help="one more llama-server argument (e.g. -ngl=99)")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--aiperf-venv", default=None)
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--gguf", default=None, help="a GGUF of build_tiny_gguf.py (any preset: one tokenizer)")
    ap.add_argument("--tokenizer", default=None, help="its tokenizer folder (default: written here)")
    ap.add_argument("--metralectl", default="wheel", help="wheel (default), tree, or a Python with metralectl installed")
    ap.add_argument("--metralectl-param", action="append", default=[], metavar="K=V")
    ap.add_argument("--workdir", default=None, help="keep the logs and records here (default: a temp folder)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    a = ap.parse_args()
    a.server_arg = [x for s in a.server_arg for x in s.split("=", 1)]
    # a `timeout` (the H200 script's) sends SIGTERM: unwind, so the server (its own session) is stopped below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    venv = aiperf_venv(a.aiperf_venv)
    tmp = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="aiperf-rate-"))
    tmp.mkdir(parents=True, exist_ok=True)
    mctl, menv, mwhat = metralectl_python(a.metralectl, tmp)
    gguf, tok = model(a, tmp)
    (tmp / "ahome").mkdir(exist_ok=True)
    base = [f"arrival={a.arrival}", f"isl={a.prompt_tokens}", f"osl={a.osl}", f"duration_s={a.duration_s:g}",
            f"warmup_s={a.warmup_s:g}", "client_bound=warn", "continuous_usage=false", "temperature=0",
            *a.metralectl_param]
    server, server_cmd, url = serve(a, gguf, tmp / "llama-server.log")
    doc: dict[str, Any] = {"server": " ".join(server_cmd), "metralectl": mwhat, "arrival": a.arrival, "osl": a.osl,
                           "prompt_tokens": a.prompt_tokens, "duration_s": a.duration_s, "warmup_s": a.warmup_s,
                           "tolerance": a.tolerance, "commands": {}, "rows": []}
    try:
        doc["aiperf_version"] = sh([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
                                   "aiperf version").stdout.strip()
        if a.rates == "auto":
            cmd, probe = run_metralectl(mctl, menv, url, tmp / "mhome-auto", base + ["rates=auto", "knee_attainment=0"], tmp)
            if "run_failed" in probe:
                raise SystemExit(f"metralectl's rates=auto sweep failed: {probe['run_failed']}")
            doc["auto"] = {"command": " ".join(cmd), "rates": probe["rates"], "saturation": probe["saturation"]}
            rates = probe["rates"]
        else:
            rates = [float(x) for x in a.rates.split(",")]
        isl = a.prompt_tokens  # until calibrated
        for k, rate in enumerate(rates):
            row: dict[str, Any] = {"rate": rate}
            for tool in (("metralectl", "aiperf") if k % 2 == 0 else ("aiperf", "metralectl")):
                if tool == "metralectl":
                    cmd, row[tool] = run_metralectl(mctl, menv, url, tmp / f"mhome{k}", base + [f"rates={rate:g}"], tmp)
                else:
                    if "aiperf_isl" not in doc:  # AIPerf's prompts to the server count of metralectl's first run
                        target = round(statistics.median(row["metralectl"].get("prompt_tokens") or [a.prompt_tokens]))
                        isl, doc["calibration"] = calibrate(a, venv, url, tok, tmp, target)
                        doc["aiperf_isl"] = isl
                    out = tmp / f"aiperf-r{k}"
                    cmd = aiperf_cmd(a, venv, url, tok, isl, out, rate=rate, count=max(1, round(rate * a.duration_s)),
                                     warmup=round(rate * a.warmup_s), seed=k)
                    row[tool] = run_aiperf(cmd, out, tmp / "ahome")
                doc["commands"][tool] = " ".join(cmd)
            row.update(T.agreement(row, a.tolerance))
            doc["rows"].append(row)
            print(T.row_line(row), file=sys.stderr)
            save(doc, a)  # after every rate: a run cut short keeps what it measured
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    print(save(doc, a))
    return 0 if doc["rows"] and all(r["complete"] for r in doc["rows"]) else 1


def save(doc: dict[str, Any], a: argparse.Namespace) -> str:
    md = T.markdown(doc)
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1, default=str))
    if a.md:
        Path(a.md).write_text(md)
    return md


if __name__ == "__main__":
    sys.exit(main())
