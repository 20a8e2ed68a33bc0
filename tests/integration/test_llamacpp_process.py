"""llama.cpp's real `llama-server` run as a host process (`runtime: process`), driven through the real CLI in a
subprocess on a box without Docker (DOCKER_HOST names no socket, as on the lent H200).

The binary is CI's cached build (scripts/build-llama-server.sh, found as tests/real_llamacpp/image.sh finds it);
the models are the tiny random-weight GGUF of tests/real_llamacpp/build_tiny_gguf.py (a copy of it under a
second repository, and a damaged one), verified in the box's Hugging Face cache as `metralectl pull` leaves
them; the Ctrl-C test's loading phase is its 1B preset's (seconds of loading, on any CPU).

run → ready → ps → logs → chat → bench (every request ok) → swap to a second model → swap back → a swap to a
damaged model rolls back with the engine's last lines → stop: no process and no listener left. An engine that
cannot bind is classified "port-in-use" from its log. Ctrl-C (SIGINT to the CLI) while starting, loading and
during a swap leaves no engine process behind. A stale state file whose pid now belongs to another process:
that process is never signalled.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ports import HeldPort

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "build-llama-server.sh"
TINY, SECOND, DAMAGED, BIG = ("metralectl-test/tiny-llama-gguf", "metralectl-test/tiny-llama-gguf-b",
                              "metralectl-test/damaged-llama-gguf", "metralectl-test/random-llama-1b-gguf")
ALLOWED = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR"}  # the runtime's allow-list (and LC_*)
CANARY = "METRALECTL_TEST_CANARY"


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def llama_server() -> Path:
    """CI's cached llama-server, where the build script keeps it (never built here: that takes minutes)."""
    out = subprocess.run(["bash", str(BUILD), "--print-cache-dir"], capture_output=True, text=True, timeout=60)
    binary = Path(out.stdout.strip()) / "bin" / "llama-server"
    if out.returncode != 0 or not os.access(binary, os.X_OK):
        _fail_or_skip(f"llama-server is not built here ({binary}): run `bash {BUILD.relative_to(REPO)}` once")
    return binary.resolve()


def _verified(hub: Path, repo: str) -> None:
    """Record the snapshot's files as verified, exactly as `metralectl pull` leaves them."""
    from metralectl.seams.hf import cache as hfcache, listing as hflisting

    base = hub / ("models--" + repo.replace("/", "--"))
    commit = (base / "refs" / "main").read_text().strip()
    snap = base / "snapshots" / commit
    files = []
    for path in sorted(snap.iterdir()):
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        files.append(hflisting.RepoFile(path.name, path.stat().st_size, digest.hexdigest()))
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, hflisting.Listing(repo, commit, tuple(files)).to_json())


def _copy_repo(hub: Path, summary: dict[str, Any], repo: str, data: bytes | None = None) -> None:
    """The tiny GGUF again under another repository (`data`: other bytes in its place, a damaged file)."""
    base = hub / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / summary["revision"]
    snap.mkdir(parents=True, exist_ok=True)
    target = snap / Path(summary["file"]).name
    if data is None:
        shutil.copyfile(summary["file"], target)
    else:
        target.write_bytes(data)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(summary["revision"])
    _verified(hub, repo)


def _builder() -> Any:
    try:
        import gguf  # noqa: F401  (the writer's dependency)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
    import build_tiny_gguf

    return build_tiny_gguf


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HF cache for the module's boxes (read only by the engines): the tiny model, a second copy, a damaged one."""
    home = tmp_path_factory.mktemp("hf")
    hub = home / "hub"
    summary = _builder().install(hub)
    _verified(hub, TINY)
    _copy_repo(hub, summary, SECOND)
    _copy_repo(hub, summary, DAMAGED, b"not a gguf file " * 64)
    return home


@pytest.fixture(scope="module")
def big_model(hf_home: Path) -> str:
    """The 1B preset (~1 GB): a few seconds of loading, so a Ctrl-C lands while the engine loads."""
    builder = _builder()
    builder.install(hf_home / "hub", builder.PRESETS["1b"])
    _verified(hf_home / "hub", BIG)
    return BIG


def _proc_entries() -> Iterator[tuple[int, str | None, str, str | None]]:
    """(pid, executable, command line, working directory) of every process this user may look at."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        exe = cwd = None
        try:
            exe = os.readlink(f"/proc/{entry}/exe")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            pass
        yield int(entry), exe, cmdline, cwd


class ProcBox:
    """One test's machine without Docker: its config (engines.yaml naming the binary, or the binary on PATH),
    state and recipes; the HF cache shared by the module."""

    def __init__(self, home: Path, hf_home: Path, binary: Path, *, via_path: bool = False) -> None:
        self.home, self.binary = home, binary
        self.config = home / "config"
        (self.config / "recipes").mkdir(parents=True)
        self.held: list[HeldPort] = []
        path = os.environ.get("PATH", "")
        if via_path:
            path = f"{binary.parent}{os.pathsep}{path}"
        else:
            (self.config / "engines.yaml").write_text(f"llama-cpp:\n  executable: {binary}\n")
        self.env = {**os.environ, "METRALECTL_CONFIG_DIR": str(self.config), "HF_HOME": str(hf_home),
                    "METRALE_HOME": str(home / "metrale"), "METRALECTL_CACHE_DIR": str(home / "cache"),
                    "METRALECTL_LOCK_DIR": str(home), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",
                    "DOCKER_HOST": f"unix://{home}/no-docker.sock", "PATH": path, CANARY: "must-not-reach-the-engine"}
        self.env.pop("HF_HUB_CACHE", None)
        self.hub = hf_home / "hub"

    @property
    def states(self) -> Path:
        return self.home / "metrale" / "state" / "processes"

    def own_port(self) -> int:
        self.held.append(HeldPort())  # llama-server binds beside it (SO_REUSEADDR); nobody else can take it
        return self.held[-1].port

    def recipe(self, short: str, repo: str, port: int, *, process: bool = True, alias: str | None = None) -> str:
        name = f"proc-{short}"
        (self.config / "recipes" / f"{name}.yaml").write_text(
            f"schema: 1\nname: {name}\ndescription: a GGUF on the real llama-server, as a host process\n"
            f"engine: llama-cpp\n{'runtime: process' if process else ''}\n"
            f"checkpoint: {{repo: {repo}, quant: Q8_0, model: qwen2.5-0.5b-instruct, revision: null}}\n"
            "hardware: cpu\nimage: llama-cpp-cpu\n"
            f"serve: {{ctx-size: 1024, parallel: 2, n-gpu-layers: 0, alias: {alias or short}, threads: 2, ui: false}}\n"
            f"resources: {{port: {port}, bind: 127.0.0.1, gpus: none, ranks: 1}}\n"
            "validated: {source: null, hardware: cpu}\n")
        return name

    def cli(self, *args: str, timeout: float = 180, check: bool = False) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                             env=self.env, cwd=REPO, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"metralectl {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}")
        return out

    def json(self, *args: str, timeout: float = 180) -> Any:
        out = self.cli(*args, timeout=timeout)
        assert out.stdout.strip(), f"{args}: {out.returncode}\n{out.stderr}"
        return json.loads(out.stdout)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "metralectl", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env, cwd=REPO)

    def engines(self) -> list[int]:
        """This box's llama-server processes: the binary, serving one of its ports."""
        ports = {str(h.port) for h in self.held}
        found = []
        for pid, exe, cmdline, _ in _proc_entries():
            words = cmdline.split()
            if exe == str(self.binary) and any(words[i + 1] in ports for i, w in enumerate(words[:-1])
                                               if w == "--port"):
                found.append(pid)
        return found

    def supervisors(self) -> list[int]:
        """This box's supervisors (they run in its state directory)."""
        return [pid for pid, _, cmdline, cwd in _proc_entries()
                if "metralectl.seams.process.supervise" in cmdline and cwd == str(self.states)]

    def listening(self, port: int) -> bool:
        with socket.socket() as probe:
            probe.settimeout(1.0)
            return probe.connect_ex(("127.0.0.1", port)) == 0

    def cleanup(self) -> None:
        if self.engines() or self.supervisors():
            self.cli("stop", "--all", timeout=120)
        for pid in self.engines() + self.supervisors():  # a failed test's leftovers: never left running
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while self.held:
            self.held.pop().close()


@pytest.fixture()
def box(tmp_path: Path, hf_home: Path, llama_server: Path) -> Iterator[ProcBox]:
    machine = ProcBox(tmp_path, hf_home, llama_server)
    try:
        yield machine
    finally:
        machine.cleanup()


def _requests(box: ProcBox, record: dict[str, Any]) -> list[dict[str, Any]]:
    [run_dir] = (box.home / "metrale" / "runs").glob(f"*/{record['run_id']}")
    return [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_llama_server_as_a_host_process_through_the_whole_lifecycle(box: ProcBox) -> None:
    port = box.own_port()
    first = box.recipe("first", TINY, port, process=False, alias="tiny-first")  # a Docker recipe, run --runtime process
    second = box.recipe("second", SECOND, port, alias="tiny-second")  # its file says runtime: process
    damaged = box.recipe("damaged", DAMAGED, port, process=False)

    # --print: the exact argv (the binary's absolute path) and the exact environment the engine gets
    printed = box.cli("run", first, "--runtime", "process", "--print", check=True).stdout
    assert printed.startswith("env -i \\\n") and f"\n  {box.binary} \\\n  --hf-repo {TINY}:Q8_0" in printed, printed
    assert f"HF_HUB_CACHE={box.hub}" in printed and "HF_HUB_OFFLINE=1" in printed and f"--port {port}" in printed
    assert CANARY not in printed
    spec = box.json("run", first, "--runtime", "process", "--print", "--json")
    assert spec["image"] == f"process:{box.binary}" and spec["command"][0] == str(box.binary)
    assert spec["environment"]["PATH"] == box.env["PATH"] and CANARY not in spec["environment"]
    assert set(spec["environment"]) - set(spec["env"]) <= ALLOWED | {k for k in spec["environment"] if k.startswith("LC_")}

    run = box.cli("run", first, "--runtime", "process", timeout=300)
    assert run.returncode == 0, run.stderr
    assert "loading" in run.stderr and "ready" in run.stderr, run.stderr  # its own log phases, as in a container
    assert "deviation from the validated recipe: runtime: docker -> process" in run.stderr
    assert f"process   metralectl-{first}" in run.stdout, run.stdout
    [engine] = box.engines()
    got = _environ(engine)  # what the engine really got: the spec's env and the allow-list, nothing else
    assert CANARY not in got and got["HF_HUB_CACHE"] == str(box.hub) and got["HF_HUB_OFFLINE"] == "1"
    assert set(got) <= ALLOWED | set(spec["env"]) | {k for k in got if k.startswith("LC_")}, sorted(got)
    url = f"http://127.0.0.1:{port}"

    ps = box.json("ps", "--json")
    [served] = ps["serving"]
    assert (served["recipe"], served["state"], served["health"], served["endpoint"]) == (first, "running", "ok", url)
    assert served["image"] == f"process:{box.binary}", served
    assert any("Docker is not reachable" in n for n in ps["notes"]), ps["notes"]
    logs = box.cli("logs", first, check=True)
    assert "llama_server: model loaded" in logs.stdout and f"listening on {url}" in logs.stdout
    chat = box.cli("chat", "Hello", "--max-tokens", "8", timeout=120)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr

    # bench finds the served engine by itself (no --url): every request ok, tokens as the server counted them
    decode = box.cli("bench", "run", "decode", "-p", "repeats=2", "-p", "max_tokens=16", "-p", "client_bound=warn",
                     "--format", "json", timeout=600)
    record = json.loads(decode.stdout)
    lines = _requests(box, record)
    assert decode.returncode == 0 and record["status"] == "completed", decode.stderr
    assert record["target"]["recipe"] == first and record["target"]["url"] == url, record["target"]
    assert lines and all(r["ok"] for r in lines), [(r["error_kind"], r["error"]) for r in lines if not r["ok"]]

    # top finds it by itself too, and reads llama.cpp's own series
    top = box.json("top", "--once", "--json", "--interval", "0.5", timeout=60)
    [watched] = [e for e in top["engines"] if e["url"] == url]
    assert (watched["engine"], watched["state"], watched["recipe"]) == ("llama-cpp", "ok", first), watched
    assert watched["totals"]["generation_tokens"] >= sum(r["output_tokens"] for r in lines if r["ok"]), watched

    # swap to a second model and back: the same address, each a host process
    to_second = box.json("swap", second, "--json", timeout=300)
    assert to_second["outcome"] == "swapped" and to_second["model"] == "tiny-second", to_second
    back = box.json("swap", first, "--runtime", "process", "--json", timeout=300)
    assert back["outcome"] == "swapped" and back["model"] == "tiny-first", back
    assert len(box.engines()) == 1

    # a damaged model: the swap fails with the engine's last lines and the previous recipe, a host process again
    # (its --runtime was recorded with its other overrides), serves again
    failed = box.cli("swap", damaged, "--runtime", "process", "--json", timeout=300)
    result = json.loads(failed.stdout)
    assert failed.returncode == 1 and result["outcome"] == "rolled-back", result
    assert f"the previous recipe {first} serves again" in failed.stderr, failed.stderr
    assert "corrupt-weights" in failed.stderr and "invalid magic characters" in failed.stderr, failed.stderr
    serving = box.json("ps", "--json")["serving"]
    assert [(s["recipe"], s["health"], s["image"]) for s in serving] == [(first, "ok", f"process:{box.binary}")]

    stopped = box.json("stop", "--json", timeout=120)
    [result] = stopped
    assert result["recipe"] == first and result["removed"] is True, stopped
    assert result["memory"] == "returned" or result["memory"].startswith("not checked: no GPU here"), result
    assert box.engines() == [] and box.supervisors() == [] and not box.listening(port)
    assert box.json("ps", "--json")["serving"] == []


def test_an_engine_that_cannot_bind_is_classified_port_in_use_from_its_log(box: ProcBox) -> None:
    """One of ours serves, so the launch does not probe the port (--replace frees its own); another program
    listens on the new recipe's port: llama-server says it cannot bind, and that is what the start says."""
    served = box.recipe("served", TINY, box.own_port())
    box.cli("run", served, check=True, timeout=300)
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        taken = other.getsockname()[1]
        blocked = box.recipe("blocked", SECOND, taken)
        out = box.cli("run", blocked, "--replace", timeout=300)
    assert out.returncode == 1, out.stderr
    assert "start failed (port-in-use)" in out.stderr and "couldn't bind HTTP server socket" in out.stderr, out.stderr
    assert "free the port, or `--set resources.port=N`" in out.stderr
    assert box.engines() == [] and box.json("ps", "--json")["serving"] == []


def test_a_killed_or_slow_engine_is_classified_as_a_container_would_be(box: ProcBox, big_model: str) -> None:
    """The same diagnosis as for a container, from what the host-process runtime recorded: killed (SIGKILL, exit
    137) while loading is `out-of-memory`; not ready within --boot-timeout is `timeout`. Nothing is left."""
    port = box.own_port()
    big = box.recipe("big", big_model, port)
    proc = box.popen("run", big, "-d")
    assert proc.stderr is not None
    said: list[str] = []
    for line in proc.stderr:
        said.append(line)
        if "▸ loading" in line:
            [engine] = box.engines()
            os.kill(engine, signal.SIGKILL)  # what the kernel's OOM killer does
    proc.wait(timeout=120)
    text = "".join(said)
    assert proc.returncode == 1 and "start failed (out-of-memory): the engine was killed (exit 137" in text, text
    assert box.engines() == []
    slow = box.cli("run", big, "--boot-timeout", "0.1", timeout=120)  # a 1B model's start takes more, even cached
    assert slow.returncode == 1 and "start failed (timeout): not ready after 0.1 s" in slow.stderr, slow.stderr
    assert box.engines() == [] and box.supervisors() == [] and not box.listening(port)


def _interrupt_when(proc: subprocess.Popen[str], needle: str, timeout: float = 240) -> str:
    """Read the CLI's stderr until `needle` shows, then SIGINT it (Ctrl-C); everything it said, once it exited."""
    assert proc.stderr is not None
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if needle in line and not found.is_set():
                found.set()
                proc.send_signal(signal.SIGINT)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    reader.join(timeout=10)
    text = "".join(seen)
    assert found.is_set(), f"never saw {needle!r}:\n{text}"
    return text


def _cold(hub: Path, repo: str) -> None:
    """The model's file out of the page cache, so its load takes seconds again (a warm 1B loads in well under
    one): POSIX_FADV_DONTNEED on its clean pages."""
    for blob in (hub / ("models--" + repo.replace("/", "--")) / "blobs").iterdir():
        fd = os.open(blob, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.parametrize("phase", ["starting", "loading", "swap"])
def test_ctrl_c_at_every_phase_leaves_no_engine_behind(phase: str, tmp_path: Path, hf_home: Path,
                                                       llama_server: Path, big_model: str) -> None:
    box = ProcBox(tmp_path, hf_home, llama_server, via_path=True)  # found on PATH this time
    try:
        port = box.own_port()
        big = box.recipe("big", big_model, port, alias="big")
        small = box.recipe("small", TINY, port)
        needle = "▸ starting" if phase == "starting" else "▸ loading"
        for _ in range(3):  # a load can still beat the Ctrl-C to ready: then it is tried again, never passed over
            if phase == "swap":
                box.cli("run", small, check=True, timeout=300)
            _cold(box.hub, big_model)
            proc = box.popen("swap" if phase == "swap" else "run", big)
            said = _interrupt_when(proc, needle)
            if proc.returncode != 0:
                break
            box.cli("stop", "--all", check=True, timeout=120)
        assert proc.returncode == 130 and "✔ ready" not in said, said
        if phase == "swap":  # the old one stopped, the new one loading: nothing serves, and it says so
            assert "interrupted while proc-big was starting: nothing serves now" in said, said
        assert "Traceback" not in said
        assert box.engines() == [], said
        assert box.supervisors() == [] and not box.listening(port)
        assert not list(box.states.glob("*.json")) if box.states.exists() else True  # no state left either
    finally:
        box.cleanup()


def test_a_stale_state_whose_pid_is_another_process_is_never_signalled(box: ProcBox) -> None:
    """The engine and its supervisor die hard (a crash, an OOM kill of both); their state stays, and its pids
    come to name another of this user's processes. ps tells the truth, stop never signals that process, and a
    new run replaces the stale state."""
    port = box.own_port()
    name = box.recipe("stale", TINY, port)
    box.cli("run", name, check=True, timeout=300)
    state_file = box.states / f"metralectl-{name}.json"
    state = json.loads(state_file.read_text())
    for pid in (state["supervisor"]["pid"], state["engine"]["pid"]):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while box.engines() and time.monotonic() < deadline:
        time.sleep(0.1)
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        state["engine"]["pid"] = state["supervisor"]["pid"] = stranger.pid  # a recycled pid, as the kernel may
        state_file.write_text(json.dumps(state))
        [row] = box.json("ps", "--json")["serving"]
        assert not row["state"].startswith("running"), row
        box.cli("stop", "--all", check=True, timeout=120)
        assert stranger.poll() is None  # never signalled
        again = box.cli("run", name, timeout=300)
        assert again.returncode == 0, again.stderr
        assert stranger.poll() is None and len(box.engines()) == 1
        box.cli("stop", check=True, timeout=120)
        assert stranger.poll() is None and box.engines() == []
    finally:
        stranger.kill()
        stranger.wait()
