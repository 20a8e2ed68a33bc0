"""`metralectl export kube|compose RECIPE`: the recipe's manifests, rendered by the one renderer `run` uses
(lifecycle/kube_export.py; docs/kubernetes.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from metralectl.cli.state import note, style

app = typer.Typer(help="Write a recipe as Kubernetes manifests or a Compose file (the same container `run` starts).",
                  no_args_is_help=True, rich_markup_mode=None)


def _recipe(recipe_name: str, sets: list[str]):  # type: ignore[no-untyped-def]
    from metralectl.cli.catalog_cmds import _catalog
    from metralectl.core.overrides import apply_sets
    from metralectl.safetext import clean

    catalog = _catalog()
    recipe = apply_sets(catalog, catalog.recipe(recipe_name), sets)
    for key, old, new in recipe.deviations:
        note(style(f"deviation from the validated recipe: {clean(str(key))}: {clean(str(old))} -> {clean(str(new))}",
                   "33", sys.stderr))
    return catalog, recipe


def _write(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    from metralectl.atomicfile import write_atomic

    write_atomic(output, text)
    note(f"wrote {output}")


@app.command("kube")
def kube(
    recipe_name: str = typer.Argument(..., metavar="RECIPE", help="Recipe name (see `metralectl list`)."),
    set_: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a setting (checked, shown as a deviation)."),
    namespace: str = typer.Option(None, "--namespace", "-n", help="metadata.namespace of every object (default: none: kubectl's)."),
    roce_interface: str = typer.Option(None, "--roce-interface", help="Multi-rank (required): NCCL_SOCKET_IFNAME on every rank, the ConnectX port with an IPv4 address on every node."),
    rdma_device: str = typer.Option(None, "--rdma-device", metavar="DEV", help="Multi-rank: NCCL_IB_HCA on every rank (default: unset; NCCL picks)."),
    no_rdma: bool = typer.Option(False, "--no-rdma", help="Multi-rank: no /dev/infiniband, no IPC_LOCK; NCCL over TCP sockets."),
    gpus: int = typer.Option(None, "--gpus", min=1, help="nvidia.com/gpu per pod (default: the recipe's count; 1 for `all`)."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the YAML here instead of stdout."),
) -> None:
    """Kubernetes manifests: a Deployment + Service (one rank), or a LeaderWorkerSet + a Service to its head (multi-rank).

    Each rank's argv is the one `run --print --rank N` renders, with the head's address read from LeaderWorkerSet's
    LWS_LEADER_ADDRESS. The Service reaches the head only where the recipe binds a reachable address (`--set resources.bind`).
    """
    from metralectl.lifecycle.kube_export import LOOPBACK, KubeOptions, dump, kube_manifests

    catalog, recipe = _recipe(recipe_name, list(set_ or []))
    if recipe.resources.bind in LOOPBACK:
        note(style(f"the engine binds {recipe.resources.bind} (the recipe's): the probes reach it on the node's loopback "
                   "(host network), the Service does not; to serve the Service, bind the node's address: --set "
                   "resources.bind=0.0.0.0 with auth (serve require-auth) or resources.expose-acknowledged=true",
                   "33", sys.stderr))
    options = KubeOptions(namespace=namespace, roce_interface=roce_interface, rdma_device=rdma_device,
                          rdma=not no_rdma, gpus=gpus)
    _write(dump(kube_manifests(catalog, recipe, options)), output)


@app.command("compose")
def compose(
    recipe_name: str = typer.Argument(..., metavar="RECIPE", help="Recipe name (see `metralectl list`); one rank."),
    set_: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE", help="Override a setting (checked, shown as a deviation)."),
    gpus: int = typer.Option(None, "--gpus", min=1, help="GPUs reserved (default: the recipe's: all, or its count)."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the YAML here instead of stdout."),
) -> None:
    """A Compose file for one box: the container `run` starts (`docker-compose -f FILE up -d`)."""
    from metralectl.lifecycle.kube_export import compose_file, dump

    catalog, recipe = _recipe(recipe_name, list(set_ or []))
    _write(dump([compose_file(catalog, recipe, gpus=gpus)]), output)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="export")
