"""Recipe -> ContainerSpec (command as data), and ContainerSpec -> a copy-pasteable `docker run` (or, for a
recipe of `runtime: process`, the `env -i ... /abs/engine ...` line that starts it on the host).

`run --print` prints the spec as a shell command; `run` hands the same spec to the runtime seam;
tests assert on it. Nothing here touches Docker. A process-mode spec (docs/serving.md, "Running engines without
Docker") carries the full argv with the program's absolute path first (the caller finds it:
seams/engine_programs.py), `image` "process:<that path>", host paths (the HF cache where it is) and no mounts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl import paths
from metralectl.core.contract import EngineContract
from metralectl.core.cpulist import render as cpu_list
from metralectl.core.engine_config import GeneratedFile, generated
from metralectl.core.hardware import HardwareClass
from metralectl.core.image_info import ImageInfo
# The label table lives in core.labels; these names stay importable from here for older callers.
from metralectl.core.labels import ENGINE_AUTH_TOKEN, LABEL_ENGINE, LABEL_ENGINE_AUTH, LABEL_GPU_IDS
from metralectl.core.labels import LABEL_MANAGED as LABEL_MANAGED
from metralectl.core.labels import LABEL_OWNER as LABEL_OWNER
from metralectl.core.labels import LABEL_PREFIX as LABEL_PREFIX
from metralectl.core.labels import LABEL_RANK as LABEL_RANK
from metralectl.core.labels import LABEL_RECIPE as LABEL_RECIPE
from metralectl.core.labels import LABEL_RUN_ID as LABEL_RUN_ID
from metralectl.core.labels import LABEL_SPEC_HASH as LABEL_SPEC_HASH
from metralectl.core.labels import owner as owner  # here for older callers; in labels so `ps` need not load render
from metralectl.core.placement import ids_text
from metralectl.core.recipe import Recipe
from metralectl.errors import MetralError

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog

CONTAINER_HF_HOME = "/root/.cache/huggingface"
PROCESS_IMAGE_PREFIX = "process:"  # a process-mode spec's `image`: the program it runs, after this


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """Everything `docker run` needs, as a value."""

    name: str
    image: str
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    gpus: str | int | None = "all"  # "all", a count, or None for no device request
    network_mode: str = "host"
    ipc_mode: str = "host"
    port: int = 0  # where the engine listens (host network: no publishing)
    bind: str = "127.0.0.1"
    rank: int = 0
    # a multi-rank launch's profile (the hardware class's multi-node.container); empty for a single node
    devices: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    ulimits: tuple[tuple[str, int, int], ...] = ()  # (name, soft, hard)
    shm_size: str | None = None
    files: tuple[GeneratedFile, ...] = ()  # written by the launch before it starts (core/engine_config.py)
    # the GPUs a box of several placed it on (`placed`, core/placement.py): Docker's device ids instead of the
    # count, a host process's CUDA_VISIBLE_DEVICES; None: the first `gpus` (as ever). Never in the spec hash.
    gpu_ids: tuple[int, ...] | None = None
    cpu_ids: tuple[int, ...] | None = None  # off the gateway's CPUs (seams/affinity.py); None: all. Not hashed

    @property
    def is_process(self) -> bool:
        """Started as a host process (runtime: process), not in a container."""
        return self.image.startswith(PROCESS_IMAGE_PREFIX)

    @property
    def engine_env(self) -> dict[str, str]:
        """The environment the engine gets: `env`, with a host process's placement (gpu_ids) made visible."""
        if not self.is_process or self.gpu_ids is None:
            return dict(self.env)
        return {**self.env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ids_text(self.gpu_ids)}

    def spec_hash(self) -> str:
        """Identity of what would run (labels and the placement excluded, so the hash can be one of them and the
        same recipe on other GPUs is the same launch). The multi-rank profile counts only when set, so a
        single-node spec hashes as it always did."""
        body = asdict(self)
        body.pop("labels")
        body.pop("gpu_ids")
        body.pop("cpu_ids")
        for key in _PROFILE_FIELDS:
            if not body[key]:
                body.pop(key)
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


_PROFILE_FIELDS = ("devices", "cap_add", "ulimits", "shm_size", "files")


def placed(spec: ContainerSpec, recipe: Recipe, ids: tuple[int, ...] | None) -> ContainerSpec:
    """spec on the GPUs `ids` (core/placement.py chose them), recorded in its gpu-ids label; unchanged where there
    is nothing to place: no ids, a spec of `gpus: all`/`none`, ids of another count, a host process whose recipe
    sets CUDA_VISIBLE_DEVICES itself (the recipe's own env wins)."""
    wanted = recipe.resources.gpus if spec.is_process else spec.gpus
    if ids is None or not isinstance(wanted, int) or isinstance(wanted, bool) or len(ids) != wanted:
        return spec
    if spec.is_process and ("CUDA_VISIBLE_DEVICES" not in spec.env or "CUDA_VISIBLE_DEVICES" in recipe.env):
        return spec
    return replace(spec, gpu_ids=tuple(ids), labels={**spec.labels, LABEL_GPU_IDS: ids_text(ids)})


def hf_mounts(container_hf_home: str = CONTAINER_HF_HOME) -> tuple[Mount, ...]:
    """The HF cache where the engine inside looks for it (HF_HOME, or HF_HUB_CACHE when set apart)."""
    mounts = [Mount(str(paths.hf_home()), container_hf_home)]
    hub = paths.hf_hub_cache()
    if "HF_HUB_CACHE" in os.environ and hub != paths.hf_home() / "hub":
        mounts.append(Mount(str(hub), f"{container_hf_home}/hub"))
    return tuple(mounts)


def container_name(recipe: Recipe, rank: int = 0) -> str:
    suffix = f"-r{rank}" if recipe.multi_rank else ""
    return f"metralectl-{recipe.name}{suffix}"


def serve_argv(recipe: Recipe, contract: EngineContract, *, rank: int = 0, master_addr: str | None = None,
               serve_command: tuple[str, ...] | None = None) -> list[str]:
    """`serve <hf-id>` (or the engine's model-argument form) and every flag, explicit: no engine default is
    inherited silently; then the flags the engine's launcher always sets (llama.cpp's --offline --metrics).
    `serve_command`: other words than the engine file's `serve-command` (a host process's, `process.serve-command`)."""
    rank_info = recipe.resources.ranks[rank]
    command = contract.serve_command if serve_command is None else serve_command
    argv = [*command, *contract.model_argument.words(recipe.checkpoint.repo, recipe.checkpoint.quant)]
    resource_values = {
        "port": rank_info.port,
        "bind": recipe.resources.bind,
        "memory-utilization": recipe.resources.memory_utilization,
        "master-port": recipe.resources.master_port,
        "tp-size": recipe.resources.tp_size,
        "ep-size": recipe.resources.ep_size,
    }
    serve = rank_info.serve
    revision = contract.revision(recipe.engine_revision)
    specs = revision.specs if revision is not None else contract.flags
    # Every policy that pins tp/ep sizes wants them on the command line even at 1 (nothing inherited).
    pinned = revision is not None and revision.policy.required == "all"
    from metralectl.core.engines.registry import engine_for  # lazy: plugins load when a launch is rendered

    engine = engine_for(recipe.engine)
    for spec in specs.values():
        if spec.recipe == "resources" and spec.resource in resource_values:
            value = resource_values[spec.resource]
            single_only = ("master-port",) if pinned else ("master-port", "tp-size", "ep-size")
            if value is None or (not recipe.multi_rank and spec.resource in single_only):
                continue
            argv += spec.render_value(value)
            if recipe.multi_rank and spec.name == engine.rank_arguments_after:
                argv += engine.rank_arguments(rank, recipe.resources.world_size, master_addr or "<head-ip>")
        elif spec.name in serve:
            argv += spec.render_value(serve[spec.name])
    for name, value in contract.launcher_sets.items():
        argv += contract.flags[name].render_value(value)
    return argv


def nccl_env(recipe: Recipe, hardware: HardwareClass | None, roce_interface: str | None, *, rdma: bool = True,
             rdma_device: str | None = None) -> dict[str, str]:
    """The hardware class's NCCL settings for a multi-rank launch; the interface and the RDMA device only as
    detected (or given), never guessed: NCCL_IB_HCA is left out when no device is known (NCCL then picks)."""
    profile = hardware.rank_profile if hardware is not None else None
    if not recipe.multi_rank or profile is None:
        return {}
    env = dict(profile.nccl_env)
    if not rdma:
        env.update(profile.no_rdma_env)
    env["NCCL_SOCKET_IFNAME"] = roce_interface or "<roce-ifname>"
    if rdma and rdma_device:
        env["NCCL_IB_HCA"] = rdma_device
    return dict(sorted(env.items()))


def process_argv(recipe: Recipe, contract: EngineContract, program: str, *, rank: int = 0) -> list[str]:
    """A host process's whole argv: the program (an absolute path), `-m MODULE` for a Python module engine, then
    what a container's entrypoint would be given (after the process's own `serve-command` where the file states
    one: vLLM's image is given `vllm serve`, its API server module nothing)."""
    if contract.process is None:
        raise MetralError(f"the {contract.display_name} engine file does not say how to start it as a host process")
    start = [program, "-m", contract.process.module] if contract.process.module else [program]
    return [*start, *serve_argv(recipe, contract, rank=rank, serve_command=contract.process.serve_command)]


def process_env(contract: EngineContract) -> dict[str, str]:
    """What a host process needs to find the weights metralectl verified: the engine's offline env, with the
    HF cache where it really is on this host (HF_HOME, and HF_HUB_CACHE, which llama.cpp and the hub read first)."""
    env = dict(contract.weights.offline_env)
    env["HF_HOME"] = str(paths.hf_home())
    env["HF_HUB_CACHE"] = str(paths.hf_hub_cache())
    return env


def spec_for(catalog: Catalog, recipe: Recipe, **options: Any) -> ContainerSpec:
    """render() with the recipe's contract, image and hardware class looked up in the catalog. A recipe of
    `runtime: process` needs `program=` (the absolute path seams/engine_programs.locate found)."""
    return render(recipe, catalog.engines[recipe.engine], catalog.image_for(recipe),
                  hardware=catalog.hardware.get(recipe.hardware), **options)


def render(recipe: Recipe, contract: EngineContract, image: ImageInfo, *, rank: int = 0,
           master_addr: str | None = None, extra_env: dict[str, str] | None = None,
           gpus_override: str | int | None = "recipe", hardware: HardwareClass | None = None,
           roce_interface: str | None = None, rdma: bool = True, rdma_device: str | None = None,
           program: str | None = None, engine_token: str | None = None) -> ContainerSpec:
    """`engine_token`: the host path of metralectl's engine token file, when the launch layer turned engine auth
    on (lifecycle/engine_token.py): the engine is handed the file (never the token) and labelled to ask it."""
    if engine_token and contract.token_file is None:
        raise MetralError(f"the {contract.display_name} engine takes no token file", "a bug if you see this")
    if recipe.runtime == "process":
        return _process_spec(recipe, contract, program, rank=rank, extra_env=extra_env, engine_token=engine_token,
                             hardware=hardware)
    gpus: str | int | None = recipe.resources.gpus
    if gpus == "none":
        gpus = None
    if gpus_override != "recipe":
        gpus = gpus_override
    if hardware is not None and not hardware.has_accelerator:
        gpus = None  # a class without an accelerator never asks Docker for a GPU (the checker also holds gpus: none)
    env = nccl_env(recipe, hardware, roce_interface, rdma=rdma, rdma_device=rdma_device)
    profile = hardware.rank_profile if hardware is not None and recipe.multi_rank else None
    env.update(contract.weights.offline_env)  # the weights were verified in the cache: never download at start
    env.update(recipe.env)
    env.update(extra_env or {})
    command = serve_argv(recipe, contract, rank=rank, master_addr=master_addr)
    mounts = hf_mounts(contract.weights.container_hf_home)
    made = generated(recipe.name, contract.display_name, contract.config_file, recipe.engine_config, process=False)
    if made is not None:  # the recipe's engine-config, mounted read-only where the flag points
        command += made[1]
        mounts += (Mount(made[0].host_path, made[2], read_only=True),)
    if engine_token and contract.token_file is not None:  # mounted read-only where the flag points
        command += contract.token_file.words(contract.flags, contract.token_file.container_path)
        mounts += (Mount(engine_token, contract.token_file.container_path, read_only=True),)
    spec = ContainerSpec(
        name=container_name(recipe, rank),
        image=image.ref,
        command=tuple(command),
        env=env,
        mounts=mounts,
        files=(made[0],) if made else (),
        gpus=gpus,
        port=recipe.resources.ranks[rank].port,
        bind=recipe.resources.bind,
        rank=rank,
        devices=profile.extras(rdma).devices if profile else (),
        cap_add=profile.extras(rdma).cap_add if profile else (),
        ulimits=profile.extras(rdma).ulimits if profile else (),
        shm_size=profile.shm_size if profile else None,
    )
    return _labelled(spec, recipe, contract, rank, bool(engine_token))


def gpu_visibility(gpus: str | int, hardware: HardwareClass | None) -> dict[str, str]:
    """The GPUs a host process may use, as `resources.gpus` gives a container (Docker's count takes the first N
    devices): a count shows the first N by NVML's (PCI bus) order, which CUDA's default order need not be; `none`
    shows none; `all`, or a class without an accelerator, sets nothing. The recipe's own env is applied after."""
    if gpus == "all" or (hardware is not None and not hardware.has_accelerator):
        return {}
    if gpus == "none":
        return {"CUDA_VISIBLE_DEVICES": ""}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(int(gpus)))}


def _process_spec(recipe: Recipe, contract: EngineContract, program: str | None, *, rank: int,
                  extra_env: dict[str, str] | None, engine_token: str | None = None,
                  hardware: HardwareClass | None = None) -> ContainerSpec:
    """The process-mode spec: argv from the absolute program, the env the recipe and the engine file state
    (the runtime adds only its fixed allow-list from the caller's environment), the GPUs `resources.gpus` allows
    (gpu_visibility), nothing else of a container."""
    if not program or not os.path.isabs(program):
        raise MetralError(f"{recipe.name} runs as a host process: its program must be an absolute path, not "
                          f"{program!r}", "seams/engine_programs.locate finds it (a bug if you see this)")
    argv = process_argv(recipe, contract, program, rank=rank)
    env = process_env(contract)
    env.update(gpu_visibility(recipe.resources.gpus, hardware))
    env.update(recipe.env)
    env.update(extra_env or {})
    made = generated(recipe.name, contract.display_name, contract.config_file, recipe.engine_config, process=True)
    if made is not None:  # a host process reads the file where it is written
        argv += made[1]
    if engine_token and contract.token_file is not None:  # a host process reads the token file where it is
        argv += contract.token_file.words(contract.flags, engine_token)
    spec = ContainerSpec(name=container_name(recipe, rank), image=PROCESS_IMAGE_PREFIX + argv[0], command=tuple(argv),
                         env=env, files=(made[0],) if made else (), gpus=None, port=recipe.resources.ranks[rank].port, bind=recipe.resources.bind,
                         rank=rank)
    return _labelled(spec, recipe, contract, rank, bool(engine_token))


def _labelled(spec: ContainerSpec, recipe: Recipe, contract: EngineContract, rank: int,
              engine_auth: bool = False) -> ContainerSpec:
    labels = {
        LABEL_MANAGED: "true",
        LABEL_RECIPE: recipe.name,
        LABEL_SPEC_HASH: spec.spec_hash(),
        LABEL_OWNER: owner(),
        LABEL_ENGINE: contract.name,
    }
    if recipe.multi_rank:
        labels[LABEL_RANK] = str(rank)
    if engine_auth:
        labels[LABEL_ENGINE_AUTH] = ENGINE_AUTH_TOKEN
    return ContainerSpec(**{**asdict(spec), "labels": labels, "mounts": spec.mounts, "files": spec.files})


def _shell_path(path: str) -> str:
    """Shell text for a host path: ~/... stays readable and still expands when pasted."""
    home = str(Path.home())
    if path.startswith(home + os.sep):
        rest = path[len(home):]
        if shlex.quote(rest) == rest:
            return "~" + rest
        return '"$HOME"' + shlex.quote(rest)
    return shlex.quote(path)


def process_command(spec: ContainerSpec, environment: dict[str, str], *, width: int = 88) -> str:
    """The exact start of a process-mode spec as a shell line: `env -i`, every variable the engine gets (the
    runtime's allow-list from this shell, then the spec's), then its argv, wrapped as docker_run_command wraps."""
    q = shlex.quote
    lines = ["env -i"]
    lines += _wrap([[q(f"{k}={v}")] for k, v in environment.items()], width)
    groups = _flag_groups(list(spec.command))
    lines.append(" ".join(q(word) for word in groups[0]))
    lines += _wrap([[q(word) for word in group] for group in groups[1:]], width)
    return " \\\n  ".join(lines)


def docker_run_command(spec: ContainerSpec, *, width: int = 88) -> str:
    """The exact `docker run` for spec, shell-quoted, wrapped with backslashes between options."""
    q = shlex.quote
    lines = [f"docker run -d --name {q(spec.name)}"]
    runtime = ["--network", q(spec.network_mode)]
    if spec.gpu_ids is not None:
        runtime += ["--gpus", q(f'"device={ids_text(spec.gpu_ids)}"')]
    elif spec.gpus is not None:
        runtime += ["--gpus", q(str(spec.gpus))]
    runtime.append(q(f"--ipc={spec.ipc_mode}"))
    if spec.cpu_ids is not None:  # kept off the gateway's own CPUs (seams/affinity.py)
        runtime += ["--cpuset-cpus", q(cpu_list(spec.cpu_ids))]
    lines.append(" ".join(runtime))
    profile = [f"--device {q(d)}" for d in spec.devices] + [f"--cap-add {q(c)}" for c in spec.cap_add]
    profile += [f"--ulimit {q(f'{n}={soft}:{hard}')}" for n, soft, hard in spec.ulimits]
    profile += [f"--shm-size {q(spec.shm_size)}"] if spec.shm_size else []
    if profile:
        lines.append(" ".join(profile))
    for mount in spec.mounts:
        suffix = ":ro" if mount.read_only else ""
        lines.append("-v " + _shell_path(mount.source) + q(f":{mount.target}{suffix}"))
    lines += _wrap([["--label", q(f"{k}={v}")] for k, v in spec.labels.items()], width)
    lines += _wrap([["-e", q(f"{k}={v}")] for k, v in spec.env.items()], width)
    lines.append(q(spec.image))
    groups = _flag_groups(list(spec.command))
    lines.append(" ".join(q(word) for word in groups[0]))
    lines += _wrap([[q(word) for word in group] for group in groups[1:]], width)
    return " \\\n  ".join(lines)


def _wrap(groups: list[list[str]], width: int) -> list[str]:
    lines: list[str] = []
    current = ""
    for group in groups:
        text = " ".join(group)
        if current and len(current) + 1 + len(text) > width:
            lines.append(current)
            current = text
        else:
            current = f"{current} {text}" if current else text
    if current:
        lines.append(current)
    return lines


def _flag_groups(command: list[str]) -> list[list[str]]:
    """Keep each flag with its value, and `serve <model>` together, so wrapping never splits them."""
    groups: list[list[str]] = []
    for word in command:
        opens_flag = word.startswith("--")
        if groups and not opens_flag and (not groups[-1][0].startswith("--") or len(groups[-1]) == 1):
            groups[-1].append(word)
        else:
            groups.append([word])
    return groups
