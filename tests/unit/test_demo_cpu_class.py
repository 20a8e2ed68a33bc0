"""The `cpu` hardware class (kernels/cpu/hardware.yaml) and the demo recipe on it (recipes/demo-cpu.yaml).

What the class changes is read from its declared facts, `accelerator: none` and `memory.host-ram`: no GPU device
request at `docker run`, FITS on any box of its CPU architecture with the RAM for it, doctor's GPU checks not
needed. Every GPU class and recipe keeps its verdicts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from metralectl.app import library
from metralectl.core.catalog import check_files
from metralectl.core.fit import estimate
from metralectl.core.hardware import parse_hardware
from metralectl.core.render import docker_run_command, spec_for
from metralectl.core.yamlsrc import Document
from metralectl.doctor import registry
from metralectl.doctor.model import Finding, ok
from metralectl.seams import machine
from tests.unit.recipe_helpers import REPO, catalog, read

DEMO = "demo-cpu"
GPU_RECIPE = "qwen3.5-35b-a3b-hopper"
NO_GPU_HERE = dict(how="none detected (no NVIDIA GPU)", gpu_name=None, gpus_seen=())


def _row(name: str, target: library.Target) -> library.LibraryRow:
    return library.row(catalog(), catalog().recipes[name], target)


# ---- the class as data


def test_the_cpu_class_declares_no_accelerator_and_the_hosts_ram() -> None:
    hw = catalog().hardware["cpu"]
    assert not hw.has_accelerator and hw.accelerator == "none" and hw.host_memory
    assert hw.gpu_names == () and hw.rank_profile is None and not hw.multi_node and hw.vendor == "none"
    assert hw.memory_gb() is None and hw.memory_gb("NVIDIA H200", host_ram_gb=31.5) == 31.5  # the host's, no SKU
    for gpu in ("gb10", "hopper", "b200"):  # every GPU class: unchanged
        assert catalog().hardware[gpu].has_accelerator and not catalog().hardware[gpu].host_memory
    assert catalog().hardware["hopper"].memory_gb("NVIDIA H200", host_ram_gb=31.5) == 141


def _parse(**changes: Any) -> tuple[Any, list[str]]:
    data = yaml.safe_load((REPO / "kernels" / "cpu" / "hardware.yaml").read_text())
    data.update(changes)
    hw, check = parse_hardware(Document("kernels/x/hardware.yaml", data), None)
    return hw, [p.render() for p in check.problems]


@pytest.mark.parametrize("changes,fragment", [
    ({"accelerator": "tpu"}, "accelerator must be one of gpu, none"),
    ({"gpu-names": ["NVIDIA H200"]}, "a class without an accelerator has no GPU names"),
    ({"memory": {"unified": False}}, "serves from the host's RAM"),
    ({"memory": {"host-ram": "yes"}}, "memory.host-ram: must be `true` or `false`"),
    ({"memory": {"host-ram": True, "total-gb": 64}}, "total-gb"),
    ({"multi-node": {"interconnect": "x"}}, "has no multi-node launch"),
])
def test_a_class_without_an_accelerator_is_checked(changes: dict[str, Any], fragment: str) -> None:
    hw, problems = _parse(**changes)
    assert hw is None and any(fragment in p for p in problems), problems


def test_the_shipped_class_parses_clean() -> None:
    hw, problems = _parse()
    assert hw is not None and problems == []


def test_host_ram_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32768000 kB\nMemFree:         1000 kB\n")
    assert machine.host_memory_gb(meminfo) == pytest.approx(32768000 * 1024 / 1e9)
    assert machine.host_memory_gb(tmp_path / "absent") is None
    meminfo.write_text("MemFree: 12 kB\n")
    assert machine.host_memory_gb(meminfo) is None


# ---- fit and FITS


def test_the_budget_is_the_hosts_ram() -> None:
    recipe = catalog().recipes[DEMO]
    meaning = catalog().engines["llama-cpp"].memory_meaning
    est = estimate(recipe, catalog().model_of(recipe), catalog().hardware["cpu"], memory_meaning=meaning,
                   host_ram_gb=16.0)
    # not all of it: 10 % (at least 2 GB) stays with the OS, the desktop and Docker
    assert est.budget.gb == 14.0 and est.budget.basis.startswith("16 GB host RAM − 2.0 GB kept for the OS")
    big = estimate(recipe, catalog().model_of(recipe), catalog().hardware["cpu"], memory_meaning=meaning,
                   host_ram_gb=64.0)
    assert big.budget.gb == pytest.approx(57.6) and "64 GB host RAM − 6.4 GB kept" in big.budget.basis
    tiny = estimate(recipe, catalog().model_of(recipe), catalog().hardware["cpu"], memory_meaning=meaning,
                    host_ram_gb=1.5)
    assert tiny.budget.gb == 0.0 and tiny.fits is False  # less RAM than the OS keeps: nothing fits
    assert est.weights.gb == pytest.approx(0.49) and est.kv_pool.gb == pytest.approx(4096 * 24 * 2 * 64 * 4 / 1e9)
    assert est.fits is True
    unknown = estimate(recipe, catalog().model_of(recipe), catalog().hardware["cpu"], memory_meaning=meaning)
    assert unknown.budget.gb is None and "/proc/meminfo" in unknown.budget.basis and unknown.fits is None


def test_the_demo_fits_a_box_without_a_gpu_and_a_gpu_recipe_does_not() -> None:
    target = library.Target(None, host_ram_gb=16.0, cpu_arch="x86_64", **NO_GPU_HERE)  # type: ignore[arg-type]
    demo = _row(DEMO, target)
    assert demo.fits is True and "of this box's RAM" in demo.fits_reason and demo.memory_gb is not None
    assert demo.budget_gb == 14.0 and "of 14.0 GB" in demo.fits_reason
    gpu = _row(GPU_RECIPE, target)
    assert gpu.fits is False and "no NVIDIA GPU" in gpu.fits_reason


def test_the_demo_fits_a_gpu_box_too_and_the_gpu_recipes_verdict_is_unchanged() -> None:
    h200 = dict(how="detected NVIDIA H200", gpu_name="NVIDIA H200", gpus_seen=("NVIDIA H200",))
    with_host = library.Target("hopper", host_ram_gb=2048.0, cpu_arch="x86_64", **h200)  # type: ignore[arg-type]
    without = library.Target("hopper", **h200)  # type: ignore[arg-type]
    assert _row(DEMO, with_host).fits is True  # not "built for cpu, this is hopper": the CPU is every box's
    assert _row(GPU_RECIPE, with_host) == _row(GPU_RECIPE, without)  # the host's RAM means nothing to a GPU class
    assert _row(GPU_RECIPE, with_host).fits is True


@pytest.mark.parametrize("ram,arch,fits,fragment", [
    (2.3, "x86_64", False, "of 0.3 GB"),  # too little RAM (2 GB of 2.3 kept for the OS): said with the numbers
    (16.0, "aarch64", False, "built for x86_64 CPUs, this box is aarch64"),
    (None, "x86_64", None, "could not be read"),
])
def test_what_rules_the_demo_out(ram: float | None, arch: str, fits: bool | None, fragment: str) -> None:
    row = _row(DEMO, library.Target(None, host_ram_gb=ram, cpu_arch=arch, **NO_GPU_HERE))  # type: ignore[arg-type]
    assert row.fits is fits and fragment in row.fits_reason, row.fits_reason


# ---- the checker and the docker run


def test_the_checker_accepts_the_demo_recipe() -> None:
    recipe = catalog().recipes[DEMO]
    assert recipe.hardware == "cpu" and recipe.image == "llama-cpp-cpu" and recipe.resources.gpus == "none"
    assert recipe.warnings == () and recipe.serve["n-gpu-layers"] == 0 and recipe.resources.bind == "127.0.0.1"
    assert set(recipe.tags) == {"demo", "cpu", "gguf"} and recipe.model == "qwen2.5-0.5b-instruct"


def test_a_cpu_recipe_that_asks_for_gpus_is_refused(tmp_path: Path) -> None:
    data = read(REPO / "recipes" / f"{DEMO}.yaml")
    data["name"] = "demo-gpus"
    data["resources"]["gpus"] = "all"
    path = tmp_path / "demo-gpus.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    results = check_files(catalog(), [path])
    [(_, recipe, found)] = results
    problems = [p.render() for p in found]
    assert recipe is None
    assert any("hardware cpu has no accelerator" in p and "gpus: none" in p for p in problems), problems


def test_a_cpu_recipe_gets_no_gpu_device_request() -> None:
    spec = spec_for(catalog(), catalog().recipes[DEMO])
    assert spec.gpus is None and "--gpus" not in docker_run_command(spec)
    forced = spec_for(catalog(), catalog().recipes[DEMO], gpus_override="all")
    assert forced.gpus is None  # the class implies it, whatever a caller passes
    assert catalog().images["llama-cpp-cpu"].ref in docker_run_command(spec)


def test_a_gpu_recipe_still_gets_its_gpus() -> None:
    spec = spec_for(catalog(), catalog().recipes["qwen3.5-35b-a3b"])
    assert spec.gpus == "all" and "--gpus all" in docker_run_command(spec)


# ---- doctor


def _ctx(recipe: str | None) -> Any:
    return SimpleNamespace(recipe=lambda: catalog().recipes[recipe] if recipe else None, catalog=catalog)


def test_doctors_gpu_checks_are_not_needed_for_a_cpu_recipe_and_judge_as_ever_otherwise() -> None:
    calls: list[str] = []

    def gpu_check(ctx: Any) -> Finding:
        calls.append("judged")
        return ok("a GPU")

    wrapped = registry._gpu(gpu_check)
    skipped = wrapped(_ctx(DEMO))
    assert skipped.status == "skipped" and "not needed" in skipped.detail and calls == []
    assert wrapped(_ctx("qwen3.5-35b-a3b")).status == "ok" and wrapped(_ctx(None)).status == "ok"
    assert calls == ["judged", "judged"]
    gpu_ids = {"docker.nvidia-runtime", "docker.gpu-request", "gpu.driver", "gpu.model", "gpu.memory", "gpu.in-use"}
    wrapped_ids = {c.id for c in registry.CHECKS if getattr(c.fn, "__qualname__", "").startswith("_gpu.")}
    assert wrapped_ids == gpu_ids
