"""The checks, in the order they are shown. Adding a check is adding a line here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metralectl.doctor import docker_checks as dk
from metralectl.doctor import gpu_checks as gp
from metralectl.doctor import hf_checks as hf
from metralectl.doctor import host_checks as host
from metralectl.doctor import recipe_checks as rc
from metralectl.doctor.model import Check, Finding, skipped

if TYPE_CHECKING:
    from collections.abc import Callable

    from metralectl.doctor.context import Context


def _gpu(fn: Callable[[Context], Finding]) -> Callable[[Context], Finding]:
    """A GPU check: not needed (skipped, never a problem) when --recipe names one whose hardware class declares no
    accelerator; without --recipe, or for a GPU class, it judges as ever."""
    def judged(ctx: Context) -> Finding:
        recipe = ctx.recipe()
        if recipe is not None:
            hardware = ctx.catalog().hardware[recipe.hardware]
            if not hardware.has_accelerator:
                return skipped(f"not needed: {recipe.name} runs on the CPU ({hardware.display_name}: no accelerator)",
                               None, accelerator=hardware.accelerator)
        return fn(ctx)
    return judged


def _docker(fn: Callable[[Context], Finding]) -> Callable[[Context], Finding]:
    """A Docker check: not needed (skipped, never a problem) when --recipe names one that runs as a host process
    (`runtime: process`, or `--runtime process`); recipe.program checks what it needs instead."""
    def judged(ctx: Context) -> Finding:
        recipe = ctx.recipe()
        if recipe is not None and recipe.runtime == "process":
            return skipped(f"not needed: {recipe.name} runs as a host process (runtime: process)", None,
                           runtime="process")
        return fn(ctx)
    return judged


GPU_REQUEST_TIMEOUT_S = 5.0  # create + start `IMAGE --version` with --gpus all + remove; the only slow check

CHECKS: tuple[Check, ...] = (
    Check("user.root", "Not running as root or under sudo", host.check_root),
    Check("docker.cli", "Docker CLI on PATH", dk.check_cli, general=True),
    Check("docker.daemon", "Docker daemon reachable", _docker(dk.check_daemon)),
    Check("docker.version", "Docker server version", _docker(dk.check_version)),
    Check("docker.nvidia-runtime", "NVIDIA runtime known to the daemon", _gpu(_docker(dk.check_nvidia_runtime))),
    Check("docker.gpu-request", "A container can get the GPUs", _gpu(_docker(dk.check_gpu_request)),
          timeout_s=GPU_REQUEST_TIMEOUT_S),
    Check("gpu.driver", "NVIDIA driver and CUDA version", _gpu(gp.check_driver)),
    Check("gpu.model", "GPU model and hardware class", _gpu(gp.check_model)),
    Check("gpu.memory", "GPU memory", _gpu(gp.check_memory)),
    Check("gpu.in-use", "GPU memory in use by others, or left over", _gpu(gp.check_in_use)),
    Check("cpu.arch", "CPU architecture matches the image", _docker(host.check_cpu_arch)),
    Check("hf.cache", "Hugging Face cache location", hf.check_location),
    Check("hf.writable", "Hugging Face cache writable", hf.check_writable),
    Check("hf.ownership", "No root-owned files in the HF cache", hf.check_ownership),
    Check("hf.disk", "Free disk for the weights", hf.check_disk),
    Check("hf.token", "Hugging Face token", hf.check_token, general=True),
    Check("path.metralectl", "metralectl on PATH", host.check_path, general=True),
    Check("net.port", "Engine port free", host.check_port),
    Check("net.rdma", "RDMA devices for EP=2 launches", host.check_rdma),
    Check("agent", "metralectl agent running", host.check_agent, general=True),
)

RECIPE_CHECKS: tuple[Check, ...] = (
    Check("recipe.program", "Recipe's engine program (runtime: process)", rc.check_program),
    Check("recipe.image", "Recipe's image present", _docker(rc.check_image)),
    Check("recipe.weights", "Recipe's weights cached", rc.check_weights),
    Check("recipe.fit", "Recipe fits this machine's memory", rc.check_fit),
)


def select(recipe: str | None) -> tuple[Check, ...]:
    """Every check; with a recipe, only what serving it needs, plus the recipe's own checks."""
    if recipe is None:
        return CHECKS
    return tuple(c for c in CHECKS if not c.general) + RECIPE_CHECKS
