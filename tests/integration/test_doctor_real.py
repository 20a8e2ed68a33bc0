"""`metralectl doctor` against REAL failures on this machine (no fakes): a socket path that does not exist,
TCP ports where nothing answers or something accepts and stays silent, a private dockerd that is killed,
a non-root user outside the docker group (and one inside it whose session predates the change) against
the real socket, a root-owned file in a user's HF cache, a port held by a listener, and no NVIDIA driver.

Every run is `python -m metralectl doctor --json` in a subprocess, timed from the outside.
The shared daemon is never stopped: the "daemon stopped" case uses a private second dockerd.
"""

from __future__ import annotations

import grp
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ports import own_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# An unreachable daemon is reported after doctor's own budget, not after docker-py's 60 s default. How fast
# that is lives in benchmarks/ (a busy box stretches process start); here: doctor said which budget it kept,
# and it returned well before anything that waited on a default timeout could have.
ANSWER_S = 20.0
BUDGET_S = 3.0


def doctor(*args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None,
           timeout: float = 60) -> tuple[dict[str, Any], int, float, str]:
    """(document, exit code, wall seconds, stderr) of one real `metralectl doctor --json`."""
    argv = [*(prefix or []), sys.executable, "-m", "metralectl", "doctor", "--json", *args]
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=timeout,
                         env=os.environ.copy() if prefix else {**os.environ, **(env or {})})  # prefix: `env -i ...`
    wall = time.monotonic() - started
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON (exit {out.returncode}): {out.stdout!r} {out.stderr!r}") from None
    return doc, out.returncode, wall, out.stderr


def check(doc: dict[str, Any], check_id: str) -> dict[str, Any]:
    return next(c for c in doc["checks"] if c["id"] == check_id)


def assert_rule(doc: dict[str, Any], code: int) -> None:
    assert code == (1 if any(c["status"] == "problem" for c in doc["checks"]) else 0)


# -- DOCKER_HOST pointing at nothing / at silence --------------------------------------------------

def test_docker_host_socket_that_does_not_exist(tmp_path: Path) -> None:
    doc, code, wall, _ = doctor(env={"DOCKER_HOST": f"unix://{tmp_path}/nothing-here.sock"})
    daemon = check(doc, "docker.daemon")
    assert daemon["status"] == "problem" and wall < ANSWER_S
    expected = "not-running" if shutil.which("dockerd") or Path("/usr/bin/dockerd").exists() else "not-installed"
    assert daemon["data"]["cause"] == expected and "nothing-here.sock" in daemon["detail"]
    assert "unset DOCKER_HOST" in daemon["remedy"]
    assert {check(doc, i)["status"] for i in ("docker.version", "docker.nvidia-runtime")} == {"skipped"}
    assert code == 1


def test_tcp_port_where_nothing_listens() -> None:
    doc, code, wall, _ = doctor(env={"DOCKER_HOST": f"tcp://127.0.0.1:{own_port()}"})  # held: refused
    daemon = check(doc, "docker.daemon")
    assert daemon["status"] == "problem" and daemon["data"]["cause"] == "not-running" and wall < ANSWER_S


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """Accepts connections and never says a word (a hung daemon, or the wrong service on that port)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


def test_tcp_listener_that_never_replies_is_reported_within_3_s(silent_listener: int) -> None:
    doc, code, wall, _ = doctor(env={"DOCKER_HOST": f"tcp://127.0.0.1:{silent_listener}"})
    daemon = check(doc, "docker.daemon")
    assert daemon["status"] == "problem" and daemon["data"]["cause"] == "unreachable", daemon
    said = re.search(r"did not answer within ([0-9.]+) s", daemon["detail"])
    assert said is not None and float(said.group(1)) <= BUDGET_S, daemon["detail"]
    assert wall < ANSWER_S, f"doctor took {wall:.2f} s"
    assert code == 1


# -- a private daemon, killed ----------------------------------------------------------------------

@pytest.fixture
def private_dockerd() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if os.geteuid() != 0 or not Path(dockerd).exists():
        pytest.skip("a private dockerd needs root and the dockerd binary")
    base = Path(tempfile.mkdtemp(prefix="mdoc-dockerd-", dir="/tmp"))
    sock = base / "d.sock"
    log = open(base / "log", "wb")
    proc = subprocess.Popen([dockerd, "--host", f"unix://{sock}", "--data-root", str(base / "data"),
                             "--exec-root", str(base / "exec"), "--pidfile", str(base / "pid"), "--bridge=none",
                             "--iptables=false", "--ip-masq=false"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            ping = subprocess.run(["docker", "-H", f"unix://{sock}", "version", "--format", "{{.Server.Version}}"],
                                  capture_output=True, timeout=20)
            if ping.returncode == 0:
                break
            time.sleep(0.3)
        else:
            pytest.skip(f"the private dockerd did not come up: {(base / 'log').read_text()[-800:]}")
        yield proc, f"unix://{sock}"
    finally:
        if proc.poll() is None:
            # its own session. The containerd it supervises has a process group of its own but a parent-death
            # signal of SIGKILL (moby's supervisor), so it dies with dockerd.
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything else dockerd started in its session
            except ProcessLookupError:
                pass
        proc.wait(10)
        log.close()
        for mounted in ("exec", "data"):  # dockerd bind-mounts these onto themselves; a killed one leaves them
            subprocess.run(["umount", "-R", "-l", str(base / mounted)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_daemon_stopped_is_not_running_within_3_s(private_dockerd: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = private_dockerd
    doc, _, _, _ = doctor(env={"DOCKER_HOST": url})
    assert check(doc, "docker.daemon")["status"] == "ok" and check(doc, "docker.version")["status"] == "ok"
    os.killpg(proc.pid, signal.SIGKILL)  # a crash: the socket file stays, nobody behind it
    proc.wait(10)
    assert Path(url[len("unix://"):]).exists()
    doc, code, wall, _ = doctor(env={"DOCKER_HOST": url})
    daemon = check(doc, "docker.daemon")
    assert daemon["status"] == "problem" and daemon["data"]["cause"] == "not-running" and wall < ANSWER_S
    assert "systemctl start docker" in daemon["remedy"]
    assert code == 1


# -- a non-root user, the real socket ---------------------------------------------------------------

class User:
    def __init__(self, name: str, base: Path) -> None:
        self.name = name
        self.base = base
        import pwd

        entry = pwd.getpwnam(name)
        self.uid, self.gid, self.home = entry.pw_uid, entry.pw_gid, Path(entry.pw_dir)
        self.hf = base / "hf"
        for sub in ("hf", "config", "cache", "metrale"):
            (base / sub).mkdir()
            os.chown(base / sub, self.uid, self.gid)

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home), "USER": self.name,
                "LANG": "C.UTF-8", "NO_COLOR": "1", "HF_HOME": str(self.hf),
                "METRALECTL_CONFIG_DIR": str(self.base / "config"), "METRALECTL_CACHE_DIR": str(self.base / "cache"),
                "METRALE_HOME": str(self.base / "metrale"), **extra}

    def doctor(self, *args: str, switch: str = "runuser", **extra: str) -> tuple[dict[str, Any], int, float, str]:
        """Run doctor as this user. The interpreter lives under /root (0700 here), so the run happens in a
        private mount namespace where /root is a 0755 tmpfs with the interpreter bound back at the same
        path; nothing changes for other processes."""
        env = self.env(**extra)
        if switch == "runuser":
            become = ["runuser", "-u", self.name, "--"]  # a fresh login's groups (initgroups from /etc/group)
        else:  # a process started before `usermod -aG docker`: its primary group only
            become = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]
        env_args = ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
        prefix = [*become, *env_args]
        if sys.base_prefix.startswith("/root/"):
            top = "/root/" + Path(sys.base_prefix).relative_to("/root").parts[0]
            hold = tempfile.mkdtemp(prefix="mdoc-py-", dir="/tmp")
            script = (f'mount --bind {top} {hold} && mount -t tmpfs -o mode=755 tmpfs /root && mkdir -p {top} && '
                      f'mount --move {hold} {top} && exec "$@"')
            prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *prefix]
            try:
                return doctor(*args, env=env, prefix=prefix)
            finally:
                os.rmdir(hold)
        return doctor(*args, env=env, prefix=prefix)


@pytest.fixture
def user() -> Iterator[User]:
    if os.geteuid() != 0:
        pytest.skip("creating a test user (useradd) and switching to it (runuser) needs root")
    for tool in ("useradd", "userdel", "runuser", "setpriv", "unshare"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    name = f"mdoc{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    base = Path(tempfile.mkdtemp(prefix="mdoc-user-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        yield User(name, base)
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _real_socket() -> Path:
    sock = Path("/var/run/docker.sock")
    if not sock.exists():
        pytest.skip("no /var/run/docker.sock")
    st = sock.stat()
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    if st.st_uid != 0 or group != "docker" or stat.S_IMODE(st.st_mode) != 0o660:
        pytest.skip(f"the daemon's socket is not root:docker 0660 ({st.st_uid}:{group} "
                    f"{stat.S_IMODE(st.st_mode):04o}): the permission test would not mean what it says")
    return sock


@pytest.mark.docker
def test_user_outside_the_docker_group_gets_permission_denied(docker_daemon: None, user: User) -> None:
    _real_socket()
    doc, code, wall, err = user.doctor()
    daemon = check(doc, "docker.daemon")
    assert daemon["status"] == "problem", (daemon, err)
    assert daemon["data"]["cause"] == "permission-denied" and daemon["data"]["in_docker_group"] is False
    assert f"{user.name} is not in the docker group" in daemon["detail"]
    assert "(socket root:docker 0660)" in daemon["detail"]
    assert daemon["remedy"].startswith("sudo usermod -aG docker $USER && newgrp docker")
    assert check(doc, "user.root")["status"] == "ok"
    assert wall < ANSWER_S
    assert_rule(doc, code)


@pytest.mark.docker
def test_user_added_to_the_group_after_the_session_started(docker_daemon: None, user: User) -> None:
    _real_socket()
    subprocess.run(["usermod", "-aG", "docker", user.name], check=True, capture_output=True)
    doc, _, _, err = user.doctor(switch="setpriv")  # groups of a shell started before the usermod
    daemon = check(doc, "docker.daemon")
    assert daemon["data"]["cause"] == "permission-denied", (daemon, err)
    assert daemon["data"]["in_docker_group"] is True and daemon["data"]["docker_group_active"] is False
    assert "began before that change" in daemon["detail"]
    assert "newgrp docker" in daemon["remedy"] and f"user@{user.uid}.service" in daemon["remedy"]
    # A fresh login (runuser: initgroups) carries the group, and the same daemon answers.
    doc, _, _, err = user.doctor()
    assert check(doc, "docker.daemon")["status"] == "ok", (check(doc, "docker.daemon"), err)


def test_root_owned_file_in_the_users_hf_cache(user: User) -> None:
    snap = user.hf / "hub" / "models--Sehyo--Qwen3.5-35B-A3B-NVFP4" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    for path in (user.hf / "hub", snap.parents[1], snap.parent, snap, snap / "config.json"):
        os.chown(path, user.uid, user.gid)
    os.chown(snap.parents[2], user.uid, user.gid)
    planted = snap / "model.safetensors"
    planted.write_text("weights written by `sudo metralectl`")  # we are root: a root-owned file
    doc, code, _, err = user.doctor()
    owned = check(doc, "hf.ownership")
    assert owned["status"] == "problem", (owned, err)
    assert owned["data"]["root_owned"] == 1 and str(planted) in owned["detail"]
    group = grp.getgrgid(user.gid).gr_name
    assert owned["remedy"] == f"sudo chown -R {user.name}:{group} {user.hf}"
    assert check(doc, "hf.writable")["status"] == "ok"
    # The fix, applied as printed, clears the finding.
    subprocess.run(["chown", "-R", f"{user.name}:{group}", str(user.hf)], check=True)
    doc, _, _, _ = user.doctor()
    assert check(doc, "hf.ownership")["status"] == "ok"
    assert_rule(doc, code)


# -- a port held by a listener ----------------------------------------------------------------------

def test_port_taken_by_a_test_listener() -> None:
    port = own_port()  # held beside the listener, so it is still ours (and free) once the listener is gone
    with socket.create_server(("127.0.0.1", port), backlog=1):
        doc, code, _, _ = doctor("--port", str(port))
        taken = check(doc, "net.port")
        assert taken["status"] == "problem" and f"port {port} is already taken" in taken["detail"]
        if os.geteuid() == 0:  # psutil sees every PID as root
            assert taken["data"]["pid"] == os.getpid()
        assert code == 1
    doc, _, _, _ = doctor("--port", str(port))
    assert check(doc, "net.port")["status"] == "ok"


# -- no NVIDIA driver -------------------------------------------------------------------------------

def test_no_nvml_is_the_real_no_driver_path() -> None:
    if Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA driver")
    doc, code, _, _ = doctor()
    driver = check(doc, "gpu.driver")
    assert driver["status"] == "problem" and driver["data"]["cause"] in ("LibraryNotFound", None)
    assert "NVIDIA" in driver["detail"] or "nvidia-ml-py" in driver["detail"]
    assert {check(doc, i)["status"] for i in ("gpu.model", "gpu.memory", "gpu.in-use")} == {"skipped"}
    assert code == 1


# -- the real daemon: version, runtimes, a GPU request, the recipe's image --------------------------

@pytest.mark.docker
def test_gpu_request_against_the_real_daemon(docker_daemon: None, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "docker_image"))
    import mounts

    ref = mounts.build_image()
    config = tmp_path / "config"
    (config / "images").mkdir(parents=True)
    shipped = (REPO / "images" / "metrale-inference-hopper.yaml").read_text()
    (config / "images" / "metrale-inference-hopper.yaml").write_text(
        shipped.replace("ref: metrale/metrale-inference-hopper:latest", f"ref: {ref}"))
    env = {"METRALECTL_CONFIG_DIR": str(config), "METRALECTL_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("DOCKER_HOST", None)
    base_env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    doc, code, wall, err = doctor("--recipe", "qwen3.5-35b-a3b-hopper", env={**base_env, **env})
    assert check(doc, "docker.daemon")["status"] == "ok", err
    version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                             text=True).stdout.strip()
    assert check(doc, "docker.version")["data"]["version"] == version
    runtimes = check(doc, "docker.nvidia-runtime")
    has_nvidia = "nvidia" in runtimes["data"]["runtimes"]
    assert runtimes["status"] == ("ok" if has_nvidia else "problem")
    probe = check(doc, "docker.gpu-request")
    assert probe["data"]["image"] == ref
    if not has_nvidia:  # this machine: no GPU, no toolkit — the daemon's own refusal
        assert probe["status"] == "problem" and "could not select device driver" in probe["detail"], probe
    image = check(doc, "recipe.image")
    assert image["status"] == "ok" and image["data"]["revision"].startswith("test-double-")
    assert check(doc, "recipe.weights")["status"] == "warn"
    left = subprocess.run(["docker", "ps", "-a", "--filter", f"name={probe['data']['container']}", "-q"],
                          capture_output=True, text=True).stdout.strip()
    assert left == "", "the probe container was left behind"
    assert wall < 5.0
    assert_rule(doc, code)


@pytest.mark.docker
def test_whole_run_is_fast_when_everything_answers(docker_daemon: None) -> None:
    doc, _, _, _ = doctor()
    assert check(doc, "docker.daemon")["status"] == "ok"
    # "fast" as an outcome, not a wall-clock window (a shared CI box stalls any process for seconds): no check ran
    # into its timeout, and the run took less than one check's timeout would (the checks run side by side).
    late = [c for c in doc["checks"] if "did not finish within" in str(c.get("detail") or "")]
    assert not late, late
    assert doc["elapsed_s"] < 10.0, doc["elapsed_s"]
