"""Two (and three) nodes on loopback, each with its own config dir and port, over real HTTP.

In-process listeners (so the GPU and the machine facts can be injected) cover the protocol: pairing,
hello + grant, admission, replayed/expired/unpaired/misaddressed requests, and a changed key. The last
test runs two real `metralectl agent` processes and drives them with the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metralectl.errors import ExitCode
from metralectl.seams import identity
from metralectl.peers import ops
from metralectl.peers.admission import Facts, GpuFact
from metralectl.peers.config import BenchConfig, save_bench_config
from metralectl.peers.listener import Node, PeerServer
from metralectl.peers.protocol import sign_request
from metralectl.peers.store import PeerKeyChanged, PeerStore
from tests.ports import own_port

REPO = Path(__file__).resolve().parents[2]
FACTS = Facts(gpu=lambda: GpuFact("NVIDIA GB10", "gb10"), busy=lambda: None, queued=lambda: 0,
              memory=lambda: 100 * 10**9, disk=lambda p: 900 * 10**9)


class Box:
    def __init__(self, root: Path, name: str, port: int = 0) -> None:
        self.base = root / name
        self.name = name
        self.me = identity.load_or_create(self.base)
        self.node = Node(self.base, self.me, FACTS, name=name)
        self.server = PeerServer(self.node, "127.0.0.1", port)
        self.server.start(f"peer-{name}")

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture()
def boxes(tmp_path: Path) -> Iterator[tuple[Box, Box, Box]]:
    made = [Box(tmp_path, n, own_port()) for n in ("a", "b", "c")]  # held: a restarted peer gets its port back
    yield made[0], made[1], made[2]
    for box in made:
        box.stop()


def _pair(a: Box, b: Box) -> ops.PairResult:
    seen: list[object] = []

    def confirm(remote: object, where: str) -> bool:
        seen.append(remote)
        return True

    result = ops.pair(b.addr, a.me, base=a.base, confirm=confirm, name=a.name)
    assert seen and getattr(seen[0], "fingerprint") == b.me.fingerprint  # the operator was shown the right fingerprint
    return result


def _admission_headers(a: Box, b: Box, **kw: object) -> dict[str, str]:
    return sign_request(a.me, b.me.fingerprint, "GET", "/peer/v1/admission", **kw)  # type: ignore[arg-type]


def _get(b: Box, headers: dict[str, str], path: str = "/peer/v1/admission") -> httpx.Response:
    return httpx.get(f"http://{b.addr}{path}", headers=headers, timeout=5, trust_env=False)


def test_pair_hello_grant_then_admitted(boxes: tuple[Box, Box, Box]) -> None:
    a, b, _ = boxes
    result = _pair(a, b)
    assert result.outcome == "paired" and result.hello == "it has our key as pending"
    peer = PeerStore(a.base).load().by_address(b.addr)
    assert peer is not None and peer.fingerprint == b.me.fingerprint
    pending = PeerStore(b.base).load().pending
    assert [p.fingerprint for p in pending] == [a.me.fingerprint] and PeerStore(b.base).known_keys() == {}

    refused = ops.ask_node(b.addr, a.me, base=a.base)  # b does not trust a yet: its hello is only pending
    assert not refused.admitted and "unknown peer" in (refused.error or "")

    PeerStore(b.base).grant(a.me.fingerprint)  # b's operator typed a's fingerprint
    still = ops.ask_node(b.addr, a.me, base=a.base)  # granted, but bench.yaml is not enabled
    assert not still.admitted and [c.id for c in still.admission.reasons] == ["bench.enabled"]  # type: ignore[union-attr]

    save_bench_config(BenchConfig(enabled=True), b.base)
    answer = ops.ask_node(b.addr, a.me, base=a.base)
    assert answer.admitted, answer
    assert answer.admission and answer.admission.gpu == "NVIDIA GB10" and answer.admission.hardware_class == "gb10"
    assert answer.admission.fingerprint == b.me.fingerprint


def test_known_but_not_granted_is_refused_with_the_grant_reason(boxes: tuple[Box, Box, Box]) -> None:
    a, b, _ = boxes
    _pair(a, b)
    _pair(b, a)  # b paired a itself (TOFU from b's side): known, but no grant
    save_bench_config(BenchConfig(enabled=True), b.base)
    answer = ops.ask_node(b.addr, a.me, base=a.base)
    assert not answer.admitted and [c.id for c in answer.admission.reasons] == ["grant"]  # type: ignore[union-attr]


def test_replayed_expired_unpaired_and_misaddressed_requests_refused(boxes: tuple[Box, Box, Box]) -> None:
    a, b, c = boxes
    _pair(a, b)
    PeerStore(b.base).grant(a.me.fingerprint)
    headers = _admission_headers(a, b)
    first = _get(b, headers)
    assert first.status_code == 200
    replay = _get(b, headers)
    assert replay.status_code == 409 and "replayed" in replay.json()["error"]

    old = _admission_headers(a, b, now=time.time() - 400)
    expired = _get(b, old)
    assert expired.status_code == 401 and "expired" in expired.json()["error"]

    unpaired = _get(b, _admission_headers(c, b))  # c never paired with b
    assert unpaired.status_code == 403 and "unknown peer" in unpaired.json()["error"]
    answer = ops.ask_node(b.addr, c.me, base=c.base)
    assert not answer.admitted and answer.error == "not paired with this machine"

    for_c = sign_request(a.me, c.me.fingerprint, "GET", "/peer/v1/admission")  # a's request meant for c, sent to b
    assert _get(b, for_c).status_code == 403

    forged = dict(_admission_headers(c, b))
    forged["X-Metrale-Key"] = a.me.fingerprint  # c claims to be a
    assert _get(b, forged).status_code == 401

    unsigned = _get(b, {})
    assert unsigned.status_code == 401
    unknown_path = _get(b, sign_request(c.me, b.me.fingerprint, "GET", "/peer/v1/units"), "/peer/v1/units")
    assert unknown_path.status_code == 403  # not even a 404 for strangers


def test_changed_key_refused_loudly(boxes: tuple[Box, Box, Box], tmp_path: Path) -> None:
    a, b, _ = boxes
    _pair(a, b)
    port = b.server.port
    b.stop()
    impostor = Box(tmp_path, "b-reinstalled", port)  # same address, new key
    try:
        with pytest.raises(PeerKeyChanged, match="KEY CHANGED"):
            ops.pair(impostor.addr, a.me, base=a.base, confirm=lambda r, w: True, name="a")
        answer = ops.ask_node(impostor.addr, a.me, base=a.base)
        assert not answer.admitted and "KEY CHANGED" in (answer.error or "")
        kept = PeerStore(a.base).load().by_address(impostor.addr)
        assert kept is not None and kept.fingerprint == b.me.fingerprint  # unchanged
    finally:
        impostor.stop()
        b.server = PeerServer(b.node, "127.0.0.1", 0)  # the fixture stops it again
        b.server.start("peer-b-again")


def test_revoked_peer_is_refused(boxes: tuple[Box, Box, Box]) -> None:
    a, b, _ = boxes
    _pair(a, b)
    PeerStore(b.base).grant(a.me.fingerprint)
    save_bench_config(BenchConfig(enabled=True), b.base)
    assert ops.ask_node(b.addr, a.me, base=a.base).admitted
    PeerStore(b.base).revoke(a.me.fingerprint)
    answer = ops.ask_node(b.addr, a.me, base=a.base)
    assert not answer.admitted and "unknown peer" in (answer.error or "")


def test_nothing_listening_is_an_answer(tmp_path: Path) -> None:
    me = identity.load_or_create(tmp_path / "solo")
    port = own_port()  # held, never listening: refused, and nobody else can start listening there
    PeerStore(tmp_path / "solo").add_paired(me.fingerprint[:0] + identity.fingerprint_of(b"\x07" * 32),
                                            identity.b64(b"\x07" * 32), f"127.0.0.1:{port}", "gone")
    answer = ops.ask_node(f"127.0.0.1:{port}", me, base=tmp_path / "solo", timeout=2)
    assert not answer.admitted and answer.hint and "agent" in answer.hint


# -- two real agents, driven by the CLI -----------------------------------------------------------
def _env(base: Path, home: Path) -> dict[str, str]:
    return {**os.environ, "METRALECTL_CONFIG_DIR": str(base), "METRALE_HOME": str(home),
            "METRALECTL_LOCK_DIR": str(home), "NO_COLOR": "1"}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)


def _wait_port(port: int, deadline_s: float = 20.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def test_two_agent_processes_pair_grant_and_answer(tmp_path: Path) -> None:
    envs, procs, ports = [], [], []
    for name in ("one", "two"):
        env = _env(tmp_path / name / "config", tmp_path / name / "home")
        api, peer = own_port(), own_port()  # the agent's servers (SO_REUSEADDR) listen beside the held sockets
        proc = subprocess.Popen([sys.executable, "-m", "metralectl", "agent", "--port", str(api), "--peer-port", str(peer),
                                 "--peer-bind", "127.0.0.1", "--peers", "--interval", "30", "--no-regroup"],
                                env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        envs.append(env)
        procs.append(proc)
        ports.append((api, peer))
    try:
        for api, peer in ports:
            _wait_port(api)
            _wait_port(peer)
        one, two = envs
        fp_one = _cli(one, "id").stdout.strip()
        fp_two = _cli(two, "id").stdout.strip()
        addr_two = f"127.0.0.1:{ports[1][1]}"

        wrong = _cli(one, "peer", "pair", addr_two, "--expect", fp_one)
        assert wrong.returncode == 1 and "not the expected" in wrong.stderr
        no_tty = _cli(one, "peer", "pair", addr_two)
        assert no_tty.returncode == 1 and "--expect" in no_tty.stderr
        paired = _cli(one, "peer", "pair", addr_two, "--expect", fp_two)
        assert paired.returncode == 0, paired.stderr
        assert paired.stdout.startswith("paired:") and fp_two in paired.stdout and fp_two in paired.stderr

        listed = json.loads(_cli(two, "peer", "list", "--json").stdout)
        assert listed["peers"] == [] and listed["pending"][0]["fingerprint"] == fp_one
        typo = _cli(two, "peer", "grant-bench", fp_one[:-1] + ("0" if fp_one[-1] != "0" else "1"))
        assert typo.returncode == ExitCode.USAGE and "check symbol" in typo.stderr
        granted = _cli(two, "peer", "grant-bench", fp_one)
        assert granted.returncode == 0 and "granted bench" in granted.stdout and "not enabled" in granted.stderr
        assert _cli(two, "peer", "bench-config", "--enable", "--memory-floor", "0", "--disk-floor", "0").returncode == 0

        nodes = _cli(one, "nodes", addr_two, "127.0.0.1:1", "--json", "--timeout", "3")
        assert nodes.returncode == 1
        answers = json.loads(nodes.stdout)
        by_addr = {a["address"]: a for a in answers}
        checks = {c["id"]: c for c in by_addr[addr_two]["admission"]["checks"]}
        assert checks["bench.enabled"]["ok"] and checks["grant"]["ok"] and checks["signer"]["ok"]
        assert checks["busy"]["ok"] and checks["memory"]["ok"] and checks["disk"]["ok"]
        assert not checks["gpu"]["ok"]  # this machine has no GPU: a refusal, with its reason
        assert by_addr["127.0.0.1:1"]["error"] == "not paired with this machine"
        text = _cli(one, "nodes", addr_two)
        assert text.returncode == 1 and "refused" in text.stdout and "gpu: no GPU it can name" in text.stdout
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for proc in procs:
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
