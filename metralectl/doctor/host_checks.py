"""Checks of the host itself: who runs metralectl, PATH, the engine's port, CPU vs image platform, agent."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from metralectl.doctor.context import Context
from metralectl.doctor.model import Finding, ok, problem, skipped, warn

ROOT_REASONS = (
    "the model would run as root",
    ("the Hugging Face cache becomes root's, or files in your own cache become root-owned so the next "
     "unprivileged run fails oddly"),
    "sudo's PATH often lacks metralectl (~/.local/bin)",
)


def check_root(ctx: Context) -> Finding:
    me = ctx.identity
    reasons = "; ".join(ROOT_REASONS)
    data = {"uid": me.uid, "euid": me.euid, "user": me.user, "sudo_user": me.sudo_user}
    if me.sudo_user:
        return problem(f"running under sudo (SUDO_USER={me.sudo_user}): {reasons}",
                       f"run metralectl as {me.sudo_user}, without sudo; to reach Docker without sudo: "
                       "sudo usermod -aG docker $USER && newgrp docker", **data)
    if me.root:
        return problem(f"running as root: {reasons}",
                       "run metralectl as an ordinary user in the docker group "
                       "(sudo usermod -aG docker USER, then log in as USER)", **data)
    return ok(f"running as {me.user} (uid {me.uid}), not root", **data)


def _install_dir(ctx: Context) -> Path:
    override = ctx.environ.get("METRALECTL_INSTALL_DIR")
    return Path(override).expanduser() if override else ctx.identity.home / ".local" / "bin"


def _profile(ctx: Context) -> str:
    return "~/.zshrc" if ctx.environ.get("SHELL", "").endswith("zsh") else "~/.bashrc"


def check_path(ctx: Context) -> Finding:
    path_entries = [e for e in ctx.environ.get("PATH", "").split(os.pathsep) if e]
    install = _install_dir(ctx)
    default_dir = install == ctx.identity.home / ".local" / "bin"
    dir_text = "$HOME/.local/bin" if default_dir else str(install)
    export_line = f"echo 'export PATH=\"$PATH:{dir_text}\"' >> {_profile(ctx)} && source {_profile(ctx)}"
    for entry in path_entries:
        found = ctx.which("metralectl", path=entry)
        if not found:
            continue
        data = {"path": found, "path_entry": entry}
        if len(entry) > 1 and entry.endswith("/"):
            doubled = entry + "/metralectl"
            return ok(f"{found} (`which metralectl` prints {doubled} because the PATH entry {entry} "
                      "ends in '/'; the doubled slash is harmless)", **data, doubled_slash=True)
        return ok(found, **data)
    installed = install / "metralectl"
    if installed.exists():
        return warn(f"installed at {installed}, but {install} is not on PATH (the agent and new shells will not "
                    "find it)", export_line, path=str(installed), install_dir=str(install))
    return warn(f"metralectl is not on PATH (this run came from `python -m`, uvx or a checkout); the installer "
                f"puts it in {install}",
                # no release is published yet: the routes from a checkout (docs/install.md)
                f"in a checkout: uv tool install .  (or pipx install .)   (then, if told so: {export_line})",
                install_dir=str(install))


def _port_holder(ctx: Context, port: int) -> dict[str, object]:
    holder: dict[str, object] = dict(ctx.port_holder(port))
    pid = holder.get("pid")
    if isinstance(pid, int):
        try:
            container = ctx.our_containers().pid_to_container.get(pid)
        except Exception:  # noqa: BLE001 - no daemon: just no container name
            container = None
        if container:
            holder["container"] = container
    return holder


def check_port(ctx: Context) -> Finding:
    port, bind, source = ctx.port_and_bind()
    error = ctx.port_probe(bind, port)
    data: dict[str, object] = {"port": port, "bind": bind, "source": source}
    if error is None:
        return ok(f"{bind}:{port} is free ({source}; a test bind succeeded)", **data)
    if error.errno == errno.EACCES:
        return problem(f"{bind}:{port}: permission denied ({error.strerror}); ports below 1024 need privileges",
                       "pick a port ≥ 1024 (--port, or the recipe's resources.port)", **data)
    if error.errno != errno.EADDRINUSE:
        return warn(f"could not test {bind}:{port}: {error.strerror or error}", **data)
    holder = _port_holder(ctx, port)
    data.update(holder)
    who = ""
    if holder:
        who = f" by {holder.get('process', 'a process')} (PID {holder['pid']})"
        if holder.get("container"):
            who += f", metralectl's container {holder['container']}"
    remedy = (f"stop what holds it (`ss -ltnp 'sport = :{port}'` shows it), or serve on another port "
              "(the recipe's resources.port)")
    if holder.get("container"):
        remedy = "an engine metralectl started is serving there: `metralectl stop` it first, or `metralectl swap`"
    return problem(f"port {port} is already taken{who}: the engine could not listen on {bind}:{port}", remedy,
                   **data)


def check_rdma(ctx: Context) -> Finding:
    """The RDMA devices an EP=2 rank gets on this class (multi-node.container.rdma-devices): present or not."""
    from metralectl.seams.docker.errors import RDMA_HINT
    hw_id, how = ctx.target_hardware()
    if hw_id is None:
        return skipped(f"{how}, so no multi-node profile to check against")
    hw = ctx.catalog().hardware.get(hw_id)
    profile = hw.rank_profile if hw is not None else None
    data: dict[str, object] = {"hardware": hw_id}
    if profile is None or not profile.rdma.devices:
        return skipped(f"hardware class {hw_id} has no multi-node (EP=2) launches", **data)
    devices = list(profile.rdma.devices)
    data["devices"] = devices
    recipe = ctx.recipe()
    if recipe is not None and not recipe.multi_rank:
        return skipped(f"{recipe.name} is a single-node recipe; only EP=2 ranks get {', '.join(devices)}", **data)
    missing = [d for d in devices if not ctx.path_exists(d)]
    data["missing"] = missing
    if not missing:
        return ok(f"{', '.join(devices)} present (EP=2 ranks get it for NCCL over RoCE)", **data)
    if recipe is not None:
        return problem(f"no {', '.join(missing)}: {recipe.name} is an EP=2 recipe and each rank gets it",
                       RDMA_HINT, **data)
    return warn(f"no {', '.join(missing)}: single-node launches do not need it, but an EP=2 launch on this node "
                "would be refused", RDMA_HINT, **data)


def check_cpu_arch(ctx: Context) -> Finding:
    from metralectl.core.image_info import PLATFORM_OF_ARCH, ImageInfo

    cpu = ctx.cpu_arch()
    hw_id, how = ctx.target_hardware()
    data: dict[str, object] = {"cpu_arch": cpu, "hardware": hw_id}
    if hw_id is None:
        return skipped(f"CPU {cpu}; {how}, so no image platform to compare with", **data)
    catalog = ctx.catalog()
    hw = catalog.hardware.get(hw_id)
    recipe = ctx.recipe()
    image: ImageInfo | None
    if recipe is not None and recipe.image in catalog.images:
        image = catalog.image_for(recipe)  # the recipe's own image (another engine's, a tag), not the class default
    else:
        image = catalog.images.get(hw.image) if hw is not None and hw.image else None
    if image is None:
        return skipped(f"CPU {cpu}; hardware class {hw_id} names no image", **data)
    want = PLATFORM_OF_ARCH.get(cpu, f"linux/{cpu}")
    data.update(image=image.ref, image_platform=image.platform, host_platform=want)
    if image.platform != want:
        return problem(f"the {hw_id} image {image.ref} is {image.platform}, but this CPU is {cpu} ({want}); "
                       f"{how}", "use a recipe for this machine's hardware class (`metralectl list`)", **data)
    local = _local_platform(ctx, image.ref)
    if local is not None:
        data["local_image_platform"] = local
        if local != want:
            return problem(f"the local copy of {image.ref} is {local}, this CPU is {cpu} ({want})",
                           f"docker pull --platform {want} {image.ref}", **data)
    return ok(f"CPU {cpu} matches {image.ref} ({image.platform}; {how})", **data)


def _local_platform(ctx: Context, ref: str) -> str | None:
    try:
        state = ctx.image_state(ref)
    except Exception:  # noqa: BLE001 - no daemon: the catalog comparison above still stands
        return None
    return state.platform if state.present else None


def check_agent(ctx: Context) -> Finding:
    """Whether the background agent runs, and its own answer to "can this machine run models". The remedy is
    the one that works on this machine: systemd's when its user unit is installed and answers (the
    installer's), else `metralectl agent start` (a checkout, a container, no user systemd)."""
    view = ctx.agent_view()
    if view is None:
        systemd = ctx.agent_unit()
        remedy = ("systemctl --user start metralectl-agent" if systemd else "metralectl agent start")
        return warn("the background agent is not running (the control-plane page and peers need it)",
                    f"{remedy}   (or run `metralectl agent` in a terminal)", systemd_unit=systemd)
    where = f"pid {view.get('pid')}, 127.0.0.1:{view.get('port')}"
    if "error" in view:
        restart = ("systemctl --user restart metralectl-agent" if view.get("how") == "systemd"
                   else "metralectl agent stop && metralectl agent start")
        return warn(f"the agent ({where}) does not answer: {view['error']}",
                    f"its log: `metralectl agent logs`; restart it: {restart}", pid=view.get("pid"))
    status = view.get("status") or {}
    summary = str(status.get("summary") or "checking")
    if status.get("can_run") is False:
        remedies = [str(p.get("remedy")) for p in status.get("problems") or [] if isinstance(p, dict) and p.get("remedy")]
        return problem(f"the agent ({where}) says this machine cannot run models: {summary}",
                       "; ".join(remedies) or None, pid=view.get("pid"))
    return ok(f"the agent ({where}) says: {summary}", pid=view.get("pid"), can_run=status.get("can_run"))


_CONTAINER_ID = re.compile(r"(?:docker[-/]|containers/)([0-9a-f]{64})")


def container_id_of_pid(proc_root: Path, pid: int) -> str | None:
    """The Docker container a host PID runs in, from /proc/PID/cgroup (None: not in one, or not ours to see)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _CONTAINER_ID.search(text)
    return match.group(1) if match else None


def process_name(proc_root: Path, pid: int) -> str | None:
    try:
        return (proc_root / str(pid) / "comm").read_text().strip() or None
    except OSError:
        return None
