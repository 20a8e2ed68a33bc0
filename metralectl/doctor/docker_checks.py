"""Docker: the CLI, the daemon (through the SDK, as `run` reaches it), its version, the NVIDIA runtime, and
whether a container may ask for GPUs."""

from __future__ import annotations

import os
import re
import stat
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.core.labels import LABEL_DOCTOR
from metralectl.doctor.context import Context
from metralectl.doctor.facts import Unanswered
from metralectl.doctor.model import Finding, ok, problem, skipped, warn
from metralectl.wording import noun

if TYPE_CHECKING:
    from metralectl.seams.docker.protocol import ContainerRuntime

TOOLKIT_REMEDY = ("install the NVIDIA container toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker "
                  "&& sudo systemctl restart docker`")
GPU_PROBE_WAIT_S = 2.0


def check_cli(ctx: Context) -> Finding:
    found = ctx.which("docker")
    if found:
        return ok(f"docker CLI at {found}", path=found)
    return ok("no docker CLI on PATH: not needed (metralectl talks to the daemon through the SDK; list, show and "
              "run --print work without Docker at all); the book's `docker ...` checks need it", path=None)


def _socket_facts(url: str) -> dict[str, Any]:
    if not url.startswith("unix://"):
        return {}
    path = url[len("unix://"):]
    try:
        st = os.stat(path)
    except OSError:
        return {"socket": path, "socket_exists": False}
    import grp
    import pwd

    def name(lookup: Any, ident: int) -> str:
        try:
            return str(lookup(ident)[0])
        except KeyError:
            return str(ident)

    return {"socket": path, "socket_exists": True, "socket_owner": name(pwd.getpwuid, st.st_uid),
            "socket_group": name(grp.getgrgid, st.st_gid), "socket_mode": f"{stat.S_IMODE(st.st_mode):04o}"}


def _permission_remedy(ctx: Context) -> tuple[str, str]:
    """(the case, what to do) for a permission-denied socket, from /etc/group vs this process's groups."""
    me = ctx.identity
    if me.docker_gid is None:
        return ("there is no docker group on this machine",
                ("sudo groupadd docker && sudo usermod -aG docker $USER && newgrp docker   "
                 "(then check: docker info --format '{{.ServerVersion}}')"))
    if me.docker_listed and not me.docker_active:
        return ((f"{me.user} is in the docker group in /etc/group, but this shell (or the service manager that "
                 "started it) began before that change and does not carry the group"),
                ("run `newgrp docker` or log out and back in; a service started before the change (the metralectl "
                 f"agent, your systemd user manager) keeps the old groups: `sudo systemctl restart "
                 f"user@{me.uid}.service` or reboot"))
    if me.docker_active:
        return ("this process has the docker group, yet the socket refuses it (check the socket's group and mode)",
                "ls -l the socket: it should be root:docker 0660; `sudo systemctl restart docker.socket` restores it")
    return (f"{me.user} is not in the docker group",
            "sudo usermod -aG docker $USER && newgrp docker   (then check: docker info --format '{{.ServerVersion}}')")


def check_daemon(ctx: Context) -> Finding:
    from metralectl.seams.docker.errors import DockerUnavailable
    try:
        runtime = ctx.runtime()
    except Unanswered:
        url, source = ctx.endpoint()
        return problem(f"the Docker daemon at {url} ({source}) did not answer within {ctx.docker_budget_s:g} s "
                       "(unreachable: hung daemon, firewall, or something else listening there)",
                       "check DOCKER_HOST / `docker context ls` and `docker info`; restart the daemon if it hangs "
                       "(sudo systemctl restart docker)", cause="unreachable", endpoint=url, endpoint_source=source)
    except DockerUnavailable as exc:
        url, source = ctx.endpoint()
        me = ctx.identity
        data: dict[str, Any] = {"cause": exc.cause, "endpoint": url, "endpoint_source": source,
                                "in_docker_group": me.docker_listed, "docker_group_active": me.docker_active,
                                **_socket_facts(url)}
        if exc.cause == "permission-denied":
            case, remedy = _permission_remedy(ctx)
            sock = ""
            if data.get("socket_exists"):
                sock = f" (socket {data['socket_owner']}:{data['socket_group']} {data['socket_mode']})"
            return problem(f"permission denied on {url}{sock}: {case}", remedy, **data)
        hint = exc.hint
        if source == "DOCKER_HOST" and exc.cause in ("not-running", "unreachable") and "DOCKER_HOST" not in (hint or ""):
            hint = (f"{hint}; or DOCKER_HOST={url} points at the wrong place: `unset DOCKER_HOST` uses the default "
                    "socket (`docker context ls` lists the others)")
        return problem(exc.message, hint, **data)
    except ImportError as exc:
        return problem(f"the Docker SDK for Python is not installed ({exc}); metralectl cannot reach Docker",
                       "reinstall metralectl (its `docker` dependency is missing): pip install 'docker>=7.0'",
                       cause="sdk-missing")
    endpoint = runtime.endpoint
    return ok(f"{endpoint.url} ({endpoint.source}) answers", endpoint=endpoint.url,
              endpoint_source=endpoint.source, **_socket_facts(endpoint.url))


def _docker_or_skip(ctx: Context) -> ContainerRuntime | None:
    try:
        return ctx.runtime()
    except Exception:  # noqa: BLE001 - docker.daemon says why
        return None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0].split("-")[0])[:3])


def check_version(ctx: Context) -> Finding:
    runtime = _docker_or_skip(ctx)
    if runtime is None:
        return skipped("no daemon to ask (see the daemon check)")
    with ctx.runtime_lock:
        version = runtime.server_version()
    parsed = _version_tuple(version)
    if parsed and parsed < (19, 3):
        return problem(f"Docker Engine {version} is older than 19.03: it cannot hand GPUs to containers (--gpus)",
                       "upgrade Docker Engine", version=version)
    return ok(f"Docker Engine {version}", version=version)


def _nvidia_cdi_specs(dirs: list[str]) -> list[str]:
    found: list[str] = []
    for directory in dirs:
        try:
            found += sorted(str(p) for p in Path(directory).iterdir() if p.name.startswith("nvidia")
                            and p.suffix in (".yaml", ".yml", ".json"))
        except OSError:
            continue
    return found


def check_nvidia_runtime(ctx: Context) -> Finding:
    runtime = _docker_or_skip(ctx)
    if runtime is None:
        return skipped("no daemon to ask (see the daemon check)")
    info = ctx.docker_info()
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    default = info.get("DefaultRuntime")
    cdi_dirs = [str(d) for d in info.get("CDISpecDirs") or []]
    data: dict[str, Any] = {"runtimes": runtimes, "default_runtime": default, "cdi_spec_dirs": cdi_dirs}
    if "nvidia" in runtimes:
        return ok(f"the daemon knows the nvidia runtime (runtimes: {', '.join(runtimes)}; default {default})", **data)
    local = str(runtime.endpoint.url).startswith("unix://")
    specs = _nvidia_cdi_specs(cdi_dirs) if local else []
    if specs:
        return ok(f"NVIDIA CDI {noun(len(specs), 'spec')} {', '.join(specs)} (CDI dirs: {', '.join(cdi_dirs)})",
                  **data, cdi_specs=specs)
    hook = ctx.which("nvidia-container-runtime-hook") if local else None
    if hook:
        return ok(f"no nvidia runtime registered, but {hook} is installed: `--gpus` works through it "
                  f"(runtimes: {', '.join(runtimes)})", **data, hook=hook)
    return problem(f"the daemon knows no NVIDIA runtime (runtimes: {', '.join(runtimes) or 'none'}; "
                   f"CDI: {', '.join(cdi_dirs) or 'none'}): containers cannot get a GPU", TOOLKIT_REMEDY, **data)


def _probe_image(ctx: Context) -> tuple[str | None, list[str]]:
    """A locally present engine image to ask for a GPU with: the recipe's, this class's, then any shipped one."""
    catalog = ctx.catalog()
    refs: list[str] = []
    recipe = ctx.recipe()
    if recipe is not None and recipe.image in catalog.images:
        refs.append(catalog.image_for(recipe).ref)
    hw_id, _ = ctx.target_hardware()
    hw = catalog.hardware.get(hw_id) if hw_id else None
    if hw is not None and hw.image in catalog.images:
        refs.append(catalog.images[hw.image].ref)
    refs += sorted(image.ref for image in catalog.images.values())
    looked: list[str] = []
    for ref in dict.fromkeys(refs):
        looked.append(ref)
        if ctx.image_state(ref).present:
            return ref, looked
    return None, looked


def check_gpu_request(ctx: Context) -> Finding:
    """`IMAGE --version` with a GPU device request: the book's own toolkit test; it loads no model."""
    if _docker_or_skip(ctx) is None:
        return skipped("no daemon to ask (see the daemon check)")
    ref, looked = _probe_image(ctx)
    if ref is None:
        return skipped(f"no engine image present locally (looked for {', '.join(looked)}); the test runs "
                       "`IMAGE --version` with --gpus all, which needs one", looked=looked)
    from metralectl.core.render import ContainerSpec

    done = ctx.must_finish()
    name = f"metralectl-doctor-gpu-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    data: dict[str, Any] = {"image": ref, "container": name}
    try:
        runtime = ctx.runtime_factory()  # its own client: this check waits on a container while others query
    except Exception as exc:  # noqa: BLE001
        done.set()
        return warn(f"could not connect a second client to test GPU access: {exc}", **data)
    spec = ContainerSpec(name=name, image=ref, command=("--version",), labels={LABEL_DOCTOR: "gpu-probe"},
                         gpus="all", network_mode="none", ipc_mode="private")
    with runtime:
        try:
            finding = _run_probe(runtime, spec, ref, data)
        finally:
            failed = _remove(runtime, name)
            done.set()
    if failed:
        return replace(finding, detail=f"{finding.detail} (and the probe container {name} could not be removed: "
                       f"{failed}; `docker rm -f {name}`)")
    return finding


def _remove(runtime: ContainerRuntime, name: str) -> str | None:
    """Remove the probe container (gone already is fine); the error text if that failed."""
    try:
        runtime.remove(name, force=True)
    except Exception as exc:  # noqa: BLE001 - reported in the finding, with the command to do it by hand
        return str(exc)
    return None


def _run_probe(runtime: Any, spec: Any, ref: str, data: dict[str, Any]) -> Finding:
    from metralectl.seams.docker.errors import GPU_CAUSES, RuntimeFailure
    try:
        started = runtime.create_and_start(spec)
    except RuntimeFailure as exc:
        text = exc.message
        if exc.cause in GPU_CAUSES:
            return problem(f"a container asking for GPUs (`{ref} --version`, --gpus all) was refused: {text}",
                           exc.hint or TOOLKIT_REMEDY, **data)
        return warn(f"could not start a test container from {ref}: {text}", exc.hint, **data)
    code = runtime.wait_exit(started.id, GPU_PROBE_WAIT_S)
    output = [line for line in runtime.log_tail(started.id, 20) if line.strip()]
    data.update(exit_code=code, output=output[-5:])
    said = output[-1] if output else "(no output)"
    if any("no compatible gpu" in line.lower() for line in output):
        return problem(f"`{ref} --version` with --gpus all says: {said}: the NVIDIA container toolkit is not "
                       "exposing the device", TOOLKIT_REMEDY, **data)
    if code is None:
        return warn(f"`{ref} --version` with --gpus all still ran after {GPU_PROBE_WAIT_S:g} s (removed)", **data)
    if code != 0:
        return warn(f"a GPU container started, but `{ref} --version` exited {code}: {said}", **data)
    return ok(f"a container got the GPUs: `{ref} --version` → {said}", **data)
