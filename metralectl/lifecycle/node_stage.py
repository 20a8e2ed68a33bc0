"""What each node must hold before an EP=2 launch starts anything: the engine's image, one revision on
every node (pulled there when missing), and the checkpoint, verified in every node's HF cache at the
commit the head will serve (a remote node's cache as its probe container read it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from metralectl import paths
from metralectl.core.catalog import Catalog
from metralectl.core.recipe import Recipe
from metralectl.errors import MetralError
from metralectl.lifecycle.events import Listener, Step, Warning_
from metralectl.lifecycle.launch import LaunchOptions, stage, transfer_events
from metralectl.seams import machine, netprobe
from metralectl.seams.docker import images as docker_images
from metralectl.seams.hf import state as hfstate

if TYPE_CHECKING:
    from metralectl.lifecycle.multinode import Node


def _image_on(node: Node, recipe: Recipe, catalog: Catalog, options: LaunchOptions, on_event: Listener) -> None:
    info = catalog.image_for(recipe)
    try:
        state = node.runtime.image_state(info.ref, info.revision_label)
        if not state.present and options.pull:
            on_event(Step("image", f"{info.ref} is not on {node.label}: pulling it there"))
            docker_images.pull(info, node.runtime, node.arch, transfer_events("image", on_event))
        docker_images.image_preflight(info, node.runtime, node.arch, recipe.name)
    except MetralError as exc:
        raise MetralError(f"{node.label}: {exc.message}",
                          f"on that node: `docker pull {info.ref}` (or `metralectl pull {recipe.name}` there)"
                          + (f"; {exc.hint}" if exc.hint else "")) from None


def stage_nodes(recipe: Recipe, catalog: Catalog, nodes: Sequence[Node], options: LaunchOptions,
                on_event: Listener) -> str | None:
    """The image on every node, one revision everywhere; the weights on a local head. Returns the
    checkpoint commit the head will serve (None when it cannot be known here)."""
    info = catalog.image_for(recipe)
    commit: str | None = recipe.checkpoint.revision
    for node in nodes:
        if node.rank == 0 and node.endpoint.is_local and node.arch == machine.cpu_arch():
            stage(recipe, catalog, node.runtime, options, on_event)  # image and weights, as a single-node run
            cache = hfstate.checkpoint_state(recipe.checkpoint)
            commit = commit or cache.commit
        else:
            on_event(Step("image", f"{info.ref} on {node.label}"))
            _image_on(node, recipe, catalog, options, on_event)
    states = [n.runtime.image_state(info.ref, info.revision_label) for n in nodes]
    revisions = {s.revision for s in states}
    if len(revisions) > 1:
        shown = "; ".join(f"{n.label}: {s.revision or 'no revision label'}" for n, s in zip(nodes, states))
        raise MetralError(f"the nodes hold different builds of {info.ref} ({shown}); both ranks must run the same engine",
                          f"pull the same image on both nodes (`docker pull {info.ref}` on each), then run again")
    if len({s.image_id for s in states}) > 1:
        on_event(Warning_(f"{info.ref} has the same revision ({states[0].revision}) but different image IDs on the nodes "
                          "(built or pulled separately)"))
    return commit


def check_weights(recipe: Recipe, nodes: Sequence[Node], head_commit: str | None, options: LaunchOptions,
                  on_event: Listener) -> None:
    """The checkpoint verified (by `metralectl pull`) in each remote node's HF cache, at the head's commit."""
    if not options.check_weights:
        return
    repo = recipe.checkpoint.repo
    hub = paths.display(paths.hf_hub_cache())
    for node in nodes:
        if node.rank == 0 and node.endpoint.is_local:
            continue  # staged from this machine's own cache
        view = node.probe.hub if node.probe is not None else None
        if view is None:
            on_event(Warning_(f"{node.label}: the weights could not be checked (the probe did not run)"))
            continue
        wanted = head_commit or (nodes[0].probe.hub.ref_main if nodes[0].probe and nodes[0].probe.hub else None)
        found = netprobe.hub_summary(view)
        ok = (wanted in view.verified) if wanted else bool(view.verified)
        on_event(Step("weights", f"{repo} on {node.label}: {found}"))
        if not ok:
            at = f" at {wanted[:12]}" if wanted else ""
            raise MetralError(f"weights on {node.label}: {repo}{at} is not verified in {hub} there ({found})",
                              f"on that node, run `metralectl pull {recipe.name}` (the HF cache must be at the same "
                              f"path, {hub}, on both nodes); --no-weights-check lets the engine fetch them itself")
