"""TEST FIXTURE: self-contained variants of the engine-double image, for metralectl's lifecycle tests.

`metralectl run` starts containers exactly as a recipe renders them (no extra test mounts), so the
image it runs must carry its own interpreter. `build_bundled()` layers a copy of this machine's
Python (the interpreter, its stdlib, lib-dynload and the shared libraries they link, at the same
absolute paths) onto `metralectl-test/engine-double:latest` (or $METRALECTL_TEST_ENGINE_IMAGE); the `met` wrapper then finds it where
build.sh recorded it. `build_variant(tag, env)` adds ENV lines (e.g. DOUBLE_FAULT=exit-137) so a
test picks a failure mode by image, as an operator would pick an image — nothing in metralectl
knows about the double. Everything is built locally; nothing is pulled.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE_IMAGE = os.environ.get("METRALECTL_TEST_ENGINE_IMAGE", "").strip() or "metralectl-test/engine-double:latest"


def _bundled_repo(base: str) -> str:
    """metralectl-test/engine-double:latest -> metralectl-test/engine-bundled (the names tests always used);
    an overridden base keeps its own name apart: NAME -> NAME-bundled."""
    repo = base.rsplit(":", 1)[0] if ":" in base.rsplit("/", 1)[-1] else base
    return repo.replace("engine-double", "engine-bundled") if "engine-double" in repo else f"{repo}-bundled"


BUNDLED_REPO = _bundled_repo(BASE_IMAGE)
BUNDLED_IMAGE = f"{BUNDLED_REPO}:latest"


def variant_tag(name: str) -> str:
    """The tag of a failure-mode variant (`build_variant`), beside this bundle's own."""
    return f"{BUNDLED_REPO}:{name}"
_SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
              "pydoc_data", "unittest", "distutils", "config-3.11-x86_64-linux-gnu"}
_LDD_PATH = re.compile(r"(/\S+)")


def _interpreter() -> Path:
    return Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))


def _ldd(path: Path) -> set[str]:
    try:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {m.group(1) for line in out.splitlines() for m in [_LDD_PATH.search(line)] if m and os.path.exists(m.group(1))}


def closure() -> list[str]:
    """Every file the interpreter needs inside a bare rootfs, at its host path."""
    exe = _interpreter()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = {str(exe)}
    native = [exe]
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        for name in names:
            full = Path(root) / name
            files.add(str(full))
            if name.endswith(".so"):
                native.append(full)
    libdir, ldlibrary = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and ldlibrary and (Path(libdir) / ldlibrary).exists():
        files.add(str(Path(libdir) / ldlibrary))
        native.append(Path(libdir) / ldlibrary)
    for binary in native:
        files |= _ldd(binary)
    # glibc dlopens libgcc_s for pthread_exit's unwinding (no binary links it, so ldd never lists it): without
    # it a daemon thread still alive at interpreter exit aborts with "libgcc_s.so.1 must be installed".
    for libc in [f for f in files if os.path.basename(f).startswith("libc.so")]:
        gcc_s = Path(libc).with_name("libgcc_s.so.1")
        if gcc_s.exists():
            files.add(str(gcc_s))
    return sorted(files)


def _digest(paths: list[str]) -> str:
    h = hashlib.sha256(BASE_IMAGE.encode())
    for p in paths:
        st = os.stat(p)
        h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _label(image: str, key: str) -> str | None:
    out = subprocess.run(["docker", "image", "inspect", "--format", f'{{{{ index .Config.Labels "{key}" }}}}', image],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def _docker_build(tag: str, dockerfile: str, context_files: dict[str, bytes | Path]) -> None:
    with tempfile.TemporaryDirectory() as ctx:
        for name, content in context_files.items():
            target = Path(ctx) / name
            if isinstance(content, Path):
                shutil.copyfile(content, target)
            else:
                target.write_bytes(content)
        (Path(ctx) / "Dockerfile").write_text(dockerfile)
        out = subprocess.run(["docker", "build", "-q", "-t", tag, ctx], capture_output=True, text=True,
                             env={**os.environ, "DOCKER_BUILDKIT": "0"})
        if out.returncode != 0:
            raise RuntimeError(f"docker build {tag} failed: {out.stderr.strip()[-2000:]}")


def build_bundled() -> str:
    """The base double image plus this machine's interpreter; rebuilt only when an input changed."""
    subprocess.run(["bash", str(HERE / "build.sh"), "--quiet", "--image", BASE_IMAGE], check=True)
    files = closure()
    key = _digest(files) + (_label(BASE_IMAGE, "metralectl.test.build-key") or "")
    if _label(BUNDLED_IMAGE, "metralectl.test.bundle-key") == key:
        return BUNDLED_IMAGE
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "python.tar"
        with tarfile.open(tar_path, "w", dereference=True) as tar:
            for path in files:
                tar.add(path, arcname=path.lstrip("/"), recursive=False)
        _docker_build(BUNDLED_IMAGE, f"FROM {BASE_IMAGE}\nADD python.tar /\n"
                                     f"LABEL metralectl.test.bundle-key={key}\n", {"python.tar": tar_path})
    return BUNDLED_IMAGE


def build_variant(tag: str, env: dict[str, str]) -> str:
    """A bundled image with ENV baked in (a failure mode, a delay): instant, metadata only."""
    lines = "".join(f"ENV {k}={json.dumps(v)}\n" for k, v in sorted(env.items()))  # quoted: values may hold spaces
    _docker_build(tag, f"FROM {BUNDLED_IMAGE}\n{lines}", {})
    return tag


if __name__ == "__main__":
    print(build_bundled())
    print(f"{len(closure())} files bundled", file=sys.stderr)
