#!/usr/bin/env python3
"""What `metralectl gateway` costs (a script, not a test): a REAL llama-server direct and through the gateway (and
LiteLLM's proxy), in one run, at each concurrency.

    PYTHONPATH=. python3 benchmarks/gateway_overhead.py [--design paired|sequential] [--connections fresh|keep-alive|fresh,keep-alive]
        [--concurrencies 1,16,64]
        [--rounds 3] [--duration 10] [--warmup 2] [--budget SECONDS] [--isl 128] [--osl 64] [--preset tiny|1b] [--llama-server PATH] [--python PY] [--json FILE]
        [--ngl 0|all --hardware cpu|hopper --gpus none|all] [--litellm PATH-TO-litellm]
        [--gateway-loops auto[,asyncio]] [--floor] [--baseline-python PY]

It lays out a box of its own in a temporary directory (config, state, HF cache with the tiny GGUF of
tests/real_llamacpp/build_tiny_gguf.py, no Docker), serves it with `metralectl run` as a host process (CI's cached
llama-server, found as the tests find it), starts `metralectl gateway` (with METRALECTL_GATEWAY_TIMING: it keeps its own time per
request, metralectl/gateway/timing.py), then measures in one of two designs. `--design paired` (the default; benchmarks/gateway_paired.py says how): one
client pool sends the same prompts over every path at the same moments, so the engine's noise cancels, and reports
bootstrap intervals and the gateway's own time from inside it; `--connections keep-alive` sends them over metralectl
bench's kept-alive transport instead of a connection per request. `--design sequential` (the first H200 figures,
benchmarks/results/h200_gateway_overhead.json): for each round and concurrency it runs
`metralectl bench run concurrency-sweep` once at the engine's own URL and once at the gateway's (which goes first
alternates by round, so drift over the run falls on both alike). Per concurrency it reports the medians over the
rounds of TTFT p50 and p99 of each, the added TTFT (gateway - direct) and the output tok/s ratio, against issue
32's targets: +0.3 ms p50, +1 ms p99, tok/s within 2 %. `--python` runs metralectl with another interpreter (a
wheel's venv: then this checkout is kept off its path, and every command runs outside it). `--litellm` adds LiteLLM's
proxy (its `litellm` command, from a venv of its own) routing the same engine as a third target in the same
rounds, so the gateway is compared with a peer under the same noise. `--gateway-loops auto,asyncio` runs a gateway on
each event loop (metralectl/gateway/loops.py) side by side (`auto@15`: one held to CPU 15); `--floor` adds benchmarks/relay_floor.c, a relay in C
that parses nothing: what one more process and loopback hop cost on that machine, which no relay avoids;
`--baseline-python` adds the gateway of another metralectl (an earlier wheel) as `gateway-baseline`. `--ngl/--hardware/--gpus` put the engine
on a GPU (the lent H200: docs/h200.md). `--json FILE` writes every request's figures (paired: and a markdown table
beside it, FILE.md). Exit 1 if any request failed; the targets are judged in the table, not the exit code (a busy
machine's noise is no verdict on the gateway).
"""

from __future__ import annotations

import argparse
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
TARGETS = {"ttft_p50_ms": 0.3, "ttft_p99_ms": 1.0, "tok_s_ratio": 0.02}


def connection_modes(value: str) -> str:
    """--connections: fresh, keep-alive, or both, comma-separated, each once."""
    asked = [m.strip() for m in value.split(",")]
    if not asked or len(set(asked)) != len(asked) or not set(asked) <= {"fresh", "keep-alive"}:
        raise argparse.ArgumentTypeError(f"{value!r}: fresh, keep-alive, or fresh,keep-alive")
    return ",".join(asked)


def llama_server() -> Path:
    out = subprocess.run(["bash", str(REPO / "scripts" / "build-llama-server.sh"), "--print-cache-dir"],
                         capture_output=True, text=True, timeout=60)
    binary = Path(out.stdout.strip()) / "bin" / "llama-server"
    if out.returncode != 0 or not os.access(binary, os.X_OK):
        sys.exit(f"gateway_overhead: llama-server is not built here ({binary}): run scripts/build-llama-server.sh")
    return binary


class Box:
    def __init__(self, home: Path, python: str, binary: Path, from_checkout: bool = True) -> None:
        self.home, self.python = home, python
        for name in ("config/recipes", "metrale", "cache", "hf/hub"):
            (home / name).mkdir(parents=True, exist_ok=True)
        (home / "config" / "engines.yaml").write_text(f"llama-cpp:\n  executable: {binary}\n")
        self.env = {**os.environ, "METRALECTL_CONFIG_DIR": str(home / "config"), "HF_HOME": str(home / "hf"),
                    "METRALE_HOME": str(home / "metrale"), "METRALECTL_CACHE_DIR": str(home / "cache"),
                    "METRALECTL_LOCK_DIR": str(home), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",
                    "DOCKER_HOST": f"unix://{home}/no-docker.sock"}
        self.env.pop("HF_HUB_CACHE", None)
        self.env.pop("PYTHONPATH", None)
        if from_checkout:
            self.env["PYTHONPATH"] = str(REPO)

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.python, "-m", "metralectl", *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout, cwd=self.home)  # never a checkout's root: it would shadow a wheel


def bench(box: Box, url: str, ns: argparse.Namespace, c: int) -> dict[str, Any]:
    out = box.cli("bench", "run", "concurrency-sweep", "--url", url, "-p", f"concurrencies={c}", "-p",
                  f"isls={ns.isl}", "-p", f"osl={ns.osl}", "-p", f"duration_s={ns.duration}", "-p",
                  f"warmup_s={ns.warmup}", "-p", f"model={ns.alias}", "-p", "client_bound=warn", "--format", "json")
    try:
        record = json.loads(out.stdout)
    except ValueError:
        return {"failed": f"bench exited {out.returncode}: {out.stderr.strip()[-500:]}"}
    key = f"c{c}_isl{ns.isl}_osl{ns.osl}."
    head = record.get("summary", {}).get("headline", {})
    sizing = record.get("prompt_sizing", {}).get(str(ns.isl), {})
    row = {"prompt_sizing": sizing.get("method"), "prompt_tokens": sizing.get("tokens"),
           "ttft_p50_ms": head.get(key + "ttft_ms_p50"), "ttft_p99_ms": head.get(key + "ttft_ms_p99"),
           "tok_s": head.get(key + "output_tok_s"), "requests": head.get(key + "requests"),
           "errors": head.get(key + "errors"), "status": record.get("status")}
    if out.returncode != 0 or row["errors"] or None in (row["ttft_p50_ms"], row["tok_s"]):
        row["failed"] = f"bench exited {out.returncode}, {row['errors']} errors: {out.stderr.strip()[-300:]}"
    return row


def gateway(ns: argparse.Namespace, box: Box, home: Path, port: int, loop: str,
            timing: Path | None = None, python: str | None = None) -> subprocess.Popen[str]:
    """`metralectl gateway` on port, on the event loop named, keeping its own time in `timing` if given. `LOOP@CPUS`
    (auto@15, auto@2-3) runs it on those CPUs only (sched_setaffinity, as `taskset -c` would): whether a gateway
    that wakes on a core of its own, its caches as it left them, costs less than one the scheduler moves about.
    `LOOP+busyMS` (auto+busy50@14) runs it with `--busy-poll MS` (gateway/busy.py)."""
    loop, _, cpus = loop.partition("@")
    loop, _, busy_ms = loop.partition("+busy")
    env = {**box.env, **({"METRALECTL_GATEWAY_TIMING": str(timing)} if timing else {})}
    own = []
    if ns.gateway_cpus and python is None:  # this wheel's gateway takes them itself (`gateway --cpus`, the product's
        own, cpus = ["--cpus", cpus or ns.gateway_cpus], ""  # way), or those of LOOP@CPUS among them (auto@14)
    elif not cpus and ns.gateway_cpus:  # another wheel's (the baseline): it may have no --cpus, so set from here
        cpus = ns.gateway_cpus
    chosen = {c for part in cpus.split(",") if part for a, _, b in [part.partition("-")]
              for c in range(int(a), int(b or a) + 1)}
    busy = ["--busy-poll", busy_ms] if busy_ms else []
    return subprocess.Popen([python or ns.python, "-m", "metralectl", "gateway", "--listen", f"127.0.0.1:{port}", "--json",
                             "--event-loop", loop, *own, *busy], stdout=subprocess.PIPE, text=True, cwd=home, env=env,
                            stderr=open(home / f"gateway-{port}.log", "w"),
                            preexec_fn=(lambda: os.sched_setaffinity(0, chosen)) if chosen else None)


def floor(home: Path, port: int, engine_port: int) -> subprocess.Popen[str]:
    """benchmarks/relay_floor.c, built here with cc, relaying port to the engine; returns once it listens."""
    binary = home / "relay_floor"
    built = subprocess.run([os.environ.get("CC", "cc"), "-O2", "-o", str(binary), str(REPO / "benchmarks" /
                            "relay_floor.c")], capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"gateway_overhead: --floor: cc could not build relay_floor.c:\n{built.stderr[-2000:]}")
    proc = subprocess.Popen([str(binary), str(port), str(engine_port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if not proc.stdout.readline().strip().isdigit():
        sys.exit(f"gateway_overhead: --floor: relay_floor exited {proc.wait()} before listening")
    return proc


def litellm(ns: argparse.Namespace, home: Path, port: int, engine_port: int) -> subprocess.Popen[str]:
    """LiteLLM's proxy routing `overhead` to the same engine (OpenAI-compatible provider), in the foreground of a
    child; returns once it answers a chat request (its readiness endpoint says ready before the router is)."""
    import urllib.request

    config = home / "litellm.yaml"
    config.write_text(f"model_list:\n  - model_name: {ns.alias}\n    litellm_params:\n      model: openai/{ns.alias}\n"
                      f"      api_base: http://127.0.0.1:{engine_port}/v1\n      api_key: none\n"
                      "litellm_settings:\n  telemetry: false\n"
                      # loopback only, as the gateway without keys: no master key, as LiteLLM allows for local use
                      "general_settings:\n  dangerously_permit_weak_or_unset_master_key: true\n")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
           "NO_DOCS": "True", "LITELLM_LOG": "ERROR"}
    env.pop("PYTHONPATH", None)
    log = open(home / "litellm.log", "w")
    proc = subprocess.Popen([str(ns.litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1"], stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=home)
    body = json.dumps({"model": ns.alias, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"gateway_overhead: LiteLLM exited {proc.returncode}:\n{(home / 'litellm.log').read_text()[-2000:]}")
        try:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                if answer.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    sys.exit(f"gateway_overhead: LiteLLM never answered:\n{(home / 'litellm.log').read_text()[-2000:]}")


def serve_setting(text: str) -> tuple[str, str]:
    """KEY=VALUE (a key of engine/llama-cpp.yaml's serve options; `metralectl run` checks it against them)."""
    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z][a-z0-9-]*", key) or not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. cache-ram=0")
    return key, value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--design", choices=("paired", "sequential"), default="paired")
    ap.add_argument("--connections", type=connection_modes, default="fresh",
                    help="paired: fresh (a connection per request on every path), keep-alive (metralectl bench's "
                         "kept-alive transport), or both (fresh,keep-alive: each round runs both, alternating)")
    ap.add_argument("--concurrencies", default="1,16,64")
    ap.add_argument("--budget", type=float, default=0, help="paired: run no phase that would end past this many "
                    "seconds from this script's start (what ran is reported); 0: no limit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--preset", default="tiny", choices=("tiny", "1b"))
    ap.add_argument("--llama-server", type=Path)
    ap.add_argument("--python", help="the interpreter that runs metralectl, from a wheel installed in its venv "
                    "(default: this one, from this checkout)")
    ap.add_argument("--json", type=Path, help="write the rows and the medians here")
    ap.add_argument("--ngl", default="0", help="serve.n-gpu-layers (all: every layer on the GPU)")
    ap.add_argument("--hardware", default="cpu", help="the recipe's hardware class (hopper on the H200)")
    ap.add_argument("--gpus", default="none", help="resources.gpus (all on a GPU box)")
    ap.add_argument("--litellm", type=Path, help="LiteLLM's `litellm` command: its proxy as a third target")
    ap.add_argument("--floor", action="store_true", help="a minimal relay in C (benchmarks/relay_floor.c, built "
                    "with cc) in front of the same engine as another target: what any relay process costs there")
    ap.add_argument("--gateway-loops", default="auto", help="the gateway's --event-loop; more than one (auto,asyncio) "
                    "starts a gateway on each, the first as `gateway` (its own time kept), the others `gateway-LOOP`; "
                    "LOOP@CPUS (auto@15) runs that one on those CPUs only, LOOP+busyMS (auto+busy50) with --busy-poll MS")
    ap.add_argument("--baseline-python", help="the interpreter of another metralectl (an earlier wheel's venv): its "
                    "gateway runs beside this one as `gateway-baseline`, in the same rounds (what a change gained)")
    ap.add_argument("--keep", type=Path, help="copy every bench run's records (requests.jsonl...) here")
    ap.add_argument("--gateway-cpus", metavar="LIST", help="the gateway on these CPUs (`metralectl gateway --cpus`), "
                    "the engine kept off them by metralectl (box.yaml's gateway-cpus) and this client too: "
                    "docs/gateway.md, \"Cores of its own\"")
    ap.add_argument("--serve", action="append", type=serve_setting, default=[], metavar="KEY=VALUE",
                    help="another of the engine's serve settings (repeatable): cache-ram=0 spares llama-server's "
                         "saving of its idle slots at each new request, milliseconds of the TTFT both paths share "
                         "(docs/gateway.md)")
    ns = ap.parse_args()
    ns.started = time.monotonic()
    ns.alias = "overhead"
    concurrencies = [int(c) for c in ns.concurrencies.split(",")]
    sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
    import build_tiny_gguf  # the test fixture's writer: stdlib + numpy + gguf

    from tests.ports import HeldPort

    from_checkout = ns.python is None
    ns.python = ns.python or sys.executable
    with tempfile.TemporaryDirectory(prefix="gw-overhead-") as tmp:
        box = Box(Path(tmp), ns.python, ns.llama_server or llama_server(), from_checkout)
        summary = build_tiny_gguf.install(Path(tmp) / "hf" / "hub", build_tiny_gguf.PRESETS[ns.preset])
        ports = {name: HeldPort() for name in ("direct", "gateway", "litellm", "floor")}  # held to the end: servers bind beside
        slots = max(concurrencies)
        image = "llama-cpp-cpu"
        kernel_model = "qwen2.5-0.5b-instruct" if ns.hardware == "cpu" else "qwen3.5-35b-a3b"  # one of the class's
        if ns.hardware != "cpu":  # the checker asks for an image of the recipe's class; a process never pulls it
            image = "overhead-llama"
            (Path(tmp) / "config" / "images").mkdir(exist_ok=True)
            (Path(tmp) / "config" / "images" / "overhead-llama.yaml").write_text(
                f"schema: 1\nid: overhead-llama\nref: metralectl-test/llama-server:overhead\nengine: llama-cpp\n"
                f"hardware: [{ns.hardware}]\nplatform: linux/amd64\nrevision-label: org.opencontainers.image.version\n")
        (Path(tmp) / "config" / "recipes" / "overhead.yaml").write_text(
            "schema: 1\nname: overhead\ndescription: the gateway's overhead benchmark\nengine: llama-cpp\n"
            f"runtime: process\ncheckpoint: {{repo: {summary['repo']}, quant: Q8_0, model: {kernel_model}, "
            f"revision: null}}\nhardware: {ns.hardware}\nimage: {image}\n"
            f"serve: {{ctx-size: {slots * (ns.isl + ns.osl + 64)}, parallel: {slots}, n-gpu-layers: {ns.ngl}, "
            f"alias: {ns.alias}, ui: false{''.join(f', {k}: {v}' for k, v in ns.serve)}}}\n"
            f"resources: {{port: {ports['direct'].port}, bind: 127.0.0.1, "
            f"gpus: {ns.gpus}, ranks: 1}}\nvalidated: {{source: null, hardware: {ns.hardware}}}\n")
        if ns.gateway_cpus:  # the engine kept off the gateway's CPUs by metralectl itself (box.yaml, seams/affinity.py)
            (Path(tmp) / "config" / "box.yaml").write_text(f'gateway-cpus: "{ns.gateway_cpus}"\n')
        run = box.cli("run", "overhead", "--no-weights-check")
        if run.returncode != 0:
            sys.exit(f"gateway_overhead: `metralectl run` failed:\n{run.stderr}")
        print(f"engine: {box.cli('ps').stdout.strip()}", file=sys.stderr)
        timing = Path(tmp) / "gateway-timing.jsonl"  # the gateway writes it as it stops
        servers = [gateway(ns, box, Path(tmp), ports["gateway"].port, ns.gateway_loops.split(",")[0], timing)]
        targets = ["direct", "gateway"]
        try:
            assert servers[0].stdout is not None
            json.loads(servers[0].stdout.readline())  # its "listening" line: it routes from here on
            for loop in ns.gateway_loops.split(",")[1:]:  # more gateways, each on another event loop
                ports[f"gateway-{loop}"] = HeldPort()
                servers.append(gateway(ns, box, Path(tmp), ports[f"gateway-{loop}"].port, loop))
                json.loads(servers[-1].stdout.readline())  # type: ignore[union-attr]
                targets.append(f"gateway-{loop}")
            if ns.baseline_python:
                ports["gateway-baseline"] = HeldPort()
                servers.append(gateway(ns, box, Path(tmp), ports["gateway-baseline"].port, "auto",
                                       python=ns.baseline_python))
                json.loads(servers[-1].stdout.readline())  # type: ignore[union-attr]
                targets.append("gateway-baseline")
            if ns.floor:
                servers.append(floor(Path(tmp), ports["floor"].port, ports["direct"].port))
                targets.append("floor")
            if ns.litellm:
                servers.append(litellm(ns, Path(tmp), ports["litellm"].port, ports["direct"].port))
                targets.append("litellm")
            if ns.gateway_cpus:  # and this client too, once every server has started
                from metralectl.core.cpulist import parse

                os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - parse(ns.gateway_cpus))
            urls = {name: f"http://127.0.0.1:{held.port}" for name, held in ports.items()}
            rows: list[dict[str, Any]] = []
            if ns.design == "paired":
                import gateway_paired

                phases = gateway_paired.run({t: urls[t] for t in targets}, concurrencies, ns)
            for round_ in range(ns.rounds if ns.design == "sequential" else 0):
                for c in concurrencies:
                    for target in targets[round_ % len(targets):] + targets[:round_ % len(targets)]:
                        row = {"round": round_, "concurrency": c, "target": target, **bench(box, urls[target], ns, c)}
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            for server in servers:
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
            box.cli("stop", "--all", timeout=120)
            if ns.keep and (Path(tmp) / "metrale" / "runs").is_dir():
                shutil.copytree(Path(tmp) / "metrale" / "runs", ns.keep, dirs_exist_ok=True)
            for held in ports.values():
                held.close()
            own = [json.loads(line) for line in timing.read_text().splitlines()] if timing.exists() else []
    if ns.design == "paired":
        return paired_report(phases, own, concurrencies, targets[1:], ns)
    return report(rows, concurrencies, ns)


def paired_report(phases: list[dict[str, Any]], own: list[dict[str, Any]], concurrencies: list[int],
                  vias: list[str], ns: argparse.Namespace) -> int:
    import gateway_paired

    from metralectl.safetext import clean

    summary = gateway_paired.report(phases, own, concurrencies, vias, TARGETS)
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    errors = [e for p in phases for e in p["errors"]]
    for e in errors[:20]:
        print(f"failed: {clean(e, 500)}", file=sys.stderr)  # an engine's words: escaped before a terminal
    if ns.json:
        kept = [{k: v for k, v in p.items() if k != "groups"} | {"requests": [
            {path: g[path] for path in g if path != "at"} for g in p["groups"]]} for p in phases]
        ns.json.write_text(json.dumps({"design": "paired-concurrent", "summary": summary, "targets": TARGETS,
                                       "phases": kept, "gateway_inside": own,
                                       "params": {k: str(v) for k, v in vars(ns).items() if k != "prompts"}},
                                      indent=1))
        ns.json.with_suffix(".md").write_text(gateway_paired.markdown(
            summary, " ".join([Path(sys.executable).name, *sys.argv]),
            f"Design: paired-concurrent (benchmarks/gateway_paired.py), connections "
            f"{getattr(ns, 'connections', 'fresh')}. Added = via - direct, ms, 95 % bootstrap "
            f"intervals over the groups; targets +{TARGETS['ttft_p50_ms']} ms p50, +{TARGETS['ttft_p99_ms']} ms p99, "
            f"tok/s at most {TARGETS['tok_s_ratio']:.0%} below; "
            f"held / missed / open: the interval within, beyond, across."))
    return 1 if errors or not summary else 0


def report(rows: list[dict[str, Any]], concurrencies: list[int], ns: argparse.Namespace) -> int:
    """Per concurrency and per proxy (the gateway; LiteLLM when it ran): the medians over the rounds against the
    direct runs of the same rounds. The targets are the gateway's; LiteLLM's row is the comparison."""
    failed = [r for r in rows if r.get("failed")]
    medians: list[dict[str, Any]] = []
    proxies = [t for t in ("gateway", "litellm") if any(r["target"] == t for r in rows)]
    print(f"{'c':>4} {'via':>8} {'direct p50':>11} {'via p50':>9} {'+p50 ms':>8} {'direct p99':>11} {'via p99':>9} "
          f"{'+p99 ms':>8} {'tok/s ratio':>11}  targets (+{TARGETS['ttft_p50_ms']} / +{TARGETS['ttft_p99_ms']} ms, "
          f"tok/s -{TARGETS['tok_s_ratio']:.0%})")
    for c in concurrencies:
        def med(target: str, key: str) -> float:
            return statistics.median(r[key] for r in rows if r["concurrency"] == c and r["target"] == target
                                     and not r.get("failed") and r[key] is not None)
        for via in proxies:
            try:
                d50, g50, d99, g99 = med("direct", "ttft_p50_ms"), med(via, "ttft_p50_ms"), \
                    med("direct", "ttft_p99_ms"), med(via, "ttft_p99_ms")
                ratio = med(via, "tok_s") / med("direct", "tok_s")
            except statistics.StatisticsError:
                print(f"{c:>4} {via:>8}  no measurement (see the failed runs)")
                continue
            held = (g50 - d50 <= TARGETS["ttft_p50_ms"], g99 - d99 <= TARGETS["ttft_p99_ms"],
                    ratio >= 1 - TARGETS["tok_s_ratio"])  # one-sided, as in gateway_paired: faster is no cost
            medians.append({"concurrency": c, "via": via, "direct_ttft_p50_ms": d50, "via_ttft_p50_ms": g50,
                            "direct_ttft_p99_ms": d99, "via_ttft_p99_ms": g99, "tok_s_ratio": ratio,
                            "targets_held": all(held)})
            verdict = "held" if all(held) else "missed: " + ", ".join(
                n for n, h in zip(("p50", "p99", "tok/s"), held) if not h)
            print(f"{c:>4} {via:>8} {d50:>11.2f} {g50:>9.2f} {g50 - d50:>+8.2f} {d99:>11.2f} {g99:>9.2f} "
                  f"{g99 - d99:>+8.2f} {ratio:>11.3f}  {verdict}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    for r in failed:
        print(f"failed: c={r['concurrency']} {r['target']} round {r['round']}: {r['failed']}", file=sys.stderr)
    if ns.json:
        ns.json.write_text(json.dumps({"rows": rows, "medians": medians, "targets": TARGETS,
                                       "params": {k: str(v) for k, v in vars(ns).items()}}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
