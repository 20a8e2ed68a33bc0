"""A host process's "image": the executable it is started from, named `process:/abs/path`.

Present means it exists, is a regular file (after links) and this user may execute it; its platform is read
from its ELF header (so an arm64 binary on an x86-64 machine is told apart before it fails with `exec format
error`), a script's being this machine's. Nothing is pulled: an absent engine is installed by its owner.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from metralectl.seams.docker.images import ImageState

# ELF e_machine -> the OCI architecture name
_ELF_MACHINES = {3: "386", 40: "arm", 62: "amd64", 183: "arm64", 243: "riscv64", 21: "ppc64le", 22: "s390x"}


@dataclass(frozen=True)
class ExecutableState(ImageState):
    """An ImageState with the reason an executable is absent (None when present)."""

    reason: str | None = None


def executable_problem(path: str) -> str | None:
    """Why `path` cannot be executed as an engine, or None when it can."""
    if not path:
        return "no executable is named (the command is empty)"
    if not os.path.isabs(path):
        return f"{path!r} is not an absolute path"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"it cannot be looked at ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if not os.access(path, os.X_OK):
        return "this user may not execute it (no execute permission)"
    return None


def install_hint(path: str) -> str:
    return (f"install the engine so that {path} exists and is executable, or set where its executable is "
            "(`metralectl doctor --recipe RECIPE` says what is missing)")


def elf_platform(path: str) -> str | None:
    """linux/<arch> from an ELF executable's header; None for a script or an unreadable file."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    machine = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    arch = _ELF_MACHINES.get(machine)
    return f"linux/{arch}" if arch else "linux/unknown"


def image_state(ref: str, machine_platform: str) -> ExecutableState:
    """`process:/abs/exe` as an image: present when the executable may be run; its platform from its header."""
    from metralectl.seams.process import IMAGE_PREFIX

    if not ref.startswith(IMAGE_PREFIX):
        return ExecutableState(ref, False, reason=f"{ref!r} names no executable (a host process's image is "
                                                  f"{IMAGE_PREFIX}/absolute/path)")
    path = ref[len(IMAGE_PREFIX):]
    problem = executable_problem(path)
    if problem is not None:
        return ExecutableState(ref, False, reason=f"{path}: {problem}")
    st = os.stat(path)
    return ExecutableState(ref, True, image_id=f"file:{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}",
                           platform=elf_platform(path) or machine_platform)
