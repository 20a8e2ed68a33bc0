"""What `rm --image` and `prune` remove from the Docker daemon: only images of metralectl's catalog.

An image counts as the catalog's when its repository is one a catalog image names (the shipped
images/*.yaml and your own): `metrale/metrale-inference-gb10:<any tag>` is, `ubuntu:24.04` never is.
An image a container runs (any owner's: the daemon is shared) is refused, and nothing is forced: the
daemon's own refusal (another container, created or stopped, still uses it) is reported as it is.
"""

from __future__ import annotations

from typing import Any

from metralectl.app.disk_weights import Removal


def repository(ref: str) -> str:
    """`metrale/x:tag` -> `metrale/x` (a registry port's colon kept)."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref[: len(ref) - len(last)] + last.split(":", 1)[0]


def with_tag(ref: str) -> str:
    return ref if ":" in ref.rsplit("/", 1)[-1] or "@" in ref else f"{ref}:latest"


def in_use(runtime: Any) -> dict[str, str]:
    """Image ref and id -> the running container using it (any owner's, metralectl's or not)."""
    used: dict[str, str] = {}
    for container in runtime.api.containers(all=False):
        name = str((container.get("Names") or ["?"])[0]).lstrip("/")
        for key in (container.get("Image"), container.get("ImageID")):
            if key:
                used[with_tag(str(key)) if not str(key).startswith("sha256:") else str(key)] = name
    return used


def _inspect(runtime: Any, ref: str) -> dict[str, Any] | None:
    import docker.errors

    try:
        return dict(runtime.api.inspect_image(ref))
    except docker.errors.ImageNotFound:
        return None


def plan_image(runtime: Any, ref: str, repositories: set[str], recipes: tuple[str, ...],
               used: dict[str, str]) -> Removal | None:
    """The image `ref` on the daemon (None when it is not there), refused when it is not the catalog's or runs."""
    ref = with_tag(ref)
    data = _inspect(runtime, ref)
    if data is None:
        return None
    tags = [str(t) for t in data.get("RepoTags") or ()]
    # untagging frees nothing while another tag still names the image
    freed = int(data.get("Size") or 0) if len(tags) <= 1 else 0
    item = Removal("image", ref, freed, recipes=recipes)
    if repository(ref) not in repositories:
        item.blocked = "not an image of metralectl's catalog: remove it with `docker rmi` yourself"
    elif ref in used or str(data.get("Id")) in used:
        item.blocked = f"container {used.get(ref) or used.get(str(data.get('Id')))} is running it"
    return item


def plan_image_prune(runtime: Any, repositories: set[str], wanted: set[str], used: dict[str, str]) -> list[Removal]:
    """Catalog images on the daemon no recipe runs (another tag of a catalog repository: an older pull or build),
    and no container runs."""
    out = []
    for image in runtime.api.images():
        for tag in image.get("RepoTags") or ():
            tag = str(tag)
            if tag == "<none>:<none>" or repository(tag) not in repositories or tag in wanted:
                continue
            item = plan_image(runtime, tag, repositories, (), used)
            if item is not None and item.blocked is None:
                out.append(item)
    return out


def remove_image(runtime: Any, item: Removal) -> None:
    import docker.errors

    try:
        runtime.api.remove_image(item.name)  # never forced: the daemon refuses an image a container still uses
        item.done = True
    except docker.errors.APIError as exc:
        item.error = str(getattr(exc, "explanation", None) or exc)
    except docker.errors.DockerException as exc:
        item.error = str(exc)
