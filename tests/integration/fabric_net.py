"""TEST FIXTURE: two "nodes" in network namespaces of their own, for `doctor --peer` (the fabric preflight).

    namespace <name>-a (the head: doctor runs here)          namespace <name>-b (the peer: its agent)
    mgmt0        192.168.77.1/24  <==== veth (switch) ====>  mgmt0        192.168.77.2/24
                 default via 192.168.77.2                    lo           198.51.100.2/32   <- paired at this address
    enp1s0f1np1  10.99.0.1/30     <==== veth (cable) =====>  enp1s0f1np1  10.99.0.2/30      (MTUs settable)

The peer is paired at 198.51.100.2, which the head reaches through its default route on mgmt0 (a routed
path through a "switch"), while the /30 on enp1s0f1np1 (the GB10 class's second RoCE port name) is the
direct cable. The peer's own agent (`metralectl agent --peers`, in the foreground) runs inside its namespace (`ip netns exec`,
which also mounts that namespace's own /sys, so its sysfs shows its own interfaces).

Nothing is created in the root namespace: each veth pair is made inside the namespaces, so the interface
names cannot collide with anything, and the namespace names are unique per fixture (pid + random), so
parallel runs do not collide. `close()` kills the listener (by its pid) and deletes both namespaces, which
removes their interfaces; the fixture calls it even when the test failed. Root only; needs iproute2.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from metralectl.seams import identity
from metralectl.peers.store import PeerStore

REPO = Path(__file__).resolve().parents[2]
CABLE = "enp1s0f1np1"
PAIRED = "198.51.100.2"
HEAD_CABLE, PEER_CABLE = "10.99.0.1", "10.99.0.2"
PORT = 8899


def usable() -> str | None:
    """Why these tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    return None


def clean_leftovers() -> None:
    """Namespaces a killed run of these tests left behind (named mtlfab-PID-…, PID no longer running), and the
    processes still inside them (ours: started there by that run): gone before a new fixture starts."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != "mtlfab" or not parts[1].isdigit() or Path(f"/proc/{parts[1]}").exists():
            continue
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30,
                              check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (ValueError, OSError):
                pass
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30, check=False)


def sh(*args: str) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} -> {out.returncode}: {out.stderr.strip()[-800:]}")
    return out.stdout


class FabricNet:
    def __init__(self, root: Path, *, head_mtu: int = 1500, peer_mtu: int = 1500) -> None:
        tag = f"mtlfab-{os.getpid()}-{secrets.token_hex(3)}"
        self.a, self.b = f"{tag}-a", f"{tag}-b"
        self.root = root
        self.head_base, self.peer_base = root / "head-config", root / "peer-config"
        self.proc: subprocess.Popen[bytes] | None = None
        self.created: list[str] = []
        try:
            self._build(head_mtu, peer_mtu)
        except BaseException:
            self.close()
            raise

    def block_probe_on_the_cable(self) -> None:
        """The peer drops its peer port on the cable's address only (a firewall on that network)."""
        sh("ip", "netns", "exec", self.b, "iptables", "-A", "INPUT", "-d", PEER_CABLE, "-p", "tcp", "--dport", str(PORT),
           "-j", "DROP")

    def ns(self, which: str, *args: str) -> str:
        return sh("ip", "-n", which, *args)

    def _build(self, head_mtu: int, peer_mtu: int) -> None:
        for name in (self.a, self.b):
            sh("ip", "netns", "add", name)
            self.created.append(name)
        a, b = self.a, self.b
        self.ns(a, "link", "add", "mgmt0", "type", "veth", "peer", "name", "mgmt0", "netns", b)
        self.ns(a, "link", "add", CABLE, "type", "veth", "peer", "name", CABLE, "netns", b)
        self.ns(a, "link", "set", CABLE, "mtu", str(head_mtu))
        self.ns(b, "link", "set", CABLE, "mtu", str(peer_mtu))
        for which, mgmt, cable in ((a, "192.168.77.1/24", f"{HEAD_CABLE}/30"), (b, "192.168.77.2/24", f"{PEER_CABLE}/30")):
            self.ns(which, "addr", "add", mgmt, "dev", "mgmt0")
            self.ns(which, "addr", "add", cable, "dev", CABLE)
            for iface in ("lo", "mgmt0", CABLE):
                self.ns(which, "link", "set", iface, "up")
        self.ns(b, "addr", "add", f"{PAIRED}/32", "dev", "lo")
        # a veth pair reports "up" only once both ends are: wait for it (a busy box took a moment; CI saw "down")
        deadline = time.monotonic() + 30
        while not all("state UP" in self.ns(which, "link", "show", iface)
                      for which in (a, b) for iface in ("mgmt0", CABLE)):
            if time.monotonic() > deadline:
                raise RuntimeError("the veth links did not come up within 30 s")
            time.sleep(0.05)
        self.ns(a, "route", "add", "default", "via", "192.168.77.2", "dev", "mgmt0")
        # both sides know each other: the head paired the peer at its routed address; the peer trusts the head
        head, peer = identity.load_or_create(self.head_base), identity.load_or_create(self.peer_base)
        self.head_fp, self.peer_fp = head.fingerprint, peer.fingerprint
        PeerStore(self.head_base).add_paired(peer.fingerprint, peer.public_b64, f"{PAIRED}:{PORT}", "spark2")
        PeerStore(self.peer_base).add_paired(head.fingerprint, head.public_b64, f"192.168.77.1:{PORT}", "spark1")

    def start_peer(self) -> None:
        """The peer's own `metralectl agent --peers`, in the foreground, inside its namespace."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "METRALECTL_CONFIG_DIR": str(self.peer_base),
               "METRALE_HOME": str(self.root / "peer-home"), "METRALECTL_LOCK_DIR": str(self.root / "peer-home")}
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.b, sys.executable, "-u", "-m", "metralectl", "agent",
                                      "--peers", "--peer-port", str(PORT), "--port", "0", "--no-regroup"],
                                     env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.proc.stdout is not None
        seen, deadline = b"", time.monotonic() + 30
        while f"peer listener:    0.0.0.0:{PORT}".encode() not in seen:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the peer's agent did not start its listener: {seen.decode(errors='replace')}")
            if select.select([self.proc.stdout], [], [], 0.2)[0]:
                seen += os.read(self.proc.stdout.fileno(), 4096)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def doctor(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`metralectl doctor ARGS` run inside the head's namespace, as the head's user."""
        base = {**os.environ, "PYTHONPATH": str(REPO), "METRALECTL_CONFIG_DIR": str(self.head_base),
                "METRALE_HOME": str(self.root / "head-home"), "METRALECTL_LOCK_DIR": str(self.root / "head-home"),
                "NO_COLOR": "1"}
        base = {k: v for k, v in base.items() if not k.startswith("NCCL_")}
        return subprocess.run(["ip", "netns", "exec", self.a, sys.executable, "-m", "metralectl", "doctor", *args],
                              capture_output=True, text=True, env={**base, **(env or {})}, cwd=REPO, timeout=60)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # the agent's own pid (ip netns exec execs python in place): it stops cleanly
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for name in reversed(self.created):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30, check=False)
        self.created.clear()
