#!/usr/bin/env python3
"""Benchmark-client benchmark (a script, not a test): timing error and capacity of metralectl's load
generator against GuideLLM and AIPerf, all driving the same ground-truth server in the same run.

The truth server (tests/bench_truth/truth_server.py) streams `--tokens` tokens per request, TTFT
`--ttft-ms`, one token every `--itl-ms`, and stamps each event just before writing it. For every tool
and concurrency it records, per request: TTFT (request received -> first write), E2E (-> last write) and
mean ITL. Each tool's own per-request numbers are compared quantile by quantile with the truth:
    error p50 = max |tool p50 - truth p50| over TTFT, E2E, ITL   (budget 0.5 ms)
    error p99 = max |tool p99 - truth p99| over the same         (budget 2 ms)
metralectl's per-token stamps are also matched event by event (column "matched p99").
Capacity: the highest event rate a tool sustained (>= 90 % of what the schedule offers) within budget.
CPU per event: the tool process tree's CPU (rusage), minus the same tool's start-up cost (a 1-request
run), divided by the events the server wrote.

    PYTHONPATH=. python3 benchmarks/bench_client.py [--concurrencies 1,4,16,64,...] [--tools ...] [--json FILE]
        [--peers-bin /tmp/peers/bin] [--tokenizer DIR] [--aiohttp-python /tmp/aio/bin/python]

GuideLLM and AIPerf: `pip install guidellm aiperf tokenizers` (a separate venv is fine: --peers-bin).
They need a local tokenizer offline; without --tokenizer a tiny word-level one is built in a temp dir.

A measurement counts only when the tool exited 0, every request it sent succeeded and was reported, and the
server wrote the events; otherwise its row says "failed: why" and the script exits 1 (after the table).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metralectl.bench.stats import percentile

BUDGET_P50_MS, BUDGET_P99_MS, KEEP_UP = 0.5, 2.0, 0.9


# --- the metralectl client, in its own process (so its CPU is measured like the others') -------------
def as_client(ns: argparse.Namespace) -> None:
    from metralectl.bench.loadgen import LoadSpec
    from metralectl.bench.prompts import RequestFactory
    from metralectl.bench.shard import run_load
    from tests.bench_truth.helpers import errors_vs_truth, fetch_truth

    # sharding needs a time-bounded window: run ~rounds request lengths instead of a count
    duration = (ns.requests / ns.concurrency) * (ns.ttft_ms + ns.tokens * ns.itl_ms) / 1e3
    spec = (LoadSpec(concurrency=ns.concurrency, requests=ns.requests, transport=ns.transport) if ns.workers == 1 else
            LoadSpec(concurrency=ns.concurrency, duration_s=duration, transport=ns.transport))
    factory = RequestFactory(model="truth-model", max_tokens=ns.tokens, text="hello", continuous_usage=False)
    out = run_load(spec, ns.url, "/v1/chat/completions", factory, workers=ns.workers)
    ok = [r for r in out.results if r.ok and r.phase == "measure"]
    matched = errors_vs_truth(ok, fetch_truth(ns.url))  # per token, against the same truth intervals
    rows = [{"ttft": r.ttft_ms, "e2e": r.e2e_ms, "itl": r.tpot_ms} for r in ok]
    # every request must succeed, warm-up included; only load past the measured window is cut short, by design
    failed = sum(1 for r in out.results if not r.ok and not (r.phase != "measure" and r.error_kind == "cancelled"))
    Path(ns.out).write_text(json.dumps({"rows": rows, "errors": failed, "health": out.health,
                                        "matched_p99": percentile([abs(x) for x in matched["token"]], 99)}))


# --- the peers ------------------------------------------------------------------------------------
def make_tokenizer(directory: Path, python: str) -> None:
    code = ("from tokenizers import Tokenizer, models, pre_tokenizers, decoders\nimport json, sys\n"
            "words = 'the of and to in is a that for it with as on be at by this from or word think hello'.split()\n"
            "vocab = {'[UNK]': 0, '<s>': 1, '</s>': 2}\nfor w in words: vocab.setdefault(w, len(vocab))\n"
            "t = Tokenizer(models.WordLevel(vocab=vocab, unk_token='[UNK]'))\n"
            "t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()\nt.decoder = decoders.WordPiece()\n"
            f"t.save('{directory}/tokenizer.json')\n"
            f"json.dump({{'tokenizer_class': 'PreTrainedTokenizerFast', 'unk_token': '[UNK]', 'bos_token': '<s>',"
            f" 'eos_token': '</s>', 'model_max_length': 100000}}, open('{directory}/tokenizer_config.json', 'w'))\n")
    subprocess.run([python, "-c", code], check=True)


def aiperf_cmd(ns: argparse.Namespace, url: str, c: int, n: int, tokens: int, out: Path) -> list[str]:
    return [f"{ns.peers_bin}/aiperf", "profile", "-m", "truth-model", "--url", url, "--endpoint-type", "chat",
            "--streaming", "--concurrency", str(c), "--request-count", str(n), "--use-server-token-count",
            "--tokenizer", str(ns.tokenizer), "--ui-type", "none", "--artifact-dir", str(out),
            "--prompt-output-tokens-mean", str(tokens), "--prompt-input-tokens-mean", "16",
            "--extra-inputs", "ignore_eos:true"]


def aiperf_rows(out: Path) -> list[dict[str, float]]:
    rows = []
    for line in (out / "profile_export.jsonl").read_text().splitlines():
        m = json.loads(line).get("metrics") or {}
        if "time_to_first_token" in m:
            rows.append({"ttft": m["time_to_first_token"]["value"], "e2e": m["request_latency"]["value"],
                         "itl": (m.get("inter_token_latency") or {}).get("value")})
    return rows


def guidellm_cmd(ns: argparse.Namespace, url: str, c: int, n: int, tokens: int, out: Path) -> list[str]:
    return [f"{ns.peers_bin}/guidellm", "run", "--backend",
            f"kind=openai_http,target={url},model=truth-model,request_format=/v1/chat/completions",
            "--profile", f"kind=concurrent,streams={c}", "--data", f"kind=synthetic_text,prompt_tokens=16,output_tokens={tokens}",
            "--tokenizer", f"kind=huggingface_auto,model={ns.tokenizer}", "--constraint", f"kind=max_requests,count={n}",
            "--output", f"kind=json,path={out / 'guidellm.json'}", "--disable-console-interactive"]


def guidellm_rows(out: Path) -> list[dict[str, float]]:
    data = json.loads((out / "guidellm.json").read_text())
    rows = []
    for r in data["benchmarks"][0]["requests"]["successful"]:
        t = r["info"]["timings"]
        start, first, last, n = t["request_start"], t["first_token_iteration"], t["last_token_iteration"], t["token_iterations"]
        rows.append({"ttft": (first - start) * 1e3, "e2e": (last - start) * 1e3,
                     "itl": (last - first) * 1e3 / (n - 1) if n and n > 1 else None})
    return rows


# --- one measurement --------------------------------------------------------------------------------
class Truth:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.bench_truth.truth_server", "--port", "0", "--record",
                                      "--ttft-ms", str(ns.ttft_ms), "--itl-ms", str(ns.itl_ms)],
                                     stdout=subprocess.PIPE, text=True, cwd=REPO)
        assert self.proc.stdout is not None
        said = self.proc.stdout.readline().split()  # "PORT N" once it listens
        if len(said) != 2 or said[0] != "PORT" or not said[1].isdigit():
            self.proc.kill()
            raise SystemExit(f"bench_client: the truth server did not start (exit {self.proc.wait()}): {said}")
        self.url = f"http://127.0.0.1:{int(said[1])}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=60) as resp:
            return json.loads(resp.read())

    def cpu_s(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def truth_rows(truth: dict[str, Any]) -> tuple[list[dict[str, Any]], int, float]:
    rows, events, first, last = [], 0, None, None
    for t in truth.values():
        ev = t["events"]
        if not ev:
            continue
        events += len(ev)
        first = min(first or t["t_req"], t["t_req"])
        last = max(last or ev[-1][0], ev[-1][0])
        n = len(ev) - 1
        # each event reached the client between the server's stamps before and after write(): [lo, hi]
        rows.append({"ttft": ((ev[0][0] - t["t_req"]) / 1e6, (ev[0][3] - t["t_req"]) / 1e6),
                     "e2e": ((ev[-1][0] - t["t_req"]) / 1e6, (ev[-1][3] - t["t_req"]) / 1e6),
                     "itl": ((ev[-1][0] - ev[0][3]) / 1e6 / n, (ev[-1][3] - ev[0][0]) / 1e6 / n) if n else None})
    return rows, events, ((last - first) / 1e9) if first and last else 0.0


def quantile_error(tool: list[dict[str, Any]], truth: list[dict[str, Any]],
                   detail: dict[str, float] | None = None) -> tuple[float | None, float | None]:
    """Distance of the tool's p50/p99 from the truth's [p(lo), p(hi)] interval, worst over TTFT, E2E, ITL
    (signed per metric into `detail`: positive = the tool reports more than the truth)."""
    worst = {50: 0.0, 99: 0.0}
    for key in ("ttft", "e2e", "itl"):
        a = [r[key] for r in tool if r.get(key) is not None]
        lo = [r[key][0] for r in truth if r.get(key) is not None]
        hi = [r[key][1] for r in truth if r.get(key) is not None]
        if not a or not lo:
            return None, None
        for q in worst:
            m, x, y = percentile(a, q), percentile(lo, q), percentile(hi, q)
            assert m is not None and x is not None and y is not None
            off = m - y if m > y else (m - x if m < x else 0.0)
            worst[q] = max(worst[q], abs(off))
            if detail is not None:
                detail[f"{key}_p{q}"] = round(off, 3)
    return worst[50], worst[99]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(ns: argparse.Namespace, tool: str, c: int, n: int, tokens: int) -> dict[str, Any]:
    server = Truth(ns)
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{tool}-"))
    try:
        if tool.startswith("metralectl"):
            transport, _, procs = tool.split(":", 1)[1].partition("@")
            python = ns.aiohttp_python if transport == "aiohttp" else sys.executable
            cmd = [python, str(Path(__file__).resolve()), "--as-client", "--url", server.url, "--concurrency", str(c),
                   "--requests", str(n), "--tokens", str(tokens), "--transport", transport, "--out", str(tmp / "m.json"),
                   "--workers", procs or "1"]
        elif tool == "aiperf":
            cmd = aiperf_cmd(ns, server.url, c, n, tokens, tmp)
        else:
            cmd = guidellm_cmd(ns, server.url, c, n, tokens, tmp)
        cpu0, scpu0, t0 = children_cpu(), server.cpu_s(), time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=ns.timeout,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        cpu, wall, server_cpu = children_cpu() - cpu0, time.monotonic() - t0, server.cpu_s() - scpu0
        if proc.returncode != 0:
            said = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
            return {"tool": tool, "c": c, "failed": f"exit {proc.returncode}: {said[-1][-300:] if said else 'no output'}"}
        truth_r, events, span = truth_rows(server.get("/truth"))
        matched, errors = None, 0
        try:
            if tool.startswith("metralectl"):
                m = json.loads((tmp / "m.json").read_text())
                rows, matched, errors = m["rows"], m["matched_p99"], m["errors"]
            else:
                rows = aiperf_rows(tmp) if tool == "aiperf" else guidellm_rows(tmp)
        except (OSError, ValueError, KeyError) as exc:
            return {"tool": tool, "c": c, "failed": f"exit 0 but no per-request results: {exc!r}"}
        bounded = tool.startswith("metralectl") and tool.partition("@")[2] not in ("", "1")  # by time, not count
        if errors or not rows or (not bounded and len(rows) < n) or not events:
            return {"tool": tool, "c": c, "failed": f"{errors} requests failed, {len(rows)} of {n} reported, "
                                                    f"{events} events written by the server"}
        detail: dict[str, float] = {}
        e50, e99 = quantile_error(rows, truth_r, detail)
        offered = c * tokens / ((ns.ttft_ms + (tokens - 1) * ns.itl_ms) / 1e3)
        rate = events / span if span else 0.0
        return {"tool": tool, "c": c, "requests": len(rows), "events": events, "event_rate": rate, "offered": offered,
                "keeps_up": rate >= KEEP_UP * offered, "err_p50_ms": e50, "err_p99_ms": e99, "matched_p99_ms": matched,
                "cpu_s": cpu, "wall_s": wall, "server_cpu_frac": server_cpu / wall if wall else None,
                "detail": detail, "within": e50 is not None and e99 is not None and e50 <= BUDGET_P50_MS
                and e99 <= BUDGET_P99_MS and (matched is None or matched <= BUDGET_P99_MS)}
    finally:
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--as-client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url"), ap.add_argument("--concurrency", type=int), ap.add_argument("--requests", type=int)
    ap.add_argument("--transport", default="raw"), ap.add_argument("--out"), ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3, help="requests per stream")
    ap.add_argument("--concurrencies", default="1,4,16,64,128,256,384,512,768")
    ap.add_argument("--tools", default="metralectl:raw,metralectl:raw-nostamp,metralectl:httpx,"
                                       "metralectl:aiohttp,aiperf,guidellm")
    ap.add_argument("--peers-bin", default="/tmp/peers/bin")
    ap.add_argument("--aiohttp-python", default="/tmp/aio/bin/python")
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", type=Path)
    ns = ap.parse_args()
    if ns.as_client:
        return as_client(ns)
    tools = [t for t in ns.tools.split(",") if t]
    if not Path(ns.aiohttp_python).exists():
        tools = [t for t in tools if t != "metralectl:aiohttp"]
    if not Path(f"{ns.peers_bin}/aiperf").exists() or not Path(f"{ns.peers_bin}/guidellm").exists():
        print(f"note: no aiperf/guidellm under {ns.peers_bin}; measuring metralectl only", file=sys.stderr)
        tools = [t for t in tools if t.startswith("metralectl")]
    if ns.tokenizer is None and any(not t.startswith("metralectl") for t in tools):  # the peers' need
        ns.tokenizer = Path(tempfile.mkdtemp(prefix="tok-"))
        make_tokenizer(ns.tokenizer, f"{ns.peers_bin}/python" if Path(f"{ns.peers_bin}/python").exists() else sys.executable)
    load0 = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} at start",
          file=sys.stderr)
    results: list[dict[str, Any]] = []
    for tool in tools:
        base = measure(ns, tool, 1, 1, 2)  # start-up cost, subtracted from CPU per event
        if "failed" in base:
            results.append(base)
            print(json.dumps(base), file=sys.stderr)
            continue
        startup = base["cpu_s"]
        misses = 0
        for c in [int(x) for x in ns.concurrencies.split(",")]:
            r = measure(ns, tool, c, c * ns.rounds, ns.tokens)
            r["startup_cpu_s"] = startup
            if r.get("events"):
                r["cpu_us_per_event"] = max(r["cpu_s"] - startup, 0.0) / r["events"] * 1e6
            results.append(r)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), file=sys.stderr)
            misses = 0 if r.get("keeps_up") else misses + 1
            if misses >= 2:  # two rungs in a row it could not keep up with: its ceiling is behind us
                break
    load1 = os.getloadavg()
    print_table(results, tools, load0, load1)
    if ns.json:
        ns.json.write_text(json.dumps({"load_start": load0, "load_end": load1, "results": results,
                                       "config": {k: str(v) for k, v in vars(ns).items()}}, indent=1))
    failed = [r for r in results if "failed" in r]
    if failed:
        for r in failed:
            print(f"NOT MEASURED: {r['tool']} at c={r['c']}: {r['failed']}", file=sys.stderr)
        sys.exit(1)


def _worst_metric(r: dict[str, Any]) -> str:
    detail = r.get("detail") or {}
    if not detail:
        return ""
    key = max(detail, key=lambda k: abs(detail[k]))
    return f"{key} {detail[key]:+.2f}" if detail[key] else ""


def print_table(results: list[dict[str, Any]], tools: list[str], load0: tuple[float, ...], load1: tuple[float, ...]) -> None:
    print(f"{'tool':<24}{'c':>6}{'events/s':>10}{'keeps up':>9}{'err p50':>9}{'err p99':>9}{'matched p99':>12}"
          f"{'µs CPU/ev':>10}{'server CPU':>11}  worst metric")
    for r in results:
        if "failed" in r:
            print(f"{r['tool']:<24}{r['c']:>6}  failed: {r['failed'][-80:]!r}")
            continue
        f = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"
        print(f"{r['tool']:<24}{r['c']:>6}{r['event_rate']:>10.0f}{'yes' if r['keeps_up'] else 'NO':>9}"
              f"{f(r['err_p50_ms']):>9}{f(r['err_p99_ms']):>9}{f(r['matched_p99_ms']):>12}"
              f"{f(r.get('cpu_us_per_event'), 1):>10}{f(r['server_cpu_frac'], 2):>11}  {_worst_metric(r)}")
    print("\ncapacity (highest event rate kept up within p50 <= 0.5 ms, p99 <= 2 ms; metralectl also per token):")
    for tool in tools:
        mine = [r for r in results if r["tool"] == tool and "event_rate" in r]
        good = [r for r in mine if r.get("within") and r.get("keeps_up")]
        best = max(good, key=lambda r: r["event_rate"]) if good else None
        up = max((r for r in mine if r.get("keeps_up")), key=lambda r: r["event_rate"], default=None)
        ref = next((r for r in mine if r.get("c") == 64 and "cpu_us_per_event" in r), None)
        print(f"  {tool:<24} within budget {best['event_rate'] if best else 0:>7.0f} ev/s (c={best['c'] if best else '-'}),"
              f"  keeping up at all {up['event_rate'] if up else 0:>7.0f} ev/s (c={up['c'] if up else '-'}),"
              f"  CPU per event at c=64 {ref['cpu_us_per_event'] if ref else float('nan'):.1f} µs")
    print(f"load average {load0[0]:.2f} at start, {load1[0]:.2f} at end (1-min), {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
