"""A spec placed on chosen GPUs (core/render.placed): Docker's device request names them, a host process sees them
through CUDA_VISIBLE_DEVICES (the recipe's own env still wins), `--print` shows them, the gpu-ids label records
them, and the spec hash ignores them (the same recipe on other GPUs is the same launch)."""

from __future__ import annotations

from typing import Any

from metralectl.core.labels import LABEL_GPU_IDS, LABEL_SPEC_HASH
from metralectl.core.overrides import apply_sets
from metralectl.core.render import ContainerSpec, docker_run_command, placed, process_command, spec_for
from metralectl.lifecycle.specs import engine_environment
from tests.unit.recipe_helpers import catalog

RECIPE = "qwen3.5-35b-a3b"
LLAMA = "qwen3.5-35b-a3b-llamacpp"
PROGRAM = "/opt/llama.cpp/bin/llama-server"


def _docker(*sets: str) -> tuple[Any, ContainerSpec]:
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe(RECIPE), list(sets))
    return recipe, spec_for(cat, recipe)


def _process(*sets: str) -> tuple[Any, ContainerSpec]:
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe(LLAMA), ["runtime=process", *sets])
    return recipe, spec_for(cat, recipe, program=PROGRAM)


def test_placement_is_labelled_and_not_in_the_hash() -> None:
    recipe, spec = _docker("resources.gpus=2")
    on = placed(spec, recipe, (1, 3))
    assert on.gpu_ids == (1, 3) and on.labels[LABEL_GPU_IDS] == "1,3"
    assert on.spec_hash() == spec.spec_hash() == on.labels[LABEL_SPEC_HASH]
    assert placed(spec, recipe, (4, 5)).spec_hash() == on.spec_hash()
    assert LABEL_GPU_IDS not in spec.labels and spec.gpu_ids is None


def test_nothing_to_place_leaves_the_spec_alone() -> None:
    recipe, spec = _docker("resources.gpus=2")
    assert placed(spec, recipe, None) is spec
    assert placed(spec, recipe, (1,)) is spec  # ids of another count
    every, spec_all = _docker()  # gpus: all
    assert placed(spec_all, every, (0, 1)) is spec_all


def test_docker_print_names_the_devices() -> None:
    recipe, spec = _docker("resources.gpus=2")
    assert "--gpus 2 " in docker_run_command(spec)
    text = docker_run_command(placed(spec, recipe, (1, 3)))
    assert "--gpus '\"device=1,3\"'" in text and "ai.metrale.metralectl.gpu-ids=1,3" in text


def test_docker_device_request_names_the_ids() -> None:
    """create_and_start asks the daemon for those devices, not a count (unit-tested: no GPU here)."""
    from metralectl.seams.docker.runtime import DockerRuntime
    calls: dict[str, Any] = {}

    class FakeApi:
        def create_host_config(self, **kwargs: Any) -> Any:
            calls["host"] = kwargs
            return kwargs

        def create_container(self, **kwargs: Any) -> Any:
            calls["create"] = kwargs
            return {"Id": "abc"}

        def start(self, container_id: str) -> None:
            calls["start"] = container_id

        def inspect_container(self, _: str) -> Any:
            return {"Id": "abc", "Name": "/x", "State": {"Status": "running"}, "Config": {"Labels": {}}}

    recipe, spec = _docker("resources.gpus=2")
    runtime = DockerRuntime.__new__(DockerRuntime)
    runtime.api = FakeApi()  # type: ignore[assignment]
    runtime.create_and_start(placed(spec, recipe, (2, 5)))
    [request] = calls["host"]["device_requests"]
    assert request["DeviceIDs"] == ["2", "5"] and request["Capabilities"] == [["gpu"]]
    assert request.get("Count") in (None, 0)
    assert calls["create"]["labels"][LABEL_GPU_IDS] == "2,5"
    runtime.create_and_start(spec)
    [request] = calls["host"]["device_requests"]
    assert request["Count"] == 2 and not request.get("DeviceIDs")


def test_a_host_process_sees_its_placed_gpus() -> None:
    recipe, spec = _process("resources.gpus=2")
    on = placed(spec, recipe, (3, 6))
    env = engine_environment(on)
    assert env["CUDA_VISIBLE_DEVICES"] == "3,6" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert on.env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the spec as rendered: the hash's
    assert on.spec_hash() == spec.spec_hash() and on.labels[LABEL_GPU_IDS] == "3,6"
    assert "CUDA_VISIBLE_DEVICES=3,6" in process_command(on, engine_environment(on))


def test_a_host_process_recipes_own_visibility_wins() -> None:
    recipe, spec = _process("resources.gpus=1", "env.CUDA_VISIBLE_DEVICES=3")
    assert placed(spec, recipe, (5,)) is spec
    assert engine_environment(spec)["CUDA_VISIBLE_DEVICES"] == "3"
    every, spec_all = _process()  # gpus: all
    assert placed(spec_all, every, (0,)) is spec_all


def test_the_process_runtime_starts_the_placed_environment() -> None:
    from metralectl.seams.process.launch import _initial, _request

    recipe, spec = _process("resources.gpus=1")
    on = placed(spec, recipe, (4,))
    assert _request(on, on.name, "l", "log", 1)["env"]["CUDA_VISIBLE_DEVICES"] == "4"
    assert _initial(on, on.name, "l", on.labels, "log")["spec_hash"] == spec.spec_hash()
