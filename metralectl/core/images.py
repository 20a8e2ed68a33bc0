"""Engine images: what is local, what each recipe uses, whether it can run on this machine; pulls.

Orchestration over the runtime seam (seams.container_runtime.ContainerRuntime, or any object with `image_state` and
`pull_image`): no docker import, no printing. Progress is handed to `on_event` per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from metralectl.errors import ExitCode, MetralError
from metralectl.core.image_info import PLATFORM_OF_ARCH, ImageInfo, build_command

_ARCH_ALIASES = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "amd64", "amd64": "amd64"}


class LocalImage(Protocol):
    """What the daemon says of a tag here (seams.docker_runtime.ImageState has it)."""

    @property
    def present(self) -> bool: ...
    @property
    def image_id(self) -> str | None: ...
    @property
    def revision(self) -> str | None: ...
    @property
    def platform(self) -> str | None: ...  # os/arch
    @property
    def digests(self) -> tuple[str, ...]: ...


class ImageRuntime(Protocol):
    def image_state(self, ref: str, revision_label: str | None = ...) -> LocalImage: ...
    def pull_image(self, ref: str, on_progress: Any = None, platform: str | None = None) -> object: ...


class ImageError(MetralError):
    """An image is missing, cannot be pulled, or is for another platform."""

    exit_code = ExitCode.FAILED


@dataclass(frozen=True)
class LayerProgress:
    ref: str
    layer: str | None  # None for image-wide status lines ("Pulling from ...", "Digest: ...")
    status: str  # "Downloading", "Extracting", "Pull complete", "Already exists", ...
    current: int | None
    total: int | None


@dataclass(frozen=True)
class ImageStatus:
    info: ImageInfo
    present: bool | None  # None: Docker not reachable
    image_id: str | None
    revision: str | None
    digest: str | None
    local_platform: str | None
    recipes: tuple[str, ...]
    problem: str | None  # why it cannot run here (platform), or None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.info.id, "ref": self.info.ref, "platform": self.info.platform,
                "hardware": list(self.info.hardware), "built_locally": self.info.build is not None,
                "build": self.info.build, "build_command": build_command(self.info) if self.info.build else None,
                "certified": self.info.certified, "availability": self.info.availability(),
                "tags": dict(self.info.tags), "tag_pattern": self.info.tag_pattern, "present": self.present, "image_id": self.image_id,
                "revision": self.revision, "digest": self.digest, "local_platform": self.local_platform,
                "recipes": list(self.recipes), "problem": self.problem}


def normalize_platform(platform: str | None) -> str | None:
    """linux/arm64/v8 -> linux/arm64; aarch64 -> arm64 (Docker and `uname -m` spell them apart)."""
    if not platform:
        return None
    parts = platform.lower().split("/")
    os_name, arch = (parts[0], parts[1]) if len(parts) > 1 else ("linux", parts[0])
    return f"{os_name}/{_ARCH_ALIASES.get(arch, arch)}"


def machine_platform(cpu_arch: str) -> str:
    return PLATFORM_OF_ARCH.get(cpu_arch) or f"linux/{_ARCH_ALIASES.get(cpu_arch, cpu_arch)}"


def check_platform(image_state: Any, image_info: ImageInfo, cpu_arch: str) -> ImageError | None:
    """Why this image cannot run on a `cpu_arch` machine, as an error to raise; None when it can.

    Two ways to be wrong: the catalog says the image is for another platform (a Hopper/B200 amd64
    image on a GB10, the GB10 arm64 image on an x86 box), or the local copy under that tag was
    pulled or built for another platform than the catalog says (it would fail with `exec format
    error` after the container starts).
    """
    here = machine_platform(cpu_arch)
    declared = normalize_platform(image_info.platform)
    hardware = ", ".join(image_info.hardware)
    if declared != here:
        return ImageError(
            f"image {image_info.ref} is built for {declared} ({hardware}); this machine is {here} ({cpu_arch})",
            f"use a recipe for this machine's hardware (`metralectl list` marks what fits), "
            f"or declare your own {here} image in your config's images/ directory")
    local = normalize_platform(getattr(image_state, "platform", None)) if getattr(image_state, "present", False) else None
    if local is not None and local != here:
        return ImageError(
            f"the local {image_info.ref} is a {local} image, but this machine is {here} "
            f"(the catalog says {declared}); it would fail with `exec format error`",
            f"replace it: `docker rmi {image_info.ref}` then `docker pull --platform {here} {image_info.ref}`"
            + (f" (or rebuild it: {build_command(image_info)})" if image_info.build else ""))
    return None


def recipes_by_image(catalog: Any) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for recipe in sorted(catalog.recipes.values(), key=lambda r: r.name):
        out.setdefault(recipe.image, []).append(recipe.name)
    return {k: tuple(v) for k, v in out.items()}


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
