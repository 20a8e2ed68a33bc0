"""EP=2 launches, the pure parts: rank symmetry of rendered commands, the head's URL, the deployment
record, naming a node's Docker endpoint. The real thing (two daemons) is tests/integration/test_multinode.py."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from metralectl.errors import MetralError
from metralectl.lifecycle import deployment
from metralectl.lifecycle.multinode import flag_value, head_url, symmetry_problems
from metralectl.core.render import spec_for
from metralectl.seams.docker.endpoints import Endpoint, endpoint_for
from tests.unit.recipe_helpers import catalog


def _ranks(name: str = "qwen3.5-122b-a10b-ep2"):
    cat = catalog()
    recipe = cat.recipes[name]
    specs = [spec_for(cat, recipe, rank=r, master_addr="10.0.0.1", roce_interface="enp1s0f0np0") for r in (0, 1)]
    return cat.engines["metrale"], specs


def _swap_flag(command: tuple[str, ...], flag: str, value: str) -> tuple[str, ...]:
    words = list(command)
    words[words.index(flag) + 1] = value
    return tuple(words)


def test_flag_value_reads_values_presence_and_absence() -> None:
    command = ("serve", "m", "--speculative", "--num-drafts", "2", "--bind=0.0.0.0", "--profile")
    assert flag_value(command, "speculative") is True and flag_value(command, "num-drafts") == "2"
    assert flag_value(command, "bind") == "0.0.0.0" and flag_value(command, "profile") is True
    assert flag_value(command, "dflash") is None


@pytest.mark.parametrize("name", ["qwen3.5-122b-a10b-ep2", "deepseek-v4-flash-ep2", "minimax-m2.7-ep2"])
def test_shipped_ep2_recipes_render_symmetric_ranks(name: str) -> None:
    contract, specs = _ranks(name)
    assert symmetry_problems(specs, contract) == []
    assert specs[0].port != specs[1].port


def test_a_worker_with_other_mtp_flags_is_refused() -> None:
    contract, (head, worker) = _ranks()
    odd = replace(worker, command=_swap_flag(worker.command, "--num-drafts", "3"))
    [problem] = symmetry_problems([head, odd], contract)
    assert "--num-drafts differs" in problem and "rank 1: 3" in problem and "SSM intermediate-buffer" in problem
    no_spec = replace(worker, command=tuple(w for w in worker.command if w != "--speculative"))
    assert any("--speculative differs" in p and "rank 1: absent" in p for p in symmetry_problems([head, no_spec], contract))


def test_nccl_environment_image_rendezvous_and_ports_must_agree() -> None:
    contract, (head, worker) = _ranks()
    other_if = replace(worker, env={**worker.env, "NCCL_SOCKET_IFNAME": "enp1s0f1np1"})
    assert any("NCCL environment differs" in p and "NCCL_SOCKET_IFNAME" in p for p in symmetry_problems([head, other_if], contract))
    nvls = [replace(s, env={**s.env, "NCCL_NVLS_ENABLE": "1"}) for s in (head, worker)]
    assert any("NCCL_NVLS_ENABLE must be 0" in p for p in symmetry_problems(nvls, contract))
    assert any("runs other:tag" in p for p in symmetry_problems([head, replace(worker, image="other:tag")], contract))
    moved = replace(worker, command=_swap_flag(worker.command, "--master-addr", "10.0.0.9"))
    assert "--master-addr differs between ranks" in symmetry_problems([head, moved], contract)
    assert any("own port" in p for p in symmetry_problems([head, replace(worker, port=head.port)], contract))


def test_head_url_local_remote_and_unreachable_loopback() -> None:
    local = Endpoint("unix:///var/run/docker.sock", "default")
    assert head_url(local, "127.0.0.1", 8888) == "http://127.0.0.1:8888"
    remote = Endpoint("ssh://ops@spark1", "--head", spec="ssh://ops@spark1")
    assert head_url(remote, "0.0.0.0", 8888) == "http://spark1:8888"
    assert head_url(remote, "192.168.1.10", 8888) == "http://192.168.1.10:8888"
    with pytest.raises(MetralError, match="cannot reach"):
        head_url(remote, "127.0.0.1", 8888)
    assert Endpoint("tcp://127.0.0.1:2375", "x").is_local and not Endpoint("tcp://10.77.0.2:2375", "x").is_local


def _record(run_id: str = "r1") -> deployment.Deployment:
    ranks = (deployment.RankRecord(0, "head", "unix:///var/run/docker.sock", "default", "", "spark1", "metralectl-x-r0",
                                   "id0", 8888, "10.0.0.1"),
             deployment.RankRecord(1, "worker", "tcp://10.0.0.2:2376", "--worker", "spark2", "spark2", "metralectl-x-r1",
                                   "id1", 8889, "10.0.0.2"))
    return deployment.Deployment(run_id, "x-ep2", "starting", "http://127.0.0.1:8888", "enp1s0f0np0", "10.0.0.1", 29500,
                                 ranks, time.time(), ("serve.max-seq-len=2048",))


def test_deployment_record_round_trips_atomically_and_is_forgotten_per_run() -> None:
    dep = _record()
    deployment.save(dep)
    assert deployment.find("x-ep2") == dep and deployment.load_all() == [dep]
    assert not list(deployment.directory().glob(".*"))  # no temp file left behind
    deployment.save(dep.with_state("ready"))
    assert deployment.find("x-ep2").state == "ready"  # type: ignore[union-attr]
    assert deployment.find("x-ep2").rank(1).endpoint == "tcp://10.0.0.2:2376"  # type: ignore[union-attr]
    with pytest.raises(MetralError, match="no rank 2"):
        dep.rank(2)
    deployment.forget("x-ep2", run_id="another-run")  # a newer launch's record is not ours to drop
    assert deployment.find("x-ep2") is not None
    deployment.forget("x-ep2", run_id="r1")
    assert deployment.find("x-ep2") is None and deployment.load_all() == []


def test_an_unreadable_record_is_skipped(tmp_path: Path) -> None:
    deployment.path_for("broken").write_text("{not json")
    deployment.save(_record())
    assert [d.recipe for d in deployment.load_all()] == ["x-ep2"]


def test_endpoint_for_urls_and_bad_names() -> None:
    assert endpoint_for("tcp://10.77.0.2:2375") == Endpoint("tcp://10.77.0.2:2375", "--worker", None, "tcp://10.77.0.2:2375")
    assert endpoint_for("ssh://ops@spark2", "head").source == "--head"
    assert endpoint_for("ssh://ops@spark2").host == "spark2"
    with pytest.raises(MetralError, match="not a Docker context name nor an endpoint URL"):
        endpoint_for("spark2:2375")


def test_endpoint_for_reads_docker_cli_contexts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A context made by `docker context create spark2 --docker host=ssh://ops@spark2`, as the CLI stores it."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no config.json: the CLI does not need one either
    meta = tmp_path / "contexts" / "meta" / hashlib.sha256(b"spark2").hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps({"Name": "spark2", "Metadata": {},
                                                "Endpoints": {"docker": {"Host": "ssh://ops@spark2", "SkipTLSVerify": False}}}))
    found = endpoint_for("spark2")
    assert found.url == "ssh://ops@spark2" and found.source == "context spark2" and found.spec == "spark2"
    assert found.describe() == "ssh://ops@spark2 (context spark2)"
    with pytest.raises(MetralError, match="no Docker context named 'spark3'") as err:
        endpoint_for("spark3")
    assert "docker context create spark3 --docker host=ssh://USER@spark3" in (err.value.hint or "")


def test_ssh_endpoints_without_paramiko_say_what_to_install() -> None:
    import importlib.util

    from metralectl.seams.docker.errors import DockerUnavailable

    from metralectl.seams.docker.runtime import DockerRuntime
    if importlib.util.find_spec("paramiko") is not None:
        pytest.skip("paramiko is installed here: docker-py's ssh transport loads")
    with pytest.raises(DockerUnavailable) as err:
        DockerRuntime(Endpoint("ssh://nobody@127.0.0.9", "--worker"))
    assert err.value.cause == "ssh-unsupported" and "paramiko" in (err.value.hint or "")
