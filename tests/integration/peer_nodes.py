"""Nodes on loopback for the remote-unit and campaign tests: each with its own config dir, METRALE_HOME,
peer listener (real HTTP) and an engine double (a real HTTP server, run as a plain process) to benchmark.

Machine facts (GPU, memory, thermal) are injected: there is no GPU here. Everything else is real: the
peer protocol, the unit queue, `metralectl bench run` as the child process that measures and signs.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metralectl.seams import identity
from metralectl.peers import ops
from metralectl.peers.admission import Facts, GpuFact
from metralectl.peers.config import BenchConfig, save_bench_config
from metralectl.peers.listener import Node, PeerServer
from metralectl.peers.store import PeerStore
from tests.ports import HeldPort

REPO = Path(__file__).resolve().parents[2]
DOUBLE = REPO / "tests" / "engine_double" / "metrale_double.py"


class EngineDouble:
    """The engine double serving on loopback (no container): what a node's units benchmark."""

    def __init__(self, itl_ms: float = 2.0) -> None:
        self.held = HeldPort()  # the double listens beside it (SO_REUSEADDR); nobody else can take the port
        self.port = self.held.port
        env = {k: v for k, v in os.environ.items() if not k.startswith(("METRALE_", "DOUBLE_"))}
        env.update({"DOUBLE_READY_DELAY": "0.1", "DOUBLE_TTFT_MS": "5", "DOUBLE_ITL_MS": str(itl_ms)})
        self.proc = subprocess.Popen([sys.executable, "-u", str(DOUBLE), "serve", "test/model", "--port",
                                      str(self.port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        assert self.proc.stdout is not None
        seen = b""
        while b"Server live and ready at" not in seen:  # the double speaks today's engine by default
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the engine double did not start: {seen.decode(errors='replace')}")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                seen += os.read(self.proc.stdout.fileno(), 4096)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.held.close()


class Thermal:
    """A settable temperature reading (the test's stand-in for the node's GPU sensor), with a log of reads."""

    def __init__(self, temp_c: float | None = 50.0) -> None:
        self.temp_c = temp_c
        self.reasons: list[str] = []
        self.reads = 0
        self.on_read: Callable[[Thermal], None] | None = None

    def __call__(self) -> dict[str, Any]:
        self.reads += 1
        if self.on_read is not None:
            self.on_read(self)
        return {"temp_c": self.temp_c, "clock_reasons": list(self.reasons), "reason": None}


def _can_run() -> dict[str, Any]:
    return {"can_run": True, "summary": "this machine can run models", "problems": [], "checks": []}


class PeerNode:
    """One node: by default a whole `metralectl agent` (agent.service.Agent: capability monitor, local API,
    peer listener, unit queue) in this process, so its machine facts can be injected; `agent=False` runs
    the peer listener alone."""

    def __init__(self, root: Path, name: str, *, endpoint: str | None = None, hardware_class: str = "gb10",
                 memory_gb: float = 100.0, thermal: Thermal | None = None, agent: bool = True) -> None:
        self.name = name
        self.base = root / name / "config"
        self.home = root / name / "metrale"
        # each node is its own machine: its own lifecycle lock (a CLI reaches it with METRALECTL_LOCK_DIR)
        self.lock_path = root / name / "locks" / "metralectl-lifecycle.lock"
        self.me = identity.load_or_create(self.base)
        self.thermal = thermal or Thermal()
        self.memory_gb = memory_gb
        facts = Facts(gpu=lambda: GpuFact("NVIDIA GB10", "gb10"), busy=lambda: None, queued=lambda: 0,
                      memory=lambda: int(self.memory_gb * 1e9), disk=lambda p: 900 * 10**9, thermal=self.thermal)
        self.agent: Any = None
        if agent:
            from metralectl.agent.service import Agent, AgentOptions

            self.agent = Agent(AgentOptions(api_port=0, peer_port=0, peer_host="127.0.0.1", peer=True, interval_s=30.0,
                                            regroup=False, argv=[]),
                               base=self.base, home=self.home, check=_can_run, facts=facts, lock_path=self.lock_path)
            self.agent.start()
            self.server: PeerServer = self.agent.peer_server
            self.node: Node = self.server.node
        else:
            self.node = Node(self.base, self.me, facts, name=name, home=self.home, lock_path=self.lock_path)
            self.server = PeerServer(self.node, "127.0.0.1", 0)
            self.server.start(f"peer-{name}")
        if endpoint is not None:
            save_bench_config(BenchConfig(enabled=True, hardware_class=hardware_class, endpoint=endpoint,
                                          memory_floor_gb=1, disk_floor_gb=1), self.base)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        else:
            self.server.stop()


def pair_and_grant(client_base: Path, client: identity.Identity, client_name: str, node: PeerNode,
                   address: str | None = None) -> None:
    """The operator's steps: `peer pair ADDR` here (TOFU, fingerprint shown), `peer grant-bench FP` there."""
    ops.pair(address or node.addr, client, base=client_base, confirm=lambda remote, where: True, name=client_name)
    PeerStore(node.base).grant(client.fingerprint)
