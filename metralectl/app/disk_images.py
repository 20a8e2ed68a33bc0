"""What `rm --image` and `prune` remove from the Docker daemon: only images of metralectl's catalog.

An image counts as the catalog's when its repository is one a catalog image names (the shipped
images/*.yaml and your own): `metrale/metrale-inference-gb10:<any tag>` is, `ubuntu:24.04` never is.
An image a container runs (any owner's: the daemon is shared) is refused, and nothing is forced: the
daemon's own refusal (another container, created or stopped, still uses it) is reported as it is. The daemon
is reached only through the Docker seam (seams/docker/images.py: image_record, image_tags, images_in_use,
remove_image).
"""

from __future__ import annotations

from typing import Any

from metralectl.app.disk_weights import Removal
from metralectl.errors import MetralError


def repository(ref: str) -> str:
    """`metrale/x:tag` -> `metrale/x` (a registry port's colon kept)."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref[: len(ref) - len(last)] + last.split(":", 1)[0]


def with_tag(ref: str) -> str:
    return ref if ":" in ref.rsplit("/", 1)[-1] or "@" in ref else f"{ref}:latest"


def in_use(runtime: Any) -> dict[str, str]:
    """Image ref and id -> the running container using it (any owner's, metralectl's or not)."""
    return {key if key.startswith("sha256:") else with_tag(key): name
            for key, name in runtime.images_in_use().items()}


def plan_image(runtime: Any, ref: str, repositories: set[str], recipes: tuple[str, ...],
               used: dict[str, str]) -> Removal | None:
    """The image `ref` on the daemon (None when it is not there), refused when it is not the catalog's or runs."""
    ref = with_tag(ref)
    record = runtime.image_record(ref)
    if record is None:
        return None
    # untagging frees nothing while another tag still names the image
    freed = record.size if len(record.tags) <= 1 else 0
    item = Removal("image", ref, freed, recipes=recipes)
    if repository(ref) not in repositories:
        item.blocked = "not an image of metralectl's catalog: remove it with `docker rmi` yourself"
    elif ref in used or record.id in used:
        item.blocked = f"container {used.get(ref) or used.get(record.id)} is running it"
    return item


def plan_image_prune(runtime: Any, repositories: set[str], wanted: set[str], used: dict[str, str]) -> list[Removal]:
    """Catalog images on the daemon no recipe runs (another tag of a catalog repository: an older pull or build),
    and no container runs."""
    out = []
    for tag in runtime.image_tags():
        if repository(tag) not in repositories or tag in wanted:
            continue
        item = plan_image(runtime, tag, repositories, (), used)
        if item is not None and item.blocked is None:
            out.append(item)
    return out


def remove_image(runtime: Any, item: Removal) -> None:
    try:
        runtime.remove_image(item.name)  # never forced: the daemon refuses an image a container still uses
        item.done = True
    except MetralError as exc:
        item.error = exc.message
