"""The EP=2 launch profile (kernels/gb10/hardware.yaml multi-node): what each rank's container gets — the RDMA
devices, IPC_LOCK, unlimited memlock, a 32 GB /dev/shm and the NCCL environment — rendered as the exact
`docker run` and handed to the Docker SDK the same way; single-node launches get none of it; a node without
/dev/infiniband is refused before anything starts, with the fix."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from metralectl.errors import MetralError
from metralectl.core.hardware import parse_hardware
from metralectl.lifecycle import rdma
from metralectl.seams.netprobe import ProbeReport, RdmaView, parse_probe, probe_script
from metralectl.core.render import docker_run_command, render, spec_for
from metralectl.seams.docker.containers import profile_kwargs
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.core.yamlsrc import Document
from tests.unit.recipe_helpers import REPO, catalog

GOLDEN = REPO / "tests" / "golden" / "ep2-rank1-docker-run.txt"
EP2 = "qwen3.5-122b-a10b-ep2"
UPSTREAM_NCCL = {  # MC collective.rs@5e6c4dd `nccl-roce` (17) + the book's NCCL_NET_GDR_C2C
    "NCCL_IB_GID_INDEX": "", "NCCL_CROSS_NIC": "", "NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "0",
    "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_TIMEOUT": "22",
    "NCCL_IB_RETRY_CNT": "7", "NCCL_NET_GDR_LEVEL": "0", "NCCL_DMABUF_ENABLE": "0", "NCCL_NVLS_ENABLE": "0",
    "NCCL_CUMEM_HOST_ENABLE": "0", "NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", "NCCL_BUFFSIZE": "33554432",
    "NCCL_MIN_NCHANNELS": "1", "NCCL_MAX_NCHANNELS": "2", "NCCL_NET_GDR_C2C": "0",
}


@pytest.fixture()
def home_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/home/operator")
    monkeypatch.setattr("metralectl.core.render.owner", lambda: "operator")


def _ep2(rank: int = 1, **options):  # type: ignore[no-untyped-def]
    cat = catalog()
    return spec_for(cat, cat.recipes[EP2], rank=rank, master_addr="192.0.2.1", roce_interface="enp1s0f0np0",
                    **options)


# --- rendering ------------------------------------------------------------------------------------------------
def test_ep2_rank_golden(home_hf: None) -> None:
    """The exact `docker run` of rank 1 (regenerate deliberately: the golden is what an operator pastes)."""
    assert docker_run_command(_ep2(rdma_device="rocep1s0f0")) + "\n" == GOLDEN.read_text()


def test_both_ranks_carry_the_profile_and_upstreams_nccl_environment() -> None:
    for rank in (0, 1):
        spec = _ep2(rank)
        assert spec.devices == ("/dev/infiniband",) and spec.cap_add == ("IPC_LOCK",)
        assert spec.ulimits == (("memlock", -1, -1),) and spec.shm_size == "32gb"
        nccl = {k: v for k, v in spec.env.items() if k.startswith("NCCL_")}
        assert nccl == {**UPSTREAM_NCCL, "NCCL_SOCKET_IFNAME": "enp1s0f0np0"}  # no NCCL_IB_HCA unless detected


def test_a_single_node_launch_gets_none_of_it(home_hf: None) -> None:
    cat = catalog()
    spec = render(cat.recipes["qwen3.5-35b-a3b"], cat.engines["metrale"], cat.images["metrale-inference-gb10"],
                  hardware=cat.hardware["gb10"])
    assert (spec.devices, spec.cap_add, spec.ulimits, spec.shm_size) == ((), (), (), None)
    assert not any(k.startswith("NCCL_") for k in spec.env)
    text = docker_run_command(spec)
    assert "--device" not in text and "--cap-add" not in text and "--shm-size" not in text
    assert profile_kwargs(spec) == {}
    assert text + "\n" == (REPO / "tests" / "golden" / "flagship-docker-run.txt").read_text()  # hash unchanged too


def test_rdma_device_only_when_known_and_no_rdma_drops_the_devices() -> None:
    assert _ep2(rdma_device="rocep1s0f0").env["NCCL_IB_HCA"] == "rocep1s0f0"
    plain = _ep2(rdma=False, rdma_device="rocep1s0f0")
    assert plain.devices == () and plain.cap_add == () and plain.ulimits == ()  # all three serve RDMA only
    assert plain.shm_size == "32gb"
    assert plain.env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in plain.env
    assert "--device" not in docker_run_command(plain)


def test_the_sdk_gets_what_the_command_shows() -> None:
    """profile_kwargs through docker-py's own HostConfig: the daemon API sees --device/--cap-add/--ulimit/--shm-size."""
    from docker.types import HostConfig

    config = HostConfig(version="1.41", network_mode="host", ipc_mode="host", **profile_kwargs(_ep2()))
    assert config["Devices"] == [{"PathOnHost": "/dev/infiniband", "PathInContainer": "/dev/infiniband",
                                  "CgroupPermissions": "rwm"}]
    assert config["CapAdd"] == ["IPC_LOCK"]
    assert config["Ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    assert config["ShmSize"] == 32 * 1024 ** 3


def test_create_and_start_passes_the_profile() -> None:
    from metralectl.seams.docker.runtime import DockerRuntime
    seen: dict = {}

    class FakeApi:
        def create_host_config(self, **kwargs):  # noqa: ANN003, ANN201
            seen.update(kwargs)
            return kwargs

        def create_container(self, **kwargs):  # noqa: ANN003, ANN201
            return {"Id": "abc"}

        def start(self, container_id):  # noqa: ANN001, ANN201
            pass

        def inspect_container(self, _):  # noqa: ANN001, ANN201
            return {"Id": "abc", "Name": "/x", "State": {"Status": "running"}, "Config": {"Labels": {}}}

    runtime = DockerRuntime.__new__(DockerRuntime)
    runtime.api = FakeApi()  # type: ignore[assignment]
    runtime.create_and_start(_ep2())
    assert seen["devices"] == ["/dev/infiniband:/dev/infiniband:rwm"] and seen["cap_add"] == ["IPC_LOCK"]
    assert [(u["Name"], u["Soft"], u["Hard"]) for u in seen["ulimits"]] == [("memlock", -1, -1)]
    assert seen["shm_size"] == "32gb"


@pytest.mark.parametrize("text,hint", [
    ('error gathering device information while adding custom device "/dev/infiniband": no such file or directory',
     "RDMA_HINT"),
    ("failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: "
     "error during container init: error setting rlimits for ready process: error setting rlimit type 8: operation "
     "not permitted: unknown", "MEMLOCK_HINT"),
])
def test_the_daemons_profile_errors_are_translated(text: str, hint: str) -> None:
    """The daemon's own words (both seen from Docker 20.10 on this test box) become the node's fix."""
    import docker.errors

    from metralectl.seams.docker import errors as rt
    from metralectl.seams.docker.client import translate

    response = type("R", (), {"status_code": 500, "reason": "Server Error", "url": "x"})()
    refused = translate(Endpoint("unix:///nowhere.sock", "test"),
                        docker.errors.APIError("500", response=response, explanation=text))
    assert isinstance(refused, rt.Refused)
    failure = rt.refused_failure(refused)
    assert isinstance(failure, rt.RuntimeFailure) and failure.hint == getattr(rt, hint)
    assert "--no-rdma" in (failure.hint or "")


# --- the data ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad,needle", [
    ({"nccl-env": {"NCCL_SOCKET_IFNAME": "eth0"}}, "come from the detected link"),
    ({"nccl-env": {"NCCL_IB_HCA": "mlx5_0"}}, "come from the detected link"),
    ({"container": {"devices": ["infiniband"]}}, "under /dev/"),
    ({"container": {"ulimits": {"memlock": "lots"}}}, "SOFT:HARD"),
    ({"container": {"shm-size": "huge"}}, "32gb"),
    ({"container": {"cap-add": ["ipc_lock"]}}, "IPC_LOCK"),
    ({"container": {"rdma": {"devices": ["dev/a"]}}}, "under /dev/"),
    ({"container": {"rdma": {"shm-size": "1g"}}}, "shm-size"),
])
def test_a_bad_profile_is_refused(bad: dict, needle: str) -> None:
    data = {"schema": 1, "id": "x", "vendor": "nvidia", "arch": "sm_121f", "cpu-arch": "aarch64", "boot-timeout-s": 9,
            "multi-node": {"roce-interfaces": ["eth1"], **bad}}
    hw, check = parse_hardware(Document("kernels/x/hardware.yaml", data), None)
    assert hw is None and any(needle in p.message + (p.hint or "") for p in check.problems), check.problems


def test_the_classes_without_multi_node_have_no_profile() -> None:
    cat = catalog()
    assert cat.hardware["gb10"].rank_profile is not None
    assert cat.hardware["hopper"].rank_profile is None and cat.hardware["b200"].rank_profile is None


# --- detection: the RDMA device behind the interface, and whether a node has /dev/infiniband at all -------------
def test_the_probe_reads_rdma_devices_from_sysfs(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    (sys_root / "class/net/enp1s0f0np0/device/infiniband/rocep1s0f0").mkdir(parents=True)
    (sys_root / "class/net/enp1s0f1np1/device/infiniband/rocep1s0f1").mkdir(parents=True)
    (sys_root / "class/net/eno1").mkdir(parents=True)
    (sys_root / "class/infiniband_verbs/uverbs0").mkdir(parents=True)
    out = subprocess.run(["sh", "-c", probe_script(sys_root=str(sys_root))], capture_output=True, text=True).stdout
    report = parse_probe(out)
    assert report.rdma is not None and report.rdma.verbs == ("uverbs0",)
    assert report.rdma.device_for("enp1s0f0np0") == "rocep1s0f0" and report.rdma.device_for("eno1") is None


def test_a_host_without_rdma_reads_as_no_verbs(tmp_path: Path) -> None:
    out = subprocess.run(["sh", "-c", probe_script(sys_root=str(tmp_path))], capture_output=True, text=True).stdout
    report = parse_probe(out)
    assert report.rdma is not None and report.rdma.verbs == () and report.rdma.links == {}


@dataclass
class FakeNode:
    rank: int
    local: bool
    probe: ProbeReport | None

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("unix:///var/run/docker.sock" if self.local else "tcp://10.0.0.2:2376", "test")

    @property
    def label(self) -> str:
        return f"rank {self.rank} ({'head' if self.rank == 0 else 'worker'})"


def _report(verbs: tuple[str, ...], links: dict[str, tuple[str, ...]]) -> ProbeReport:
    from metralectl.seams.netprobe import NodeNet

    return ProbeReport(NodeNet(), None, RdmaView(links, verbs))


PROFILE = catalog().hardware["gb10"].rank_profile


def test_a_remote_node_without_verbs_is_refused_with_the_fix() -> None:
    nodes = [FakeNode(0, False, _report(("uverbs0",), {"enp1s0f0np0": ("rocep1s0f0",)})),
             FakeNode(1, False, _report((), {}))]
    with pytest.raises(MetralError) as refused:
        rdma.check_rdma(nodes, PROFILE, "enp1s0f0np0", rdma=True, given_device=None, on_event=lambda e: None)
    assert "rank 1 (worker) has no /dev/infiniband" in refused.value.message
    assert "modprobe" in (refused.value.hint or "") and "--no-rdma" in (refused.value.hint or "")


def test_this_machine_is_checked_by_its_device_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rdma.os.path, "exists", lambda p: False)
    nodes = [FakeNode(0, True, _report(("uverbs0",), {})), FakeNode(1, False, _report(("uverbs0",), {}))]
    with pytest.raises(MetralError, match="rank 0 \\(head\\) has no /dev/infiniband"):
        rdma.check_rdma(nodes, PROFILE, "enp1s0f0np0", rdma=True, given_device=None, on_event=lambda e: None)


def test_detected_devices_per_node_and_no_rdma_skips_the_check() -> None:
    nodes = [FakeNode(0, False, _report(("uverbs0",), {"enp1s0f0np0": ("rocep1s0f0",)})),
             FakeNode(1, False, _report(("uverbs0",), {"enp1s0f0np0": ("mlx5_0",)}))]
    events: list = []
    found = rdma.check_rdma(nodes, PROFILE, "enp1s0f0np0", rdma=True, given_device=None, on_event=events.append)
    assert found == {0: "rocep1s0f0", 1: "mlx5_0"}
    bare = [FakeNode(0, False, _report((), {})), FakeNode(1, False, None)]
    assert rdma.check_rdma(bare, PROFILE, "x", rdma=False, given_device=None, on_event=events.append) == {0: None, 1: None}


def test_per_node_hca_is_not_an_asymmetry() -> None:
    from metralectl.lifecycle.multinode import symmetry_problems

    cat = catalog()
    specs = [_ep2(0, rdma_device="rocep1s0f0"), _ep2(1, rdma_device="mlx5_0")]
    assert symmetry_problems(specs, cat.engines["metrale"]) == []


# --- doctor ------------------------------------------------------------------------------------------------------
def _doctor(tmp_path: Path, recipe: str | None, present: bool):  # type: ignore[no-untyped-def]
    from metralectl.doctor import CHECKS, RECIPE_CHECKS, run_checks
    from tests.unit import doctor_fakes as df

    check = next(c for c in CHECKS + RECIPE_CHECKS if c.id == "net.rdma")
    ctx = df.make_ctx(tmp_path, recipe=recipe, path_exists=lambda p: present and p == "/dev/infiniband")
    [result] = run_checks(ctx, [check])
    ctx.close()
    return result


@pytest.mark.parametrize("recipe,present,status,needle", [
    (EP2, False, "problem", "no /dev/infiniband: qwen3.5-122b-a10b-ep2 is an EP=2 recipe"),
    (EP2, True, "ok", "/dev/infiniband present"),
    ("qwen3.5-35b-a3b", False, "skipped", "single-node recipe"),
    ("qwen3.5-35b-a3b-hopper", False, "skipped", "hopper has no multi-node"),
])
def test_doctor_says_whether_an_ep2_rank_would_get_its_rdma_devices(tmp_path: Path, recipe: str, present: bool,
                                                                    status: str, needle: str) -> None:
    result = _doctor(tmp_path, recipe, present)
    assert result.status == status and needle in result.detail, result
    if status == "problem":
        assert "--no-rdma" in (result.remedy or "")
