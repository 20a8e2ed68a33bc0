"""The Hugging Face cache the engine will be given: where it is, whether we can write it, root-owned files
(the `sudo metralectl` trap), free disk for the weights, and whether a token is set."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

from metralectl.seams.hf import state as hfstate

from metralectl import paths
from metralectl.doctor.context import Context
from metralectl.doctor.model import Finding, ok, problem, skipped, warn
from metralectl.wording import count, noun

GB = 1e9
DISK_MARGIN_GB = 10.0  # below this much to spare after the weights, a warning
SCAN_MAX_ENTRIES = 500_000
EXAMPLES = 5
PROBE_PREFIX = ".metralectl-doctor-"


def _source(environ: Any) -> str:
    if environ.get("HF_HUB_CACHE"):
        return "HF_HUB_CACHE"
    if environ.get("HF_HOME"):
        return "HF_HOME/hub"
    return "default"


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def check_location(ctx: Context) -> Finding:
    hub = paths.hf_hub_cache()
    data: dict[str, Any] = {"hub": str(hub), "hf_home": str(paths.hf_home()), "source": _source(os.environ)}
    if not hub.exists():
        return ok(f"{paths.display(hub)} ({data['source']}); not created yet: the first download creates it",
                  **data, exists=False, models=0)
    if not hub.is_dir():
        return problem(f"{paths.display(hub)} ({data['source']}) exists but is not a directory",
                       "point HF_HUB_CACHE / HF_HOME at a directory", **data, exists=True)
    try:
        models = sorted(p.name[len("models--"):].replace("--", "/", 1) for p in hub.iterdir()
                        if p.name.startswith("models--") and p.is_dir())
    except OSError as exc:
        return problem(f"{paths.display(hub)}: cannot list it ({exc.strerror})",
                       f"check its permissions (ls -ld {hub})", **data, exists=True)
    held = f"{count(len(models), 'model')} cached" if models else \
        "empty (no model downloaded yet: an engine started on it downloads, or logs `loaded 0 tensors` with " \
        "--model-from-path)"
    return ok(f"{paths.display(hub)} ({data['source']}); {held}", **data, exists=True, models=models)


def check_writable(ctx: Context) -> Finding:
    hub = paths.hf_hub_cache()
    target = hub if hub.is_dir() else _existing_ancestor(hub)
    data = {"hub": str(hub), "tested": str(target)}
    probe = target / f"{PROBE_PREFIX}{os.getpid()}.tmp"
    try:
        with open(probe, "x") as handle:
            handle.write("doctor write test\n")
        probe.unlink()
    except OSError as exc:
        me = ctx.identity
        where = "" if target == hub else f" (it does not exist yet; its nearest existing parent {target} is not writable)"
        owner = f"{me.sudo_user}:{me.sudo_group or me.sudo_user}" if me.sudo_user else f"{me.user}:{me.group}"
        remedy = {
            errno.ENOTDIR: "point HF_HUB_CACHE / HF_HOME at a directory (a file stands where the cache should be)",
            errno.EROFS: "the filesystem is read-only: point HF_HOME at a writable disk",
        }.get(exc.errno or 0, f"sudo chown -R {owner} {target}   (or point HF_HOME at a directory you own)")
        return problem(f"cannot write in {paths.display(hub)}{where}: {exc.strerror}", remedy, **data,
                       error=exc.strerror)
    if target != hub:
        return ok(f"{paths.display(hub)} does not exist yet; {paths.display(target)} is writable, so it can be created",
                  **data)
    return ok(f"{paths.display(hub)} is writable", **data)


def _scan(roots: list[Path], owner_uid: int, budget_s: float) -> dict[str, Any]:
    """Entries (files, dirs, links; links not followed) not owned by owner_uid, root-owned ones apart."""
    deadline = time.monotonic() + budget_s
    root_owned: list[str] = []
    other_owned: list[str] = []
    counts = {"root": 0, "other": 0}
    scanned, complete = 0, True
    stack = [r for r in roots if r.is_dir()]
    for r in stack:
        _tally_path(r, owner_uid, counts, root_owned, other_owned)
    while stack:
        if scanned >= SCAN_MAX_ENTRIES or time.monotonic() > deadline:
            complete = False
            break
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(PROBE_PREFIX):
                continue  # the writable check's own test file, there for a moment
            scanned += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            _tally(entry.path, st.st_uid, owner_uid, counts, root_owned, other_owned)
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return {"scanned": scanned, "complete": complete, "root_owned": counts["root"], "other_owned": counts["other"],
            "root_examples": root_owned, "other_examples": other_owned}


def _tally_path(path: Path, owner_uid: int, counts: dict[str, int], root_owned: list[str], other: list[str]) -> None:
    try:
        uid = path.lstat().st_uid
    except OSError:
        return
    _tally(str(path), uid, owner_uid, counts, root_owned, other)


def _tally(path: str, uid: int, owner_uid: int, counts: dict[str, int], root_owned: list[str], other: list[str]) -> None:
    if uid == owner_uid:
        return
    if uid == 0:
        counts["root"] += 1
        if len(root_owned) < EXAMPLES:
            root_owned.append(path)
    else:
        counts["other"] += 1
        if len(other) < EXAMPLES:
            other.append(path)


def check_ownership(ctx: Context) -> Finding:
    me = ctx.identity
    if me.root and not me.sudo_user:
        return skipped("running as root (no SUDO_USER): every file is root's to use; ownership not judged")
    if me.sudo_user:
        # Under sudo the trap is the invoking user's own cache, now holding files root wrote there.
        owner_uid, owner = me.sudo_uid if me.sudo_uid is not None else -1, me.sudo_user
        group = me.sudo_group or owner
        if me.sudo_home is None:
            return skipped(f"running under sudo, but {owner}'s home directory is unknown")
        roots = [me.sudo_home / ".cache" / "huggingface"]
    else:
        owner_uid, owner, group = me.uid, me.user, me.group
        roots = [paths.hf_home()]
        hub = paths.hf_hub_cache()
        if not hub.is_relative_to(roots[0]):
            roots.append(hub)
    present = [r for r in roots if r.exists()]
    data: dict[str, Any] = {"roots": [str(r) for r in roots], "owner": owner}
    if not present:
        return ok(f"{', '.join(paths.display(r) for r in roots)} does not exist yet: nothing to own", **data)
    scan = _scan(present, owner_uid, ctx.scan_budget_s)
    data.update(scan)
    partial = "" if scan["complete"] else f" (scan stopped after {count(scan['scanned'], 'entry', 'entries')}; there may be more)"
    where = ", ".join(str(r) for r in present)
    fix = " && ".join(f"sudo chown -R {owner}:{group} {r}" for r in present)
    if scan["root_owned"]:
        shown = ", ".join(scan["root_examples"][:3])
        return problem(f"{scan['root_owned']} root-owned {noun(scan['root_owned'], 'entry', 'entries')} in {where} "
                       f"(e.g. {shown}){partial}: left by `sudo metralectl` or a container run as root; the next "
                       f"run as {owner} fails on them", fix, **data)
    if scan["other_owned"]:
        return warn(f"{count(scan['other_owned'], 'entry', 'entries')} in {where} {noun(scan['other_owned'], 'belongs', 'belong')} to "
                    f"another user (e.g. {scan['other_examples'][0]}){partial}", fix, **data)
    return ok(f"everything in {where} belongs to {owner} ({count(scan['scanned'], 'entry', 'entries')}){partial}", **data)


def _disk_candidates(ctx: Context) -> tuple[list[Any], str]:
    catalog = ctx.catalog()
    recipe = ctx.recipe()
    if recipe is not None:
        return [recipe], "--recipe"
    mine = [r for r in catalog.recipes.values() if r.origin.kind == "user"]
    if mine:
        return mine, "your recipes"
    flagship = [r for r in catalog.recipes.values() if "flagship" in r.tags] or \
        [r for r in catalog.recipes.values() if r.name == "qwen3.5-35b-a3b"]
    return flagship[:1], "the flagship"


def _need(ctx: Context, recipe: Any) -> tuple[float | None, str]:
    from metralectl.core.fit import weights_part

    state = hfstate.checkpoint_state(recipe.checkpoint)
    if state.status in ("complete", "present"):
        return 0.0, f"{recipe.checkpoint.repo} already cached"
    if state.status == "absent" and state.bytes_total:  # a GGUF quant the cached listing sizes exactly
        return state.bytes_total / GB, f"{recipe.checkpoint.repo}:{recipe.checkpoint.quant} needs " \
                                       f"{state.bytes_total / GB:.1f} GB"
    model = ctx.catalog().model_of(recipe)
    part = weights_part(model, recipe.checkpoint.repo, recipe.checkpoint.quant)
    if part.gb is None:
        return None, f"{recipe.checkpoint.repo}: size unknown"
    total, present = getattr(state, "bytes_total", None), getattr(state, "bytes_present", None)
    if state.status == "partial" and total and present is not None:
        left = max(0, total - present) / GB
        return left, f"{recipe.checkpoint.repo} needs {left:.1f} GB more (partly downloaded)"
    partial = " (partly downloaded; counted in full)" if state.status == "partial" else ""
    return part.gb, f"{recipe.checkpoint.repo} needs {part.gb:.1f} GB{partial}"


def check_disk(ctx: Context) -> Finding:
    hub = paths.hf_hub_cache()
    where = _existing_ancestor(hub)
    usage = ctx.disk_usage(where)
    free_gb = usage.free / GB
    candidates, chosen = _disk_candidates(ctx)
    needs = [(r, *_need(ctx, r)) for r in candidates]
    known = [(r, gb, why) for r, gb, why in needs if gb is not None]
    data: dict[str, Any] = {"path": str(where), "free_bytes": usage.free, "chosen_by": chosen}
    if not known:
        return ok(f"{free_gb:.0f} GB free at {paths.display(where)}; weight sizes unknown for {chosen}", **data)
    recipe, need, why = max(known, key=lambda item: item[1])
    data.update(recipe=recipe.name, need_bytes=int(need * GB))
    detail = f"{free_gb:.0f} GB free at {paths.display(where)}; {why} ({recipe.name}, {chosen})"
    if need > free_gb:
        return problem(detail + ": not enough", f"free {need - free_gb:.0f} GB or more on that disk, or point "
                       "HF_HOME / HF_HUB_CACHE at a larger disk", **data)
    if need > 0 and free_gb - need < DISK_MARGIN_GB:
        return warn(detail + f": less than {DISK_MARGIN_GB:g} GB would be left", "free some space first", **data)
    return ok(detail, **data)


def check_token(ctx: Context) -> Finding:
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if ctx.environ.get(name):
            return ok(f"{name} is set (gated checkpoints can download)", source=name)
    token_file = Path(ctx.environ.get("HF_TOKEN_PATH") or paths.hf_home() / "token")
    if token_file.is_file():
        return ok(f"a saved token at {paths.display(token_file)} (from `hf auth login`)", source=str(token_file))
    return ok("no HF_TOKEN: public checkpoints download without one; gated ones need `hf auth login` or HF_TOKEN",
              source=None)

