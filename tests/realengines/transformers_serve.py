"""Run Hugging Face `transformers serve` on a tiny random-weight Llama, as a plain subprocess.

Standard library only (no pytest, no httpx), so the same code serves the tests, and the H200 kit
through its command line:

    python3 tests/realengines/transformers_serve.py up --pidfile F --workdir D [--preset h200 --device cuda:0]
    python3 tests/realengines/transformers_serve.py down --pidfile F

(`up` prints one JSON line: url, model, model_dir, pid, log, versions; the server keeps running.)

The model is built once per machine (build_tiny_llama.py, cached under cache_root()) with the
interpreter that serves it: METRALECTL_TFSERVE_PYTHON names one (a venv with another transformers,
say), else the current one. The server gets its own HF_HOME in which the model sits in the hub cache
layout under a repo id (MODEL_IDS), the way a user's downloaded model does: then /v1/models lists it
in every version (up to 5.17 that route lists the hub cache, not what is served). layout="dir"
serves the directory path instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUILDER = HERE / "build_tiny_llama.py"
MODEL_ID = "metralectl-test/tiny-llama"
MODEL_IDS = {"tiny": MODEL_ID, "h200": "metralectl-test/random-llama-0.8b"}  # the served name, per preset
SNAPSHOT = "0" * 40
EOS_TOKEN_ID = 2  # build_tiny_llama.EOS
_PROBE = ("import json, tokenizers, torch, transformers, fastapi, uvicorn, openai; "
          "print(json.dumps({'transformers': transformers.__version__, 'torch': torch.__version__, "
          "'tokenizers': tokenizers.__version__, 'fastapi': fastapi.__version__, 'uvicorn': uvicorn.__version__}))")


class EngineUnavailable(RuntimeError):
    """The interpreter cannot run `transformers serve` (a package is missing): skip, not fail."""


def engine_python() -> str:
    return os.environ.get("METRALECTL_TFSERVE_PYTHON") or sys.executable


def engine_versions(python: str | None = None) -> dict[str, str]:
    """Versions of the serving stack in `python`; EngineUnavailable says what is missing."""
    python = python or engine_python()
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineUnavailable(f"{python}: {exc}") from exc
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineUnavailable(f"{python} cannot import the serving stack ({last}); install it with "
                                "`python3 -m pip install -r tests/realengines/requirements.txt`")
    return dict(json.loads(out.stdout))


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def cache_root() -> Path:
    """Where built models live: METRALECTL_TFSERVE_CACHE, else ~/.cache/metralectl-tests/tfserve."""
    explicit = os.environ.get("METRALECTL_TFSERVE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "metralectl-tests" / "tfserve"


def ensure_model(python: str | None = None, preset: str = "tiny", eos: str = "natural", seed: int = 0,
                 extra: Sequence[str] = ()) -> Path:
    """The cached model directory (built now when missing, with the serving interpreter)."""
    cmd = [python or engine_python(), str(BUILDER), "--cache-root", str(cache_root()), "--preset", preset,
           "--eos", eos, "--seed", str(seed), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"building the test model failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def pick_port() -> int:
    """A number that was free a moment ago: start() tries again on another when the server could not bind it
    (another program took it first). Standard library only, so not tests/ports.py's own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _hub_home(home: Path, model_dir: Path, model_id: str) -> None:
    """HF_HOME whose hub cache holds model_dir as model_id at refs/main (files linked, not copied)."""
    repo = home / "hub" / ("models--" + model_id.replace("/", "--"))
    snap = repo / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    (repo / "blobs").mkdir()
    for f in model_dir.iterdir():
        if f.is_file():
            (snap / f.name).symlink_to(f)


@dataclass
class TfServe:
    """One running `transformers serve`. `model` is what requests must name (or leave out)."""

    url: str  # http://127.0.0.1:PORT, without /v1
    model: str
    model_dir: Path  # also a tokenizer directory (tokenizer.json + tokenizer_config.json)
    log_path: Path
    versions: dict[str, str]
    proc: subprocess.Popen[bytes]
    workdir: Path
    keep_workdir: bool = False
    eos_token_id: int = EOS_TOKEN_ID
    command: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM to the server's process group, SIGKILL after `timeout`; idempotent."""
        _stop_group(self.proc.pid, self.proc, timeout)
        if not self.keep_workdir:
            shutil.rmtree(self.workdir / "hf", ignore_errors=True)


def _stop_group(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None:
            proc.poll()
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait(10)


def _die_with_parent() -> None:
    """In the child before exec: ask Linux for SIGKILL when the parent dies (PR_SET_PDEATHSIG).
    SIGKILL, not SIGTERM: uvicorn's graceful shutdown waits for open streams without a limit."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _post_json(url: str, body: dict[str, Any], timeout: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _wait_ready(srv: TfServe, timeout: float) -> None:
    """Ready means a chat completion came back 200: the model may load on the first request."""
    deadline = time.monotonic() + timeout
    body = {"model": srv.model, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1,
            "stream": True}  # streamed: with --input-validation, 5.4 accepts nothing else
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not srv.alive():
            raise RuntimeError(f"transformers serve exited ({srv.proc.returncode}) before it was ready; "
                               f"log {srv.log_path}:\n{srv.log_text()[-4000:]}")
        try:
            status, data = _post_json(srv.url + "/v1/chat/completions", body, timeout=max(1.0, deadline - time.monotonic()))
        except (OSError, urllib.error.URLError) as exc:
            last = str(exc)
            time.sleep(0.25)
            continue
        if status == 200 and b"finish_reason" in data:
            return
        raise RuntimeError(f"transformers serve answered {status} to its readiness request: {data[:500]!r}; "
                           f"log {srv.log_path}")
    raise RuntimeError(f"transformers serve not ready after {timeout:.0f} s ({last}); log {srv.log_path}")


def start(*, preset: str = "tiny", eos: str = "natural", seed: int = 0, layout: str = "hub",
          model_id: str | None = None, device: str = "cpu", extra_args: Sequence[str] = (),
          python: str | None = None, workdir: Path | None = None, ready_timeout: float = 300,
          threads: int | None = 1, port: int | None = None, attempts: int = 5,
          pidfile: Path | None = None, die_with_parent: bool = True) -> TfServe:
    """Build (once) and serve the model; returns when a request has completed. Call .stop() after.

    die_with_parent: the server is killed when this process dies, so a killed test run leaves no
    server behind (off for the `up` command, whose server outlives it). pidfile: written as soon as
    the server process exists, so whoever reads it can stop a server that never became ready."""
    python = python or engine_python()
    versions = engine_versions(python)
    model_dir = ensure_model(python, preset, eos, seed)
    keep = workdir is not None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="tfserve-"))
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "hf"
    shutil.rmtree(home, ignore_errors=True)
    if layout == "hub":
        served = model_id or MODEL_IDS.get(preset, f"metralectl-test/llama-{preset}")
        _hub_home(home, model_dir, served)
    elif layout == "dir":
        (home / "hub").mkdir(parents=True)  # /v1/models scans it and answers 500 when it is missing
        served = str(model_dir)
    else:
        raise ValueError(f"layout {layout!r}: use 'hub' or 'dir'")
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1",
           "TOKENIZERS_PARALLELISM": "false", "NO_COLOR": "1"}
    env.pop("HF_HUB_CACHE", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    for attempt in range(attempts):
        chosen = port or pick_port()
        log_path = workdir / f"transformers-serve-{chosen}.log"
        # before 5.5 (the serving rewrite) the model to pin is an option, not an argument
        pin = ["--force-model", served] if _version_tuple(versions["transformers"]) < (5, 5) else [served]
        cmd = [python, "-c", "from transformers.cli.transformers import main; main()", "serve", *pin,
               "--device", device, "--host", "127.0.0.1", "--port", str(chosen), "--log-level", "info",
               *extra_args]
        with open(log_path, "wb") as sink:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                    cwd=workdir, start_new_session=True,
                                    preexec_fn=_die_with_parent if die_with_parent else None)
        if pidfile is not None:
            pidfile.write_text(f"{proc.pid}\n")
        srv = TfServe(f"http://127.0.0.1:{chosen}", served, model_dir, log_path, versions, proc, workdir,
                      keep_workdir=keep, command=cmd)
        try:
            _wait_ready(srv, ready_timeout)
            return srv
        except BaseException as exc:
            srv.stop()
            if not isinstance(exc, RuntimeError):  # interrupted (SIGTERM, Ctrl-C): nothing left running
                raise
            log = srv.log_text()
            if port is None and attempt + 1 < attempts and "address already in use" in log.lower():
                continue  # another process took the port between our probe and the server's bind
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
                raise RuntimeError(f"{exc}\n--- its log, now removed ---\n{log[-4000:]}") from None
            raise
    raise AssertionError("unreachable")


@contextmanager
def transformers_serve(**kwargs: Any) -> Iterator[TfServe]:
    """start(**kwargs) as a context manager that always stops the server's process group."""
    srv = start(**kwargs)
    try:
        yield srv
    finally:
        srv.stop()
        if not srv.keep_workdir:
            shutil.rmtree(srv.workdir, ignore_errors=True)


def _recorded_alive(pidfile: Path) -> bool:
    try:
        os.killpg(int(pidfile.read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="start or stop transformers serve on the tiny test model")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start, wait until a request completes, print where it is, leave it running")
    up.add_argument("--pidfile", type=Path, required=True)
    up.add_argument("--workdir", type=Path, required=True, help="log and HF_HOME go here")
    up.add_argument("--preset", default="tiny")
    up.add_argument("--eos", default="natural", choices=("natural", "suppressed"))
    up.add_argument("--device", default="cpu")
    up.add_argument("--port", type=int)
    up.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the server (default: unset)")
    up.add_argument("--ready-timeout", type=float, default=600)
    up.add_argument("extra", nargs="*", help="more `transformers serve` options (after --)")
    down = sub.add_parser("down", help="stop the server a pidfile names (its whole process group)")
    down.add_argument("--pidfile", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "down":
        try:
            pid = int(args.pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError) as exc:
            print(f"transformers_serve down: no server recorded in {args.pidfile} ({exc})", file=sys.stderr)
            return 1
        _stop_group(pid, None, 20)
        args.pidfile.unlink(missing_ok=True)
        return 0
    if _recorded_alive(args.pidfile):
        print(f"transformers_serve up: {args.pidfile} names a server that is still running; "
              f"`down --pidfile {args.pidfile}` first", file=sys.stderr)
        return 1
    # `timeout` and the like send SIGTERM: unwind, so start() stops a server that is not ready yet
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        srv = start(preset=args.preset, eos=args.eos, device=args.device, port=args.port, workdir=args.workdir,
                    threads=args.threads, ready_timeout=args.ready_timeout, extra_args=args.extra,
                    pidfile=args.pidfile, die_with_parent=False)
    except (EngineUnavailable, RuntimeError) as exc:
        args.pidfile.unlink(missing_ok=True)
        print(f"transformers_serve up: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"url": srv.url, "model": srv.model, "model_dir": str(srv.model_dir), "pid": srv.proc.pid,
                      "log": str(srv.log_path), "versions": srv.versions}))
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
