"""TEST FIXTURE: a second "node" on this machine — a network namespace with its own Docker daemon.

    root namespace (node 1: the shared test daemon)        mtl-node2 namespace (node 2)
    enp1s0f1np1 10.77.0.1/24  <========== veth ==========>  enp1s0f1np1 10.77.0.2/24, lo
                                                             dockerd: tcp://10.77.0.2:2375
                                                                      unix:///run/mtl-node2/docker.sock

Both ends of the veth pair carry the GB10 class's second RoCE port name, so metralectl's detection
finds `enp1s0f1np1` with an IPv4 address on both "nodes"; the head's address on it (10.77.0.1) is
the master address. metralectl reaches node 2 as `tcp://10.77.0.2:2375` — through the network, the
way it reaches a real second node (TLS aside). The second daemon has its own data root, exec root,
pid file and containerd; the shared daemon other tests use is
never stopped or reconfigured. Everything is removed by `teardown()`; a leftover of a crashed run
(only what this fixture creates: the namespace, OUR veth, a dockerd whose command line names the
namespace) is cleaned first. Concurrent runs on one machine serialise on a lock file.

Root only (namespaces, a daemon); needs iproute2 (`ip`), dockerd and, for the firewall test, iptables.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

NETNS = "mtl-node2"
IFACE = "enp1s0f1np1"  # the GB10 class's second RoCE port, on both ends
HEAD_IP = "10.77.0.1"
NODE2_IP = "10.77.0.2"
RUN_DIR = Path("/run/mtl-node2")
SOCKET = RUN_DIR / "docker.sock"
LOCK = Path("/run/lock/metralectl-mtl-node2.lock")
URL = f"tcp://{NODE2_IP}:2375"


def sh(*args: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(args), check=False, capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} -> {out.returncode}: {out.stderr.strip()[-1500:]}")
    return out


def missing_tools() -> list[str]:
    return [t for t in ("ip", "dockerd", "docker") if shutil.which(t) is None]


class Node2:
    def __init__(self) -> None:
        self.data_root: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = RUN_DIR / "dockerd.log"
        self._lock_fd: int | None = None
        self.docker_env = {**os.environ, "DOCKER_HOST": f"unix://{SOCKET}", "DOCKER_BUILDKIT": "0"}

    # --- set-up / tear-down ---------------------------------------------------------------------------
    def setup(self, images: list[str]) -> None:
        self._lock()
        self._clean_leftovers()
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        self.data_root = Path(tempfile.mkdtemp(prefix="mtl-node2-docker-", dir="/var/tmp"))
        sh("ip", "netns", "add", NETNS)
        sh("ip", "link", "add", IFACE, "type", "veth", "peer", "name", IFACE, "netns", NETNS)
        sh("ip", "addr", "add", f"{HEAD_IP}/24", "dev", IFACE)
        sh("ip", "link", "set", IFACE, "up")
        self.ns("ip", "addr", "add", f"{NODE2_IP}/24", "dev", IFACE)
        self.ns("ip", "link", "set", IFACE, "up")
        self.ns("ip", "link", "set", "lo", "up")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                # nsenter --net, not `ip netns exec`: the latter remounts /sys, hiding the cgroup v1 mounts
                # dockerd needs ("Devices cgroup isn't mounted")
                ["nsenter", f"--net=/run/netns/{NETNS}", "dockerd", "--host", URL, "--host", f"unix://{SOCKET}",
                 "--data-root", str(self.data_root / "data"), "--exec-root", str(RUN_DIR / "exec"),
                 "--pidfile", str(RUN_DIR / "dockerd.pid"), "--bridge=none", "--iptables=false", "--ip-masq=false",
                 "--ip-forward=false", "--storage-driver", "overlay2"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node2's dockerd exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if sh("docker", "info", check=False, env=self.docker_env, timeout=20).returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"node2's dockerd did not answer within 60 s: {self.log.read_text()[-2000:]}")
        for image in images:
            self.load(image)

    def teardown(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                ids = sh("docker", "ps", "-aq", check=False, env=self.docker_env, timeout=30).stdout.split()
                if ids:
                    sh("docker", "rm", "-f", *ids, check=False, env=self.docker_env, timeout=60)
            self._stop_dockerd()
            self._kill_netns_processes()
            sh("ip", "netns", "del", NETNS, check=False)
            self._delete_our_veth()
            if self.data_root is not None:
                self._unmount_under(self.data_root)
                shutil.rmtree(self.data_root, ignore_errors=True)
            self._unmount_under(RUN_DIR)  # dockerd's bind mount of the namespace file (exec/netns/default)
            shutil.rmtree(RUN_DIR, ignore_errors=True)
        finally:
            self._unlock()

    def _lock(self) -> None:
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + 900
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another test run holds {LOCK} (its {NETNS} namespace) for 15 min") from None
                time.sleep(1)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _our_dockerd_pids(self) -> list[int]:
        """dockerd processes this fixture starts (their command line names our exec root)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"dockerd") and str(RUN_DIR / "exec").encode() in cmd:
                pids.append(int(proc.name))
        return pids

    def _stop_dockerd(self) -> None:
        pids = self._our_dockerd_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(self._alive(p) for p in pids):
            time.sleep(0.2)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

    def _alive(self, pid: int) -> bool:
        if self.proc is not None and self.proc.pid == pid:
            return self.proc.poll() is None  # our child: reap it, or it lingers as a zombie
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")

    def _kill_netns_processes(self) -> None:
        """Whatever still runs in OUR namespace (containerd, shims of a killed daemon)."""
        out = sh("ip", "netns", "pids", NETNS, check=False)
        for word in out.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(word), signal.SIGKILL)

    @staticmethod
    def _unmount_under(root: Path) -> None:
        """Mounts a killed dockerd left under its data root (overlay layers, netns files), deepest first."""
        prefix = str(root)
        try:
            mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        except OSError:
            return
        for target in sorted((m for m in mounts if m == prefix or m.startswith(prefix + "/")), key=len, reverse=True):
            sh("umount", "-l", target, check=False)

    def _delete_our_veth(self) -> None:
        out = sh("ip", "-d", "link", "show", IFACE, check=False)
        if out.returncode == 0 and "veth" in out.stdout:  # never a real NIC of that name
            sh("ip", "link", "del", IFACE, check=False)

    def _clean_leftovers(self) -> None:
        if NETNS in sh("ip", "netns", "list", check=False).stdout.split() or self._our_dockerd_pids():
            self._stop_dockerd()
            self._kill_netns_processes()
            sh("ip", "netns", "del", NETNS, check=False)
        self._delete_our_veth()
        self._unmount_under(RUN_DIR)
        for stale in Path("/var/tmp").glob("mtl-node2-docker-*"):
            self._unmount_under(stale)
            shutil.rmtree(stale, ignore_errors=True)

    # --- helpers ---------------------------------------------------------------------------------------
    def ns(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", NETNS, *args, check=check)

    def docker(self, *args: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
        return sh("docker", *args, check=check, env=self.docker_env, timeout=timeout, **kw)

    def load(self, image: str) -> None:
        saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        try:
            loaded = subprocess.run(["docker", "load", "-q"], check=False, stdin=saved.stdout, capture_output=True, text=True,
                                    env=self.docker_env, timeout=300)
        finally:
            assert saved.stdout is not None
            saved.stdout.close()
            saved.wait(timeout=60)
        if loaded.returncode != 0:
            raise RuntimeError(f"loading {image} into node2 failed: {loaded.stderr[-1500:]}")

    def build_variant(self, tag: str, base: str, env: dict[str, str]) -> str:
        """An image ON NODE 2 with ENV baked in (metadata only: `docker build -` with no context)."""
        dockerfile = f"FROM {base}\n" + "".join(f"ENV {k}={v}\n" for k, v in sorted(env.items()))
        self.docker("build", "-q", "-t", tag, "-", input=dockerfile)
        return tag

    def containers(self, prefix: str) -> list[str]:
        out = self.docker("ps", "-a", "--format", "{{.Names}}", "--filter", f"name={prefix}", check=False)
        return [n for n in out.stdout.split() if n]

    def remove_containers(self, prefix: str) -> None:
        names = self.containers(prefix)
        if names:
            self.docker("rm", "-f", *names, check=False)

    @contextlib.contextmanager
    def renamed(self, new: str, default_route: bool = False) -> Iterator[None]:
        """Node 2's port under another name (and, optionally, holding the default route: a management NIC)."""
        self.ns("ip", "link", "set", IFACE, "down")
        self.ns("ip", "link", "set", IFACE, "name", new)
        self.ns("ip", "link", "set", new, "up")
        if default_route:
            self.ns("ip", "route", "add", "default", "via", HEAD_IP, "dev", new)
        try:
            yield
        finally:
            if default_route:
                self.ns("ip", "route", "del", "default", check=False)
            self.ns("ip", "link", "set", new, "down", check=False)
            self.ns("ip", "link", "set", new, "name", IFACE, check=False)
            self.ns("ip", "link", "set", IFACE, "up", check=False)

    @contextlib.contextmanager
    def firewall(self, port: int) -> Iterator[None]:
        """Node 2 cannot open connections to the head's `port` (a firewall rejecting them)."""
        rule = ["OUTPUT", "-p", "tcp", "-d", HEAD_IP, "--dport", str(port), "-j", "REJECT", "--reject-with", "tcp-reset"]
        self.ns("iptables", "-A", *rule)
        try:
            yield
        finally:
            self.ns("iptables", "-D", *rule, check=False)
