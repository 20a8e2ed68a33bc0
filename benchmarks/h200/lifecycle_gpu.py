"""The lifecycle on a real engine run as a host process, driven through metralectl's own CLI, recorded:

    run A → ps → logs → top --once --json → bench run decode → swap B → ps → logs → bench → swap DAMAGED (must
    roll back to B, exit 1) → ps → logs → bench (B still serves) → stop → GPU memory back at its idle level →
    no engine left

    python3 benchmarks/h200/lifecycle_gpu.py --res DIR --metralectl EXE --models MODELS.json
        [--engine-dir DIR] [--hardware hopper] [--ngl all] [--ctx 8192] [--parallel 4] [--port 18180]
        [--bench-param KEY=VALUE ...] [--threads N]

MODELS.json is make_lifecycle_models.py's summary. Everything metralectl writes (METRALE_HOME: run records,
swap records, engine logs, process state; its config: the recipes) goes under DIR, beside `lifecycle.json`
(every step: argv, exit status, wall times, stdout parsed, NVML memory around it) and steps/NN-NAME.{out,err}
(stderr lines stamped with the wall time they arrived, so the swap's phases can be read off metralectl's own
events). GPU memory is sampled every 50 ms from NVML for the whole run (gpu-samples.csv); with no NVML the run
still goes through every step and says "no GPU". summarize_lifecycle.py turns DIR into the table and
check_lifecycle.py fails loudly on every expectation that does not hold. Standard library + the metralectl it
drives; pynvml where there is a GPU. Exit status: 0 when every step ran (not a verdict: see the checker).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_sampler import GpuSampler  # noqa: E402

RECIPE = """schema: 1
name: {name}
description: {what} (random-weight F16 GGUF) on llama-server ({runtime_word})
engine: llama-cpp
{runtime}checkpoint: {{repo: {repo}, quant: F16, model: qwen3.5-35b-a3b, revision: null}}
hardware: {hardware}
image: lifecycle-llama
serve: {{ctx-size: {ctx}, parallel: {parallel}, n-gpu-layers: {ngl}, alias: {name}, ui: false{threads}}}
resources: {{port: {port}, bind: 127.0.0.1, gpus: {gpus}, ranks: 1}}
validated: {{source: null, hardware: {hardware}}}
"""
# The recipe checker asks every recipe for an image of its hardware class; a process-run recipe never pulls it
# (`--runtime docker` runs the same lifecycle in containers of --image-ref: a comparison, and a dry run of this
# script where no process runtime exists yet).
IMAGE = """schema: 1
id: lifecycle-llama
ref: {ref}
engine: llama-cpp
hardware: [{hardware}]
platform: linux/amd64
revision-label: org.opencontainers.image.version
"""


class Lifecycle:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.res: Path = args.res.resolve()
        self.steps_dir = self.res / "steps"
        self.steps_dir.mkdir(parents=True, exist_ok=True)
        self.models = json.loads(args.models.read_text())
        self.env = self._env()
        self.gpu = GpuSampler.open()
        self.steps: list[dict[str, Any]] = []
        self.names = {"a": "lc-a", "b": "lc-b", "damaged": "lc-damaged"}
        self.url = f"http://127.0.0.1:{args.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(METRALE_HOME=str(self.res / "metrale"), METRALECTL_CONFIG_DIR=str(self.res / "config"),
                   METRALECTL_CACHE_DIR=str(self.res / "cache"), METRALECTL_LOCK_DIR=str(self.res),
                   HF_HUB_CACHE=self.models["hf_cache"], NO_COLOR="1", PYTHONUNBUFFERED="1", COLUMNS="200")
        env.pop("HF_HOME", None)
        if self.args.engine_dir:  # the engine file's executable is looked up on PATH
            env["PATH"] = f"{self.args.engine_dir.resolve()}{os.pathsep}{env.get('PATH', '')}"
        return env

    def write_recipes(self) -> None:
        config = self.res / "config"
        (config / "recipes").mkdir(parents=True, exist_ok=True)
        (config / "images").mkdir(parents=True, exist_ok=True)
        a = self.args
        (config / "images" / "lifecycle-llama.yaml").write_text(IMAGE.format(hardware=a.hardware, ref=a.image_ref))
        runtime = "runtime: process\n" if a.runtime == "process" else ""
        threads = f", threads: {a.threads}" if a.threads else ""
        what = {"a": "lifecycle model A", "b": "lifecycle model B", "damaged": "a truncated copy of A"}
        for key, name in self.names.items():
            (config / "recipes" / f"{name}.yaml").write_text(RECIPE.format(
                name=name, what=what[key], runtime=runtime, runtime_word=a.runtime, repo=self.models[key]["repo"], hardware=a.hardware, ctx=a.ctx,
                parallel=a.parallel, ngl=a.ngl, threads=threads, port=a.port, gpus=a.gpus))

    # --- one CLI call, recorded -------------------------------------------------------------------------
    def cli(self, name: str, *argv: str, timeout: float = 600.0) -> dict[str, Any]:
        index = len(self.steps) + 1
        cmd = [*shlex.split(self.args.metralectl), *argv]
        out_path, err_path = self.steps_dir / f"{index:02d}-{name}.out", self.steps_dir / f"{index:02d}-{name}.err"
        print(f"[{time.strftime('%H:%M:%S')}] step {index:02d} {name}: metralectl {' '.join(argv)}", flush=True)
        if self.args.deadline:  # the device's call has a hard end: leave time for the stop, the summary and the tar
            timeout = min(timeout, self.args.deadline - time.time())
        if timeout < 5:
            step: dict[str, Any] = {"index": index, "name": name, "argv": ["metralectl", *argv], "rc": None, "skipped": True,
                    "t_start": time.time(), "t_end": time.time(), "seconds": 0.0, "json": None, "stdout": "",
                    "stderr": "", "gpu": {"before_mib": None, "after_mib": None, "max_mib": None, "processes_after": []}}
            print("    SKIPPED: past the deadline", flush=True)
            self.steps.append(step)
            return step
        before, t0 = self.gpu.used_mib(), time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env, text=True,
                                cwd=self.res, start_new_session=False)
        stamped: list[tuple[float, str]] = []
        chunks: list[str] = []
        # one reader per pipe (communicate() would read stderr too, and take lines before they are stamped)
        readers = [threading.Thread(target=lambda: stamped.extend((time.time(), line.rstrip("\n"))
                                                                  for line in proc.stderr), daemon=True),  # type: ignore[union-attr]
                   threading.Thread(target=lambda: chunks.extend(proc.stdout), daemon=True)]  # type: ignore[arg-type]
        for r in readers:
            r.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # Ctrl-C: metralectl cleans up what it started, and says so
            try:
                proc.wait(timeout=30)
                stamped.append((time.time(), f"[lifecycle_gpu: interrupted after {timeout:.0f} s]"))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                stamped.append((time.time(), f"[lifecycle_gpu: killed after {timeout:.0f} s + 30 s]"))
        for r in readers:
            r.join(timeout=10)
        t1 = time.time()
        stdout = "".join(chunks)
        out_path.write_text(stdout)
        err_path.write_text("".join(f"{t:.3f}\t{line}\n" for t, line in stamped))
        try:
            parsed = json.loads(stdout) if stdout.strip() else None
        except ValueError:
            parsed = None
        samples = self.gpu.between(t0, t1)
        step = {"index": index, "name": name, "argv": ["metralectl", *argv], "rc": proc.returncode,
                "t_start": round(t0, 3), "t_end": round(t1, 3), "seconds": round(t1 - t0, 3), "json": parsed,
                "stdout": out_path.name, "stderr": err_path.name,
                "gpu": {"before_mib": before, "after_mib": self.gpu.used_mib(),
                        "max_mib": max((s.used_mib for s in samples), default=None),
                        "processes_after": self.gpu.processes()}}
        self.steps.append(step)
        print(f"    exit {proc.returncode} in {t1 - t0:.1f} s"
              + (f"; GPU memory {before:.0f} -> {step['gpu']['after_mib']:.0f} MiB" if before is not None else ""),
              flush=True)
        if proc.returncode != 0:
            for _, line in stamped[-8:]:
                print(f"    | {line}", flush=True)
        return step

    def bench(self, name: str, repeats: int) -> dict[str, Any]:
        params = [x for p in self.args.bench_param for x in ("-p", p)]
        return self.cli(name, "bench", "run", "decode", "--url", self.url, "-p", f"repeats={repeats}",
                        "-p", f"max_tokens={self.args.max_tokens}", *params, "--format", "json", timeout=300)

    # --- the run ---------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        a, n = self.args, self.names
        self.write_recipes()
        self.gpu.start()
        print(self.gpu.why_not or f"GPU: {self.gpu.name}, {self.gpu.total_mib:.0f} MiB (NVML, every 50 ms)", flush=True)
        began = time.time()
        time.sleep(1.0)  # the idle level, before anything is started
        idle = self._level(began, time.time())
        self.cli("version", "--version", timeout=60)
        self.cli("recipes-check", "recipes", "check", str(self.res / "config" / "recipes"), timeout=120)
        self.cli("print-a", "run", n["a"], "--print", timeout=60)
        boot = ("--boot-timeout", f"{a.boot_timeout:g}")  # metralectl fails a stuck start itself, and cleans up
        self.cli("run-a", "run", n["a"], "--json", "--detach", *boot, timeout=a.boot_timeout + 60)
        self.cli("ps-a", "ps", "--json", timeout=60)
        self.cli("logs-a", "logs", n["a"], "--tail", "5000", timeout=60)  # the engine's own clock, for the load
        top = self.cli("top-once", "top", "--once", "--json", "--interval", "1", timeout=60)
        if not _top_found(top.get("json"), self.url):  # discovery failed: still read it by URL for the record
            self.cli("top-once-url", "top", "--once", "--json", "--interval", "1", "--url", self.url, timeout=60)
        self.bench("bench-a", a.bench_repeats)
        self.cli("swap-b", "swap", n["b"], "--json", *boot, timeout=a.boot_timeout + 60)
        self.cli("ps-b", "ps", "--json", timeout=60)
        self.cli("logs-b", "logs", n["b"], "--tail", "5000", timeout=60)
        self.bench("bench-b", a.bench_repeats)
        self.cli("swap-damaged", "swap", n["damaged"], "--json", *boot, timeout=2 * a.boot_timeout + 60)
        self.cli("ps-after-rollback", "ps", "--json", timeout=60)
        self.cli("logs-b-after-rollback", "logs", n["b"], "--tail", "5000", timeout=60)
        self.bench("bench-b-after-rollback", a.bench_repeats)
        if self.args.deadline:  # the stop gets its time whatever the steps before it took
            self.args.deadline += 60
        stop = self.cli("stop", "stop", "--json", timeout=120)
        time.sleep(a.settle_s)  # keep sampling: how soon after stop the memory is back, and that it stays back
        after_stop = {"samples_until_s": a.settle_s, "processes": self.gpu.processes()}
        self.cli("ps-after-stop", "ps", "--json", timeout=60)
        leftovers = {"engine_processes": _engine_processes(a.port), "port_listening": _listening(a.port)}
        self.gpu.stop()
        record = {
            "schema": 1, "started": began, "finished": time.time(), "url": self.url, "names": n,
            "models": {k: {f: self.models[k].get(f) for f in ("repo", "bytes", "params", "sha256")}
                       for k in ("a", "b", "damaged")},
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "gpu": {**self.gpu.describe(), "idle_mib": idle, "after_stop": after_stop,
                    "stop_t_end": stop["t_end"]},
            "leftovers": leftovers, "steps": self.steps,
        }
        with (self.res / "gpu-samples.csv").open("w") as f:
            f.write("t,used_mib\n")
            f.writelines(f"{s.t:.3f},{s.used_mib}\n" for s in self.gpu.snapshot())
        (self.res / "lifecycle.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        return record

    def _level(self, t0: float, t1: float) -> float | None:
        values = sorted(s.used_mib for s in self.gpu.between(t0, t1))
        return values[len(values) // 2] if values else self.gpu.used_mib()


def _top_found(doc: Any, url: str) -> bool:
    engines = doc.get("engines") if isinstance(doc, dict) else None
    return isinstance(engines, list) and any(isinstance(e, dict) and e.get("url") == url for e in engines)


def _engine_processes(port: int) -> list[dict[str, Any]]:
    """Every llama-server process serving on our port (there must be none after stop), from /proc: another
    program's llama-server on another port (a shared machine) is not ours to count."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            exe = os.readlink(d / "exe")
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = any(a in (b"--port", b"-p") and b == str(port).encode() for a, b in zip(argv, argv[1:]))
        if os.path.basename(exe).startswith("llama-server") and ours:
            found.append({"pid": int(d.name), "exe": exe, "argv": [a.decode(errors="replace") for a in argv[:12]]})
    return found


def _listening(port: int) -> bool:
    """Whether anything accepts connections on the served port (nothing may, after stop)."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--res", type=Path, required=True, help="the results folder (created)")
    ap.add_argument("--metralectl", required=True,
                    help="the metralectl command to drive: a venv's bin/metralectl, or e.g. 'python3 -m metralectl'")
    ap.add_argument("--models", type=Path, required=True, help="make_lifecycle_models.py --json's summary")
    ap.add_argument("--engine-dir", type=Path, help="the folder holding llama-server (put first on PATH)")
    ap.add_argument("--runtime", choices=("process", "docker"), default="process")
    ap.add_argument("--image-ref", default="metralectl-test/llama-server:lifecycle",
                    help="the recipes' image (run only with --runtime docker)")
    ap.add_argument("--hardware", default="hopper")
    ap.add_argument("--gpus", default="all", help="resources.gpus of the recipes (none for a CPU dry run)")
    ap.add_argument("--ngl", default="all", help="serve.n-gpu-layers (all: every layer on the GPU; 0 on a CPU)")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="serve.threads (0: the engine's default)")
    ap.add_argument("--port", type=int, default=18180)
    ap.add_argument("--bench-repeats", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--bench-param", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--boot-timeout", type=float, default=240.0,
                    help="metralectl's --boot-timeout for run and swap (the step itself gets 60 s more)")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="a Unix time no step may run past, 60 s before the hard end of the call (0: none); "
                         "the stop always gets its time")
    ap.add_argument("--settle-s", type=float, default=6.0, help="seconds of sampling after stop")
    args = ap.parse_args(argv)
    if shutil.which(shlex.split(args.metralectl)[0]) is None:
        ap.error(f"no such command: {args.metralectl}")
    Lifecycle(args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
