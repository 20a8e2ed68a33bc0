"""Engine images, pure: whether one can run on this machine (its declared platform, and the platform of the copy
the daemon holds), what each recipe uses, the status row `images` shows, a pull's progress event.

Asking a daemon and pulling are the Docker seam's (seams/docker/images.py: status, statuses, pull,
image_preflight), over these rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from metralectl.errors import ExitCode, MetralError
from metralectl.core.image_info import PLATFORM_OF_ARCH, ImageInfo, build_command

_ARCH_ALIASES = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "amd64", "amd64": "amd64"}


class LocalImage(Protocol):
    """What the daemon says of a tag here (seams.docker.images.ImageState has it)."""

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
