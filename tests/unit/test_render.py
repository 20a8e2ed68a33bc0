"""What a recipe renders to: the golden flagship command and the container spec."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from metralectl.core.render import docker_run_command, render
from tests.unit.recipe_helpers import REPO, catalog

GOLDEN = REPO / "tests" / "golden" / "flagship-docker-run.txt"
# The engine's certified flagship (MI recipes/qwen3.5/qwen3.5-35b-a3b-nvfp4.yaml@2735884): the settings
# that differ from the book's Quickstart, which it supersedes (the engine wins), minus the launch facts
# metralectl owns (bind loopback).
CERTIFIED = [("--max-seq-len", "8192"), ("--max-batch-size", "2"), ("--max-num-seqs", "2"),
             ("--kv-cache-dtype", "fp8"), ("--gpu-memory-utilization", "0.85"), ("--scheduler", "slai"),
             ("--mtp-quantization", "bf16"), ("--oom-guard-mb", "1024"), ("--weight-quantization", "nvfp4"),
             ("--activation-quantization", "adaptive"), ("--tp-size", "1"), ("--ep-size", "1")]


@pytest.fixture()
def home_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HOME", "/home/operator")  # the golden must not depend on who runs the tests
    monkeypatch.setattr("metralectl.core.render.owner", lambda: "operator")


def _flagship_spec():
    cat = catalog()
    recipe = cat.recipes["qwen3.5-35b-a3b"]
    return render(recipe, cat.engines["metrale"], cat.images[recipe.image])


def test_flagship_golden(home_hf: None) -> None:
    text = docker_run_command(_flagship_spec())
    assert text + "\n" == GOLDEN.read_text()


def test_flagship_renders_the_certified_recipe(home_hf: None) -> None:
    words = shlex.split(docker_run_command(_flagship_spec()).replace("\\\n", " "))
    ours = {(a, b) for a, b in zip(words, words[1:])}
    for flag, value in [("--network", "host"), ("--gpus", "all"), ("serve", "Sehyo/Qwen3.5-35B-A3B-NVFP4"),
                        ("--port", "8888"), ("--bind", "127.0.0.1"), *CERTIFIED]:
        assert (flag, value) in ours, (flag, value)
    assert "--ipc=host" in words and "--speculative" in words and "--enable-prefix-caching" in words
    # pinned `false` is the flag's absence; every other setting is on the command line exactly once
    assert "--hermetic" not in words and "--exact-verify" not in words and "false" not in words
    options = [w for w in words[words.index("serve"):] if w.startswith("--")]
    assert len(options) == len(set(options))
    recipe = catalog().recipes["qwen3.5-35b-a3b"]
    stated = [k for k, v in recipe.serve.items() if v is not False]
    assert len(options) == len(stated) + 5  # + port, bind, gpu-memory-utilization, tp-size, ep-size
    mount = words[words.index("-v") + 1]
    assert mount == "~/.cache/huggingface:/root/.cache/huggingface"  # as in the book; the shell expands ~
    assert words.index("metrale/metrale-inference-gb10:latest") < words.index("serve")


def test_spec_is_data(home_hf: None) -> None:
    spec = _flagship_spec()
    assert spec.mounts[0].source == "/home/operator/.cache/huggingface"
    assert spec.network_mode == "host" and spec.ipc_mode == "host" and spec.gpus == "all"
    assert spec.command[:2] == ("serve", "Sehyo/Qwen3.5-35B-A3B-NVFP4")
    assert spec.labels["ai.metrale.metralectl.managed"] == "true"
    assert spec.labels["ai.metrale.metralectl.recipe"] == "qwen3.5-35b-a3b"
    assert spec.labels["ai.metrale.metralectl.spec-hash"] == spec.spec_hash()
    assert [m.target for m in spec.mounts] == ["/root/.cache/huggingface"]


def test_hf_hub_cache_is_honoured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    mounts = {m.target: m.source for m in _flagship_spec().mounts}
    assert mounts == {"/root/.cache/huggingface": str(tmp_path / "hfhome"),
                      "/root/.cache/huggingface/hub": str(tmp_path / "elsewhere")}


def test_auto_compact_off_is_the_flags_absence() -> None:
    from metralectl.core.overrides import apply_sets

    command = _flagship_spec().command
    assert command[command.index("--auto-compact") + 1] == "0"  # the engine's recipe pins 0
    cat = catalog()
    off = apply_sets(cat, cat.recipes["qwen3.5-35b-a3b"], ["auto-compact=off"])
    assert "--auto-compact" not in render(off, cat.engines["metrale"], cat.images[off.image]).command
    agents = cat.recipes["qwen3.5-35b-a3b-agents"]
    command = render(agents, cat.engines["metrale"], cat.images[agents.image]).command
    assert command[command.index("--auto-compact") + 1] == "0.85"
    assert "--enable-prefix-caching" in command


def test_multi_rank_renders_rank_and_rendezvous() -> None:
    cat = catalog()
    recipe = cat.recipes["qwen3.5-122b-a10b-ep2"]
    head = render(recipe, cat.engines["metrale"], cat.images[recipe.image], rank=0, master_addr="192.0.2.1")
    worker = render(recipe, cat.engines["metrale"], cat.images[recipe.image], rank=1, master_addr="192.0.2.1")
    for spec, rank, port in ((head, "0", "8888"), (worker, "1", "8889")):
        cmd = list(spec.command)
        assert cmd[cmd.index("--rank") + 1] == rank
        assert cmd[cmd.index("--world-size") + 1] == "2"
        assert cmd[cmd.index("--master-addr") + 1] == "192.0.2.1"
        assert cmd[cmd.index("--master-port") + 1] == "29500"
        assert cmd[cmd.index("--port") + 1] == port
    sym = lambda c: [w for w in c if w in ("--speculative",)] + [c[c.index(f) + 1] for f in ("--mtp-quantization", "--num-drafts")]
    assert sym(list(head.command)) == sym(list(worker.command))
    assert head.name != worker.name


def test_gpus_none_makes_no_device_request() -> None:
    from metralectl.core.overrides import apply_sets

    cat = catalog()
    recipe = apply_sets(cat, cat.recipes["qwen3.5-35b-a3b"], ["resources.gpus=none"])
    spec = render(recipe, cat.engines["metrale"], cat.images[recipe.image])
    assert spec.gpus is None
    assert "--gpus" not in docker_run_command(spec)


def test_multi_rank_carries_the_classes_nccl_environment_on_every_rank() -> None:
    from metralectl.core.render import spec_for

    cat = catalog()
    recipe = cat.recipes["qwen3.5-122b-a10b-ep2"]
    envs = [spec_for(cat, recipe, rank=r, roce_interface="enp1s0f1np1").env for r in (0, 1)]
    assert envs[0] == envs[1]
    assert envs[0]["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1" and envs[0]["NCCL_NVLS_ENABLE"] == "0"
    assert "NCCL_SOCKET_IFNAME" not in spec_for(cat, cat.recipes["qwen3.5-35b-a3b"]).env
    assert spec_for(cat, recipe, rank=0).env["NCCL_SOCKET_IFNAME"] == "<roce-ifname>"  # never a guess


def test_gpu_device_request_reaches_the_daemon_api() -> None:
    """create_and_start turns spec.gpus into a Docker device request (unit-tested: no GPU here)."""
    from metralectl.seams.docker.runtime import DockerRuntime
    calls: dict = {}

    class FakeApi:
        def create_host_config(self, **kwargs):  # noqa: ANN003, ANN201
            calls["host"] = kwargs
            return kwargs

        def create_container(self, **kwargs):  # noqa: ANN003, ANN201
            calls["create"] = kwargs
            return {"Id": "abc"}

        def start(self, container_id):  # noqa: ANN001, ANN201
            calls["start"] = container_id

        def inspect_container(self, _):  # noqa: ANN001, ANN201
            return {"Id": "abc", "Name": "/x", "State": {"Status": "running"}, "Config": {"Labels": {}}}

    runtime = DockerRuntime.__new__(DockerRuntime)
    runtime.api = FakeApi()  # type: ignore[assignment]
    runtime.create_and_start(_flagship_spec())
    [request] = calls["host"]["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert calls["host"]["network_mode"] == "host" and calls["host"]["ipc_mode"] == "host"
    assert calls["create"]["labels"]["ai.metrale.metralectl.managed"] == "true"


def test_ctrl_c_inside_create_removes_the_container_the_daemon_made() -> None:
    """An interrupt can land after the daemon created the container but before its id came back."""
    from metralectl.seams.docker.runtime import DockerRuntime
    removed: list[str] = []
    spec = _flagship_spec()

    class FakeApi:
        def create_host_config(self, **kwargs):  # noqa: ANN003, ANN201
            return kwargs

        def create_container(self, **kwargs):  # noqa: ANN003, ANN201
            raise KeyboardInterrupt  # the daemon made it; we never saw the id

        def inspect_container(self, name):  # noqa: ANN001, ANN201
            return {"Id": "made-by-daemon", "Name": f"/{name}", "State": {"Status": "created"},
                    "Config": {"Labels": {**spec.labels, "ai.metrale.metralectl.run-id": "r1"}}}

        def remove_container(self, container_id, force=False, v=False):  # noqa: ANN001, ANN201
            removed.append(container_id)

    runtime = DockerRuntime.__new__(DockerRuntime)
    runtime.api = FakeApi()  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        runtime.create_and_start(spec, {"ai.metrale.metralectl.run-id": "r1"})
    assert removed == ["made-by-daemon"]
    assert not runtime.remove_if_labelled(spec.name, {"ai.metrale.metralectl.run-id": "another-run"})
