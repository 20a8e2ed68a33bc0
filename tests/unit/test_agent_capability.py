"""The agent's capability answer from the doctor's real checks on doctor's fakes: a machine whose only problems
are the GPU's still runs the CPU class's recipes of its own architecture (scope "cpu", the GPU's problems as
limits); Docker unusable, or no CPU recipe for this architecture, is "cannot run models"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metralectl.agent.capability import doctor_capability
from tests.unit.doctor_fakes import FakeRuntime, make_ctx, no_gpu, unavailable
from tests.unit.recipe_helpers import catalog


def _answer(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return doctor_capability(context_factory=lambda: make_ctx(tmp_path, **kw))


def _no_gpu_machine(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    meminfo = tmp_path / "meminfo-nogpu"
    meminfo.write_text("MemTotal:       24000000 kB\n")
    return dict(runtime=FakeRuntime(runtimes=("runc",)), gpu_probe_factory=no_gpu(meminfo), **kw)


def test_a_gpu_machine_can_run_models(tmp_path: Path) -> None:
    answer = _answer(tmp_path)
    assert answer["can_run"] is True and answer["scope"] == "gpu", answer
    assert answer["problems"] == [] == answer["limits"] and answer["summary"] == "this machine can run models"


def test_no_gpu_on_x86_64_runs_the_cpu_recipes_and_lists_what_the_gpu_ones_lack(tmp_path: Path) -> None:
    answer = _answer(tmp_path, **_no_gpu_machine(tmp_path))
    cpu_recipes = sorted(name for name, r in catalog().recipes.items()
                         if not catalog().hardware[r.hardware].has_accelerator)
    assert cpu_recipes and "demo-cpu" in cpu_recipes
    assert answer["can_run"] is True and answer["scope"] == "cpu", answer
    assert answer["summary"].startswith("this machine can run CPU recipes only (demo-cpu")
    assert answer["problems"] == []
    limits = {p["id"] for p in answer["limits"]}
    assert limits and limits <= {"docker.nvidia-runtime", "gpu.driver", "gpu.model"}, answer["limits"]
    assert "docker.nvidia-runtime" in limits  # a daemon with runc only


def test_no_gpu_on_an_arch_without_a_cpu_recipe_cannot_run_models(tmp_path: Path) -> None:
    # the shipped CPU class is x86_64 (its image is linux/amd64): an aarch64 box without a GPU runs nothing
    answer = _answer(tmp_path, **_no_gpu_machine(tmp_path, cpu_arch=lambda: "aarch64"))
    assert answer["can_run"] is False and answer["scope"] is None, answer
    assert answer["summary"].startswith("this machine cannot run models: ")
    assert {p["id"] for p in answer["problems"]} >= {"docker.nvidia-runtime"} and answer["limits"] == []


def test_docker_unusable_cannot_run_models_even_with_cpu_recipes(tmp_path: Path) -> None:
    def down() -> Any:
        raise unavailable("not-running", "Cannot connect to the Docker daemon")

    answer = _answer(tmp_path, **_no_gpu_machine(tmp_path, runtime_factory=down))
    assert answer["can_run"] is False and answer["scope"] is None, answer
    assert "docker.daemon" in {p["id"] for p in answer["problems"]}


def test_a_broken_catalog_makes_no_cpu_claim(tmp_path: Path) -> None:
    def broken() -> Any:
        raise RuntimeError("catalog exploded")

    answer = _answer(tmp_path, **_no_gpu_machine(tmp_path, catalog_loader=broken))
    assert answer["can_run"] is False and answer["scope"] is None, answer
