"""EP=2 launches across two nodes, for real: two Docker daemons on this machine standing in for two
nodes (the second in its own network namespace, reached over a veth pair as tcp://10.77.0.2:2375 —
see node2.py), the engine test double on both with its real TCP rendezvous.

Root only (network namespaces and a second daemon): skipped with the reason elsewhere, a failure
under CI=true. The double's failure modes are chosen per node by image, as an operator's nodes
would differ: node 2's copy of the recipe's image tag is rebuilt with a fault baked in.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration import node2 as n2
from tests.integration.conftest import Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docker_image"))
import bundle  # noqa: E402 - the test image's own helper, beside build.sh

BUNDLED = bundle.BUNDLED_IMAGE
EP_REPO = "Sehyo/Qwen3.5-122B-A10B-NVFP4"
# image id in the user config -> (tag, ENV baked in on BOTH nodes)
EP_IMAGES = {
    "ep": (bundle.variant_tag("ep2"), {"DOUBLE_RENDEZVOUS_TIMEOUT": "30"}),
    "ep-rdv": (bundle.variant_tag("ep2-rdv"), {"DOUBLE_RENDEZVOUS_TIMEOUT": "4"}),
    "ep-slow": (bundle.variant_tag("ep2-slow"), {"DOUBLE_READY_DELAY": "30"}),
}


def _refuse(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node2(engine_images: dict[str, str]) -> Iterator[n2.Node2]:
    if os.geteuid() != 0:
        _refuse("two-node tests need root (a network namespace and a second Docker daemon)")
    missing = n2.missing_tools()
    if missing:
        _refuse(f"two-node tests need {', '.join(missing)} (Debian: iproute2, docker.io)")
    for tag, env in EP_IMAGES.values():
        bundle.build_variant(tag, env)
    node = n2.Node2()
    started = time.monotonic()
    try:
        node.setup([BUNDLED])
        for tag, env in EP_IMAGES.values():
            node.build_variant(tag, BUNDLED, env)
        print(f"\nnode2 ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield node
    finally:
        node.teardown()


@dataclass
class Ep:
    box: Box
    node: n2.Node2
    name: str
    port: int
    worker_port: int
    master_port: int

    def run(self, *args: str, timeout: float = 120, worker: str = n2.URL, rdma: bool = False
            ) -> subprocess.CompletedProcess[str]:
        """`run --worker`; --no-rdma unless asked: these two "nodes" (one machine) have no /dev/infiniband."""
        return self.box.cli("run", self.name, "--worker", worker, *args, *([] if rdma else ["--no-rdma"]),
                            timeout=timeout)

    def gone_everywhere(self) -> bool:
        return self.box.containers() == [] and self.node.containers(f"metralectl-{self.box.prefix}") == []

    def record(self) -> Path:
        return self.box.home / "metrale" / "state" / "deployments" / f"{self.name}.json"


@pytest.fixture()
def ep(box: Box, node2: n2.Node2) -> Iterator[Callable[..., Ep]]:
    """Make an EP=2 user recipe (the shipped 122B EP=2 recipe, served by the double, no GPU)."""
    for image_id, (tag, _) in EP_IMAGES.items():
        (box.config / "images" / f"double-{image_id}.yaml").write_text(
            f"schema: 1\nid: double-{image_id}\nref: {tag}\nengine: metrale\nhardware: [gb10]\n"
            "platform: linux/amd64\nrevision-label: org.opencontainers.image.revision\n")
    box.weights_complete(EP_REPO)
    node2.build_variant(EP_IMAGES["ep"][0], BUNDLED, EP_IMAGES["ep"][1])  # node 2's default: a healthy engine

    def make(short: str, image: str = "ep", worker_serve: str = "") -> Ep:
        name = f"{box.prefix}-{short}"
        port, worker_port, master_port = box.own_port(), box.own_port(), box.own_port()  # held on this host
        worker = f"{{role: worker, port: {worker_port}{', serve: {' + worker_serve + '}' if worker_serve else ''}}}"
        (box.config / "recipes" / f"{name}.yaml").write_text(
            f"extends: qwen3.5-122b-a10b-ep2\nname: {name}\ndescription: EP=2 served by the engine test double\n"
            f"image: double-{image}\nresources:\n  port: {port}\n  gpus: none\n  master-port: {master_port}\n"
            f"  ranks:\n    - {{role: head, port: {port}}}\n    - {worker}\n")
        return Ep(box, node2, name, port, worker_port, master_port)

    try:
        yield make
    finally:
        node2.remove_containers(f"metralectl-{box.prefix}")


def _fault_on_node2(node: n2.Node2, **env: str) -> None:
    tag, base_env = EP_IMAGES["ep"]
    node.build_variant(tag, BUNDLED, {**base_env, **env})


def _inspect(node: n2.Node2 | None, name: str) -> dict:
    args = ["docker", "inspect", name]
    out = node.docker(*args[1:]) if node else subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]


# --- the good launch -------------------------------------------------------------------------------------
def test_ep2_launch_both_ranks_detection_request_ps_logs_stop(ep, tmp_path: Path) -> None:
    e = ep("good")
    # the worker named by a Docker CLI context, as an operator would (`docker context create`)
    config = tmp_path / "docker-config"
    config.mkdir()
    subprocess.run(["docker", "--config", str(config), "context", "create", "mtl-node2", "--docker",
                    f"host={n2.URL}"], check=True, capture_output=True)
    e.box.env["DOCKER_CONFIG"] = str(config)
    started = time.monotonic()
    out = e.run(worker="mtl-node2")
    launch_s = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    err = out.stderr
    # what the detection showed, per node, and the choice
    assert "rank 0 (head) on this machine: enp1s0f1np1 10.77.0.1/24 (RoCE, chosen)" in err
    assert f"rank 1 (worker) on {n2.URL} (context mtl-node2): enp1s0f1np1 10.77.0.2/24 (RoCE, chosen)" in err
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1 on both nodes; --master-addr 10.77.0.1" in err
    assert "both ranks: --speculative present, --num-drafts 1, --mtp-quantization bf16" in err
    assert f"{EP_REPO} on rank 1 (worker)" in err and "verified 000000000000" in err
    assert "▸ r1 rendezvous" in err and "▸ r0 ready" in err and "a real request to the head" in err
    assert f"endpoint  http://127.0.0.1:{e.port}/v1" in out.stdout
    assert "roce      NCCL_SOCKET_IFNAME=enp1s0f1np1; master 10.77.0.1:" in out.stdout
    # both ranks, as rendered: one recipe, the detected interface and address on both
    head = _inspect(None, f"metralectl-{e.name}-r0")
    worker = _inspect(e.node, f"metralectl-{e.name}-r1")
    for info, rank in ((head, "0"), (worker, "1")):
        cmd = info["Config"]["Cmd"]
        assert cmd[cmd.index("--rank") + 1] == rank and cmd[cmd.index("--master-addr") + 1] == "10.77.0.1"
        assert cmd[cmd.index("--master-port") + 1] == str(e.master_port)
        assert "NCCL_SOCKET_IFNAME=enp1s0f1np1" in info["Config"]["Env"]
        assert info["State"]["Running"] and info["HostConfig"]["NetworkMode"] == "host"
        # the class's EP=2 profile, as the daemon got it (--no-rdma: NCCL over sockets, so no /dev/infiniband and
        # none of what RDMA memory registration needs: IPC_LOCK, memlock; the 32 GB /dev/shm stays)
        host_config = info["HostConfig"]
        assert host_config["ShmSize"] == 32 * 1024 ** 3 and host_config["IpcMode"] == "host"
        assert not host_config.get("Devices") and not host_config.get("CapAdd") and not host_config.get("Ulimits")
        assert "NCCL_IB_DISABLE=1" in info["Config"]["Env"] and "NCCL_PROTO=Simple" in info["Config"]["Env"]
        assert not any(v.startswith("NCCL_IB_HCA=") for v in info["Config"]["Env"])
    assert worker["Config"]["Labels"]["ai.metrale.metralectl.rank"] == "1"
    # the head serves; a real request goes through (the worker is joined)
    reply = httpx.post(f"http://127.0.0.1:{e.port}/v1/chat/completions",
                       json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}, timeout=10)
    assert reply.status_code == 200
    # ps covers both ranks, each on its node
    ps = json.loads(e.box.cli("ps", "--json", check=True).stdout)
    rows = {s["rank"]: s for s in ps["serving"] if s["recipe"] == e.name}
    assert set(rows) == {0, 1} and rows[0]["health"] == "ok" and rows[0]["node"] == "local"
    assert rows[1]["node"] == n2.URL and rows[1]["state"] == "running" and rows[1]["image_revision"]
    table = e.box.cli("ps", check=True).stdout
    assert "RANK" in table and "NODE" in table and n2.URL in table
    # logs of either rank
    worker_log = e.box.cli("logs", e.name, "--rank", "1", check=True).stdout
    assert "(worker): ready" in worker_log and "all ranks ready" in worker_log and "lost" not in worker_log
    assert "Server live and ready at" in e.box.cli("logs", e.name, check=True).stdout
    assert e.record().exists() and json.loads(e.record().read_text())["state"] == "ready"
    # hot swap away from a multi-rank deployment is refused (the engine's rule), nothing touched
    refused = e.box.cli("swap", e.box.recipe("single"))
    assert refused.returncode == 1 and "hot swap is single-node" in refused.stderr
    assert len(e.node.containers(f"metralectl-{e.box.prefix}")) == 1
    # stop takes both down, on both nodes
    stopped = e.box.cli("stop", e.name, check=True).stdout
    assert "rank 0 (head)" in stopped and f"rank 1 (worker) on {n2.URL}" in stopped
    assert stopped.count("removed: yes") == 2
    assert e.gone_everywhere() and not e.record().exists()
    print(f"\nEP=2 launch ready in {launch_s:.1f} s (probe, rendezvous, request included)\n{err}")


# --- refused before anything starts ------------------------------------------------------------------------
def test_ep2_without_rdma_devices_is_refused_before_starting(ep) -> None:
    """Neither "node" has /dev/infiniband: the RDMA launch (the default) is refused with the fix, not by Docker."""
    e = ep("nordma")
    out = e.run(rdma=True)
    assert out.returncode == 1, out.stderr
    assert "rank 0 (head) on this machine has no /dev/infiniband" in out.stderr
    assert "modprobe" in out.stderr and "--no-rdma" in out.stderr and "Traceback" not in out.stderr
    assert e.gone_everywhere() and not e.record().exists()


def test_ep2_flags_mismatch_in_the_recipe_is_refused_by_the_checker(ep) -> None:
    e = ep("ckmis", worker_serve="num-drafts: 2")
    out = e.run()
    assert out.returncode == 65 and "ranks differ in --num-drafts" in out.stderr
    assert "SSM intermediate-buffer" in out.stderr
    assert e.gone_everywhere() and not e.record().exists()


def test_ep2_interfaces_that_disagree_are_refused_before_starting(ep) -> None:
    e = ep("disagree")
    with e.node.renamed("enp1s0f0np0"):
        out = e.run()
    assert out.returncode == 1, out.stderr
    assert "the nodes disagree on the RoCE interface" in out.stderr
    assert "rank 0 (head) on this machine has enp1s0f1np1; rank 1 (worker) on tcp://10.77.0.2:2375 has enp1s0f0np0" in out.stderr
    assert "--roce-interface IF --master-addr IP" in out.stderr
    assert e.gone_everywhere() and not e.record().exists()
    assert e.node.containers("metralectl-probe") == []


def test_ep2_only_the_management_interface_is_refused(ep) -> None:
    e = ep("mgmt")
    with e.node.renamed("eno1", default_route=True):
        out = e.run()
    assert out.returncode == 1, out.stderr
    assert ("rank 1 (worker) on tcp://10.77.0.2:2375: no IPv4 address on enp1s0f0np0 or enp1s0f1np1; only the "
            "management interface (eno1 10.77.0.2/24) has one") in out.stderr
    assert "eno1 10.77.0.2/24 (management: default route)" in out.stderr  # what the detection showed
    assert e.gone_everywhere()


def test_ep2_worker_image_missing_is_refused_before_starting(ep) -> None:
    e = ep("noimage")
    e.node.docker("rmi", EP_IMAGES["ep"][0])
    out = e.run(timeout=180)
    assert out.returncode == 1, out.stderr
    assert "rank 1 (worker) on tcp://10.77.0.2:2375" in out.stderr and "pull" in out.stderr
    assert e.gone_everywhere() and not e.record().exists()


def test_ep2_given_interface_and_address_skip_detection_but_are_checked(ep) -> None:
    e = ep("given")
    out = e.run("--roce-interface", "enp1s0f1np1", "--master-addr", "10.77.0.1")
    assert out.returncode == 0, out.stderr
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1 (given), master 10.77.0.1" in out.stderr
    e.box.cli("stop", e.name, check=True)
    assert e.gone_everywhere()


# --- failures while starting: both ranks torn down, the failing rank named ------------------------------------
def _failed(out: subprocess.CompletedProcess[str], cause: str) -> None:
    assert out.returncode == 1, out.stderr
    assert f"start failed ({cause})" in out.stderr, out.stderr
    assert "hint:" in out.stderr and "Traceback" not in out.stderr


def test_ep2_worker_that_dies_at_start_tears_down_both(ep) -> None:
    e = ep("wdies")
    _fault_on_node2(e.node, DOUBLE_FAULT="exit-at-start")
    started = time.monotonic()
    out = e.run()
    _failed(out, "rank-exited")
    assert "rank 1 (worker) on tcp://10.77.0.2:2375" in out.stderr and "exited with code 1" in out.stderr
    # the worker's last words are shown (today's engine: `<time> ERROR Error: failed to start ...`)
    assert any(line.strip().startswith("r1│") and "ERROR Error: failed to start" in line
               for line in out.stderr.splitlines()), out.stderr
    assert time.monotonic() - started < 60
    assert e.gone_everywhere() and not e.record().exists()
    kept = out.stderr.split("logs kept in ")[1].split(" (rank 1)")[0]
    assert "DOUBLE_FAULT=exit-at-start" in Path(kept).read_text()


def test_ep2_flags_mismatch_at_runtime_kills_the_worker_and_both_go(ep) -> None:
    """Node 2's engine reports --num-drafts 3 at the rendezvous though both were started with 1 (an
    engine build whose own defaults differ; metralectl cannot render a mismatch itself)."""
    e = ep("rtmis")
    _fault_on_node2(e.node, DOUBLE_RANK_OVERRIDE="num-drafts=3")
    out = e.run()
    _failed(out, "flags-mismatch")
    assert "rank 1 (worker) on tcp://10.77.0.2:2375" in out.stderr and "SSM intermediate-buffer error" in out.stderr
    assert "--num-drafts" in out.stderr.split("hint:")[1]
    assert e.gone_everywhere()


def test_ep2_rendezvous_timeout_when_the_master_port_is_blocked(ep) -> None:
    if shutil.which("iptables") is None:
        _refuse("the rendezvous-timeout test blocks the master port with iptables (Debian: iptables)")
    e = ep("rdv", image="ep-rdv")
    with e.node.firewall(e.master_port):
        out = e.run()
    _failed(out, "rendezvous-timeout")
    assert "rendezvous timeout" in out.stderr and "firewall" in out.stderr.split("hint:")[1]
    assert e.gone_everywhere()


def test_ep2_stuck_at_all_ranks_ready(ep) -> None:
    """Node 2's engine runs NCCL on another interface than the head's (its own environment wins)."""
    e = ep("stuck")
    _fault_on_node2(e.node, DOUBLE_RANK_OVERRIDE="NCCL_SOCKET_IFNAME=eth9")
    out = e.run("--stall-timeout", "3")
    _failed(out, "nccl-stuck")
    assert 'stuck at "all ranks ready"' in out.stderr and "NCCL_SOCKET_IFNAME" in out.stderr.split("hint:")[1]
    assert e.gone_everywhere()


def test_ep2_healthy_head_with_a_silent_worker_is_caught_by_a_real_request(ep) -> None:
    e = ep("hang")
    _fault_on_node2(e.node, DOUBLE_FAULT="worker-drop")
    out = e.run("--first-request-timeout", "3")
    _failed(out, "requests-hang")
    assert "the head answers /health 200, but a 1-token request got no answer" in out.stderr
    assert "rank 1 (worker on tcp://10.77.0.2:2375) is not taking part" in out.stderr
    assert e.gone_everywhere()


def test_ep2_ctrl_c_tears_down_both(ep) -> None:
    e = ep("ctrlc", image="ep-slow")
    proc = e.box.popen("run", e.name, "--worker", n2.URL, "--no-rdma")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (e.box.containers() and e.node.containers(f"metralectl-{e.box.prefix}")):
        time.sleep(0.2)
    assert e.box.containers() and e.node.containers(f"metralectl-{e.box.prefix}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert e.gone_everywhere() and not e.record().exists()


def test_ep2_replaced_by_a_single_node_run_goes_as_a_whole(ep) -> None:
    e = ep("replaced")
    assert e.run().returncode == 0
    single = e.box.recipe("single")
    e.box.weights_complete()  # the single-node recipe's checkpoint
    out = e.box.cli("run", single, "--replace")
    assert out.returncode == 0, out.stderr
    assert f"(rank 1 of {e.name})" in out.stderr  # the worker on node 2 went too
    assert e.node.containers(f"metralectl-{e.box.prefix}") == [] and not e.record().exists()
    assert e.box.containers() == [f"metralectl-{single}"]
    e.box.cli("stop", single, check=True)
