"""Engine images as the catalog describes them (images/*.yaml): the ref, platform, tags a recipe may pick, and
how to get one (pulled, or built from source). Pure, but for the one look on disk for a build file
metralectl ships (shipped_build_file). What is local and pulling are core.images'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from metralectl.core.schema import Checker
from metralectl.core.yamlsrc import Document

_IMAGE_KEYS = ("schema", "id", "ref", "engine", "hardware", "platform", "min-cuda", "min-driver", "revision-label",
               "tags", "tag-pattern", "build", "certified", "notes")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # Docker's rule for a tag
PLATFORM_OF_ARCH = {"aarch64": "linux/arm64", "x86_64": "linux/amd64"}  # a hardware class's cpu-arch -> platform


@dataclass(frozen=True)
class ImageInfo:
    id: str
    ref: str
    engine: str
    hardware: tuple[str, ...]
    platform: str
    min_cuda: str | None
    min_driver: str | None
    revision_label: str
    build: str | None = None  # a Dockerfile (the engine repository's, or ours in images/) or our build script: built,
    # never pulled
    source: str = ""
    tags: dict[str, str] = field(default_factory=dict)  # tags a recipe may pick (`image-tag:`) -> what each is
    tag_pattern: str | None = None  # other tags a recipe may pick (commit / version tags), as a regex
    certified: bool | None = None  # the engine's own recipes run this image (None: not stated, e.g. your own)
    notes: str = ""

    @property
    def tag(self) -> str:
        last = self.ref.rsplit("/", 1)[-1]
        return last.rsplit(":", 1)[1] if ":" in last and "@" not in self.ref else "latest"

    @property
    def pullable(self) -> bool:
        return self.build is None

    def with_tag(self, tag: str | None) -> ImageInfo:
        """This image under another tag (a recipe's `image-tag:`); itself when tag is None or already its own."""
        if not tag or tag == self.tag or "@" in self.ref:
            return self
        last = self.ref.rsplit("/", 1)[-1]
        repository = self.ref.rsplit(":", 1)[0] if ":" in last else self.ref
        return replace(self, ref=f"{repository}:{tag}")

    def tag_problem(self, tag: str) -> str | None:
        """Why `tag` cannot be picked for this image (None: it can)."""
        if not TAG_RE.fullmatch(tag):
            return f"{tag!r} is not a Docker tag (letters, digits, '_', '.', '-'; at most 128)"
        if tag in self.tags or tag == self.tag:
            return None
        if self.tag_pattern and re.fullmatch(self.tag_pattern, tag):
            return None
        listed = ", ".join(self.tags) or self.tag
        other = " (or a commit / version tag)" if self.tag_pattern else ""
        return f"image {self.id} has no tag {tag!r}; its tags are {listed}{other}"

    def availability(self) -> str:
        """How to get it, in a line: pulled, or built from source (and whether the engine certifies it)."""
        if self.build is not None:
            return ("build from source; not certified by the engine" if self.certified is False
                    else "build from source") + f" ({build_command(self)})"
        return "pulled from its registry" + ("; the engine's own image" if self.certified else "")


def build_command(info: ImageInfo) -> str:
    """The command that builds a from-source image under its ref. Its `build:` names metralectl's own build file,
    shipped beside the description in images/ and run from wherever it is installed: a script (`.sh`, which tags
    the image itself) or a Dockerfile (built with that directory as the context); else a Dockerfile in the engine
    repository (built from a checkout of it)."""
    build = info.build or ""
    if build and " " not in build.strip():
        ours = shipped_build_file(info)
        if ours is not None and ours.suffix == ".sh":
            return f"bash {ours}"
        if ours is not None:
            return f"docker build -f {ours} -t {info.ref} {ours.parent}"
        return f"in a checkout of the engine repository: docker build -f {build} -t {info.ref} ."
    return f"{build} (tag it {info.ref})"


def shipped_build_file(info: ImageInfo) -> Path | None:
    """The file `build:` names when it is metralectl's own: a path relative to the data directory that holds the
    image's description (images/x.yaml -> images/x.Dockerfile, images/build-x.sh), present there. None for an
    engine's."""
    if not info.build or not info.source:
        return None
    from metralectl import paths  # a path lookup, not an import cost: the catalog already imported it

    described = Path(info.source)
    if not described.is_absolute():  # a shipped description is named relative to the data root
        described = paths.data_root() / described
    candidate = described.parent.parent / info.build
    return candidate if candidate.is_file() else None


def parse_image(doc: Document) -> tuple[ImageInfo | None, Checker]:
    check = Checker(doc)
    top = check.mapping(doc.data, (), "an image description")
    check.known_keys(top, (), _IMAGE_KEYS, "an image description")
    image_id = check.string(top, (), "id")
    ref = check.string(top, (), "ref")
    platform = check.string(top, (), "platform")
    if platform and platform not in PLATFORM_OF_ARCH.values():
        check.error(("platform",), f"unknown platform {platform!r}", f"use one of {', '.join(PLATFORM_OF_ARCH.values())}")
    hardware = check.string_list(top, (), "hardware", required=True)
    tags = _image_tags(check, top.get("tags"))
    pattern = _opt_str(top.get("tag-pattern"))
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            check.error(("tag-pattern",), f"not a valid regular expression: {exc}")
    certified = top.get("certified")
    if certified is not None and not isinstance(certified, bool):
        check.error(("certified",), f"certified is true or false, not {certified!r}")
    if not check.ok or image_id is None or ref is None or platform is None:
        return None, check
    return ImageInfo(
        id=image_id, ref=ref, engine=str(top["engine"]) if "engine" in top else _unnamed(), hardware=tuple(hardware), platform=platform,
        min_cuda=_opt_str(top.get("min-cuda")), min_driver=_opt_str(top.get("min-driver")),
        revision_label=str(top.get("revision-label", "org.opencontainers.image.revision")),
        build=_opt_str(top.get("build")), source=doc.path, tags=tags, tag_pattern=pattern,
        certified=certified if isinstance(certified, bool) else None, notes=str(top.get("notes") or ""),
    ), check


def _image_tags(check: Checker, raw: Any) -> dict[str, str]:
    """`tags:` as a list of names, or a mapping of name -> what the tag is."""
    if raw is None:
        return {}
    items = list(raw.items()) if isinstance(raw, dict) else [(t, "") for t in raw] if isinstance(raw, list) else None
    if items is None:
        check.error(("tags",), "tags is a list of tag names or a mapping of tag -> what it is")
        return {}
    out = {}
    for name, meaning in items:
        if not TAG_RE.fullmatch(str(name)):
            check.error(("tags", str(name)), f"{name!r} is not a Docker tag")
        out[str(name)] = "" if meaning is None else str(meaning)
    return out


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _unnamed() -> str:
    """The engine of an image file that names none (written before image files named their engine)."""
    from metralectl.core.engines.registry import the_builtin

    return the_builtin("owns_unnamed_images")
