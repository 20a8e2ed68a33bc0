"""Images on a Docker daemon: their state (present, id, revision, platform, digests), pulls, and disk accounting
(`rm --image`, `prune`); and a catalog's engine image on it (`images`' rows, `pull`, the launch's check), by the
pure rules of core/images.py. Progress is handed to `on_event` per layer; nothing here prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from metralectl.core.image_info import ImageInfo, build_command
from metralectl.core.images import (ImageError, ImageStatus, LayerProgress, LocalImage, check_platform,
                                    machine_platform, normalize_platform, recipes_by_image)
from metralectl.seams.docker.client import Resource
from metralectl.seams.docker.errors import Refused, RuntimeCause, RuntimeFailure, refused_failure


@dataclass(frozen=True)
class ImageRecord:
    """One local image, for disk accounting: its id, every tag naming it, its size in bytes."""

    id: str
    tags: tuple[str, ...]
    size: int


# OCI's two labels for what an image holds: the source revision it was built from, else the version of what it
# packages (the llama.cpp images carry llama.cpp's build number there). An image entry names the one it uses.
IMAGE_REVISION_LABELS = ("org.opencontainers.image.revision", "org.opencontainers.image.version")


def image_revision(labels: dict[str, str], revision_label: str | None = None) -> str | None:
    """The image's revision: the named label's value, else (no name) the first IMAGE_REVISION_LABELS it carries."""
    if revision_label is not None:
        return labels.get(revision_label)
    return next((labels[name] for name in IMAGE_REVISION_LABELS if labels.get(name)), None)


@dataclass(frozen=True)
class ImageState:
    ref: str
    present: bool
    image_id: str | None = None
    revision: str | None = None
    platform: str | None = None  # os/arch, e.g. linux/arm64
    digests: tuple[str, ...] = ()


class ImagesMixin(Resource):
    """The runtime's image calls (runtime.DockerRuntime)."""

    # -- disk: local images (`rm --image`, `prune`) ------------------------------------------------------------
    def image_record(self, ref: str) -> ImageRecord | None:
        """The local image `ref` names, or None when the daemon has none."""
        try:
            data = self._call(self.api.inspect_image, ref)
        except RuntimeFailure as exc:
            if exc.cause is RuntimeCause.IMAGE_MISSING:
                return None
            raise
        return ImageRecord(str(data.get("Id")), tuple(str(t) for t in data.get("RepoTags") or ()),
                           int(data.get("Size") or 0))

    def image_tags(self) -> list[str]:
        """Every tag of every local image (`<none>` ones left out)."""
        tags = [str(t) for image in self._call(self.api.images) for t in image.get("RepoTags") or ()]
        return [t for t in tags if t != "<none>:<none>"]

    def images_in_use(self) -> dict[str, str]:
        """Image ref (as the container names it) and image id -> a running container using it, any owner's."""
        used: dict[str, str] = {}
        for container in self._call(self.api.containers, all=False):
            name = str((container.get("Names") or ["?"])[0]).lstrip("/")
            for key in (container.get("Image"), container.get("ImageID")):
                if key:
                    used[str(key)] = name
        return used

    def remove_image(self, ref: str) -> None:
        """Untag / remove `ref`, never forced: the daemon's refusal (a container still uses it) is raised in its
        own words as a RuntimeFailure."""
        self._call(self.api.remove_image, ref)

    # -- what runs -----------------------------------------------------------------------------------------------
    def image_state(self, ref: str, revision_label: str | None = None) -> ImageState:
        """The image as the daemon has it. Its revision: `revision_label` (the catalog's image entry names it),
        else the first of IMAGE_REVISION_LABELS it carries (`ps` and a benchmark's target know no entry)."""
        try:
            data = self.api.inspect_image(ref)
        except Refused as exc:
            if exc.image_missing:
                return ImageState(ref, False)
            raise refused_failure(exc) from None
        labels = (data.get("Config") or {}).get("Labels") or {}
        arch = data.get("Architecture") or ""
        os_name = data.get("Os") or "linux"
        return ImageState(ref, True, data.get("Id"), image_revision(labels, revision_label),
                          f"{os_name}/{arch}" if arch else None,
                          tuple(data.get("RepoDigests") or ()))

    def pull_image(self, ref: str, on_progress: Any = None, platform: str | None = None) -> ImageState:
        """Pull ref; on_progress(layer_id, status, current_bytes, total_bytes) per daemon event."""
        repository, tag = _split_ref(ref)
        previous = self.api.timeout
        self.api.timeout = None  # a large layer may go quiet for a while; the daemon reports errors itself
        try:
            for event in self.api.pull(repository, tag, platform):
                if "error" in event:
                    raise RuntimeFailure(RuntimeCause.PULL_FAILED, f"pulling {ref} failed: {event['error']}",
                                         "check the image name, your network/registry login (`docker login`)")
                if on_progress is not None:
                    detail = event.get("progressDetail") or {}
                    on_progress(event.get("id"), event.get("status", ""), detail.get("current"), detail.get("total"))
        except Refused as exc:
            raise refused_failure(exc) from None
        finally:
            self.api.timeout = previous
        return self.image_state(ref)


def _split_ref(ref: str) -> tuple[str, str | None]:
    """repository and tag of an image reference (a digest stays in the repository part)."""
    if "@" in ref:
        return ref, None
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repository, tag = ref.rsplit(":", 1)
        return repository, tag
    return ref, "latest"


class ImageRuntime(Protocol):
    """What these need of a runtime (protocol.ContainerRuntime has it; tests pass smaller fakes)."""

    def image_state(self, ref: str, revision_label: str | None = ...) -> LocalImage: ...
    def pull_image(self, ref: str, on_progress: Any = None, platform: str | None = None) -> object: ...


# --- a catalog's image on this daemon: its status row, a pull for this machine, the launch's check -------------
def status(info: ImageInfo, runtime: ImageRuntime | None, cpu_arch: str,
           recipes: tuple[str, ...] = ()) -> ImageStatus:
    """One image as `images` shows it; runtime None means Docker is unreachable (local state unknown)."""
    state = runtime.image_state(info.ref, info.revision_label) if runtime is not None else None
    problem = check_platform(state, info, cpu_arch)
    present = None if state is None else bool(state.present)
    digests = tuple(getattr(state, "digests", ()) or ())
    return ImageStatus(info, present, getattr(state, "image_id", None), getattr(state, "revision", None),
                       digests[0] if digests else None, getattr(state, "platform", None), recipes,
                       problem.message if problem else None)


def statuses(catalog: Any, runtime: ImageRuntime | None, cpu_arch: str) -> list[ImageStatus]:
    users = recipes_by_image(catalog)
    return [status(info, runtime, cpu_arch, users.get(info.id, ()))
            for info in sorted(catalog.images.values(), key=lambda i: i.id)]


@dataclass(frozen=True)
class ImagePull:
    status: ImageStatus
    action: str  # "present" (nothing to do) | "pulled"


def pull(info: ImageInfo, runtime: ImageRuntime, cpu_arch: str,
         on_event: Callable[[LayerProgress], None] | None = None, *, update: bool = False) -> ImagePull:
    """Make `info` present locally for this machine's platform; refuse one that cannot run here."""
    state = runtime.image_state(info.ref, info.revision_label)
    problem = check_platform(state, info, cpu_arch)
    if normalize_platform(info.platform) != machine_platform(cpu_arch):
        assert problem is not None
        raise problem  # not for this machine at all: nothing to pull
    if state.present and problem is None and not update:
        return ImagePull(status(info, runtime, cpu_arch), "present")
    if info.build is not None:  # nothing to pull from; a local copy for the wrong platform must be rebuilt
        if state.present and problem is None:
            return ImagePull(status(info, runtime, cpu_arch), "present")
        raise problem or ImageError(f"image {info.ref} cannot be pulled: it is built from source"
                                    + ("; not certified by the engine" if info.certified is False else "")
                                    + " — and it is not here", f"build it {build_command(info)}")
    # absent, --update, or a local copy for another platform: `docker pull --platform` replaces the tag

    def relay(layer: str | None, text: str, current: int | None, total: int | None) -> None:
        if on_event is not None:
            on_event(LayerProgress(info.ref, layer, text, current, total))

    runtime.pull_image(info.ref, relay, platform=normalize_platform(info.platform))
    after = status(info, runtime, cpu_arch)
    if not after.present:
        raise ImageError(f"pulled {info.ref}, but the daemon does not show it afterwards",
                         f"check `docker image inspect {info.ref}`")
    if after.problem:
        raise ImageError(after.problem)
    return ImagePull(after, "pulled")


def image_preflight(info: ImageInfo, runtime: ImageRuntime, cpu_arch: str, recipe_name: str) -> None:
    """For `run` before launch: the image is here and can run on this machine."""
    state = runtime.image_state(info.ref, info.revision_label)
    problem = check_platform(state, info, cpu_arch)
    if problem is not None:
        raise problem
    if not state.present:
        if info.build is not None:
            raise ImageError(f"image {info.ref} is not here, and it cannot be pulled: it is built from source"
                             + ("; not certified by the engine" if info.certified is False else ""),
                             f"build it {build_command(info)}")
        raise ImageError(f"image {info.ref} is not here; run `metralectl pull {recipe_name}`",
                         f"`metralectl pull {recipe_name}` pulls it (and the weights)")
