"""Which files of a GGUF repository a quant needs: llama.cpp's `-hf REPO:QUANT` rule, restated.

A GGUF repository holds many quants (10-70 GB each); a recipe serves one. `llama-server -hf REPO:QUANT
--offline` lists every file under the snapshot refs/ names and takes, in listing order, the first
model .gguf whose repo path holds QUANT followed by `.` or `-` (case-insensitive), skipping parts 2..n
of a split, then every part that shares its prefix and part count (llama.cpp common/download.cpp:
find_best_model, get_gguf_split_info, get_split_files; common/hf-cache.cpp: get_cached_ref). So the
files a quant needs are its model file or all parts of its split, nothing else:

  - sidecars (`mmproj`, `imatrix`, `mtp-`, `eagle3-`, `dflash-`, `dspark-` in the file name) are not
    model files; llama-server loads an mmproj found in the cache, so pulling one would add vision
    input no recipe asked for;
  - a root `preset.ini` turns llama-server into a router serving that preset instead of the quant, so
    pulling it would change what is served; README/config files are read by nobody.

Pure: names and listings in, selections out; the filesystem side is gguf_cache.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from metralectl.core.progress import human_bytes
from metralectl.errors import ExitCode
from metralectl.seams.hfcache import RepoFile
from metralectl.seams.weights_errors import WeightsError

SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # llama.cpp: gguf_filename_is_model
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_PREFIXED = ("UD",)  # Unsloth's dynamic quants: recipes (and the engine's quant list) name them UD-Q4_K_XL


@dataclass(frozen=True)
class SplitInfo:
    prefix: str  # the path without `.gguf` and without `-NNNNN-of-NNNNN`, directories included
    tag: str  # llama.cpp's quant tag: the last `-`/`.` separated word of the prefix, upper-cased
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    """llama.cpp's reading of a .gguf path (None for any other file)."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[: -len(".gguf")], 1, 1
    split = _SPLIT.match(prefix)
    if split:
        prefix, index, count = split.group(1), int(split.group(2)), int(split.group(3))
    tag = _TAG.search(prefix)
    return SplitInfo(prefix, tag.group(1).upper() if tag else "", index, count)


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in SIDECARS)


def matches(path: str, quant: str) -> bool:
    """The file `-hf REPO:QUANT` would consider: a model .gguf whose path holds QUANT then `.` or `-`."""
    return is_model_file(path) and re.search(re.escape(quant) + r"[.-]", path, re.IGNORECASE) is not None


def quant_label(info: SplitInfo) -> str:
    """The quant a file is of, as a recipe names it: llama.cpp's tag, with a `UD-` prefix kept."""
    head = info.prefix[: len(info.prefix) - len(info.tag)].upper()
    for word in _PREFIXED:
        if head.endswith(f"{word}-") and (len(head) == len(word) + 1 or head[-len(word) - 2] in "-./"):
            return f"{word}-{info.tag}"
    return info.tag


@dataclass(frozen=True)
class Model:
    """One model file, or one split of several parts: what llama-server would load as a whole."""

    prefix: str
    count: int
    label: str
    parts: tuple[RepoFile, ...]  # as listed, by part number; fewer than `count` when parts are missing

    @property
    def first(self) -> str:
        return self.parts[0].path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.parts)

    @property
    def complete(self) -> bool:
        return len(self.parts) == self.count

    def describe(self) -> str:
        parts = f"{self.count} parts, " if self.count > 1 else ""
        return f"{self.label} ({parts}{human_bytes(self.total_bytes)})"


def models(files: Iterable[RepoFile]) -> list[Model]:
    """Every model llama.cpp could pick from `files`: groups by (prefix, count) whose first part exists."""
    groups: dict[tuple[str, int], list[tuple[int, RepoFile]]] = {}
    for f in files:
        info = split_info(f.path)
        if info is None or not is_model_file(f.path):
            continue
        groups.setdefault((info.prefix, info.count), []).append((info.index, f))
    out = []
    for (prefix, count), members in groups.items():
        members.sort(key=lambda m: m[0])
        if members[0][0] != 1:
            continue  # llama.cpp starts from part 1; parts without it are never loaded
        info = split_info(members[0][1].path)
        assert info is not None
        unique = {index: f for index, f in members if 1 <= index <= count}
        out.append(Model(prefix, count, quant_label(info), tuple(unique[i] for i in sorted(unique))))
    return sorted(out, key=lambda m: (m.label, m.prefix))


def available(files: Iterable[RepoFile]) -> str:
    """The quants a listing holds, for a message: `BF16 (3 parts, 69.4 GB), Q4_K_M (21.0 GB)`."""
    found = models(files)
    return ", ".join(m.describe() for m in found) if found else "no model .gguf file at all"


def select(repo: str, commit: str, files: Sequence[RepoFile], quant: str) -> Model:
    """The model (with every part) `-hf REPO:QUANT` needs from this listing, or a WeightsError that says why."""
    where = f"{repo}@{commit[:12]}"
    candidates = [m for m in models(files) if matches(m.first, quant)]
    if len(candidates) > 1:  # an exact name wins (Q4_K_M over UD-Q4_K_M); llama.cpp itself takes the first listed
        exact = [m for m in candidates if m.label.upper() == quant.upper()]
        candidates = exact if len(exact) == 1 else candidates
    if not candidates:
        raise WeightsError(
            f"{where} has no .gguf file for quant {quant}: no model file's name holds `{quant}.` or `{quant}-`; "
            f"the repository has: {available(files)}",
            "set `checkpoint.quant:` in the recipe to one of those (`metralectl show RECIPE` names the recipe file)",
            exit_code=ExitCode.DATA)
    if len(candidates) > 1:
        names = ", ".join(m.first for m in candidates)
        raise WeightsError(
            f"quant {quant} is ambiguous in {where}: it names {len(candidates)} models ({names}); "
            f"llama-server -hf {repo}:{quant} would load whichever its cache lists first",
            "name a quant that only one of them holds (e.g. with its `UD-` prefix)", exit_code=ExitCode.DATA)
    model = candidates[0]
    if not model.complete:
        have = ", ".join(f.path for f in model.parts)
        raise WeightsError(f"{where} lists only {len(model.parts)} of the {model.count} parts of {model.prefix} "
                           f"({have}); llama-server cannot load an incomplete split",
                           "the repository is being uploaded or is broken: pin an earlier commit (checkpoint.revision)")
    return model


def rivals(paths: Iterable[str], quant: str, chosen: Iterable[str]) -> list[str]:
    """Files besides `chosen` that llama-server could pick for QUANT (first parts and single files)."""
    mine = set(chosen)
    out = []
    for path in paths:
        info = split_info(path)
        if path in mine or info is None or info.index != 1 or not matches(path, quant):
            continue
        out.append(path)
    return sorted(out)
