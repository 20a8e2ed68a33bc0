"""What a container of the engine-double test image needs from the host to run.

The image ``metralectl-test/engine-double:latest`` (or $METRALECTL_TEST_ENGINE_IMAGE; built by ``build.sh``
beside this file) holds only
busybox, the test double and a ``met`` wrapper; it carries no Python. The interpreter comes from
the host at run time, bind-mounted READ-ONLY at the same paths it has on the host:

    <sys.base_prefix>   the interpreter's installation (bin/, lib/pythonX.Y, libpythonX.Y.so)
    /lib, /lib64        the dynamic loader and libc (on merged-/usr hosts these are symlinks to
                        /usr/lib*, which Docker resolves when it mounts them)
    /usr/lib            shared libraries the interpreter and its extension modules link

(a mount is left out when the host lacks the path or another mount covers it. When the prefix
would hide the image's own files - a system Python with prefix /usr or /usr/local - only the
interpreter executable, its lib/pythonX.Y and its libpython are mounted instead of the prefix.) ``DOUBLE_PYTHON=<interpreter_path()>`` in the container's environment
tells the wrapper which interpreter to exec; without it the wrapper tries the interpreter recorded
at build time, then /usr/local/bin/python3 and /usr/bin/python3.

Usage from tests::

    from tests.docker_image import mounts          # or importlib on this file
    spec = {"image": mounts.IMAGE, "volumes": mounts.docker_volumes(),
            "environment": mounts.container_env(), ...}

``python3 mounts.py --interpreter-path`` / ``--docker-args`` print those for shell scripts.
Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys

DEFAULT_IMAGE = "metralectl-test/engine-double:latest"
# METRALECTL_TEST_ENGINE_IMAGE: build and use the double's image under another tag (a worktree whose double
# differs from another's, on one shared daemon); build.sh, bundle.py and the test fixtures all honour it.
IMAGE = os.environ.get("METRALECTL_TEST_ENGINE_IMAGE", "").strip() or DEFAULT_IMAGE
HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_SCRIPT = os.path.join(HERE, "build.sh")
START_DOCKERD = os.path.join(HERE, "start-dockerd.sh")
DOUBLE = os.path.normpath(os.path.join(HERE, "..", "engine_double", "metrale_double.py"))
LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib")


def interpreter_path() -> str:
    """The real (symlink-free) path of the base interpreter: what the container's wrapper execs."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for cand in (os.path.join(sys.base_prefix, "bin", version),
                 os.path.join(sys.base_prefix, "bin", "python3")):
        if os.path.exists(cand):
            return os.path.realpath(cand)
    return os.path.realpath(sys.executable)


# Paths the image itself provides; a mount must never hide them.
IMAGE_PATHS = ("/usr/local/bin/met", "/usr/local/lib/metrale-double", "/bin", "/etc", "/tmp")


def _covered(path: str, by: list[str]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in by)


def _prefix_mounts(prefix: str) -> list[str]:
    """The interpreter's own paths: its whole prefix, or (when mounting the prefix would hide the
    image's files, e.g. a system Python with prefix /usr or /usr/local) just its executable, its
    stdlib directory and its shared libpython."""
    if not any(_covered(p, [prefix]) for p in IMAGE_PATHS):
        return [prefix]
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    out = [interpreter_path(), os.path.join(prefix, "lib", f"python{version}")]
    libdir = os.path.join(prefix, "lib")
    if os.path.isdir(libdir):
        out += sorted(os.path.join(libdir, n) for n in os.listdir(libdir)
                      if n.startswith(f"libpython{version}") and ".so" in n)
    return out


def interpreter_mounts() -> list[dict]:
    """Bind mounts (source, target, read_only) that let the container run interpreter_path()."""
    candidates: list[str] = []
    for prefix in dict.fromkeys([sys.base_prefix, os.path.realpath(sys.base_prefix),
                                 os.path.dirname(os.path.dirname(interpreter_path()))]):
        candidates += _prefix_mounts(prefix)
    candidates += LIBRARY_DIRS
    existing = [p for p in dict.fromkeys(candidates) if p and p != "/" and os.path.exists(p)]
    roots = [p for p in existing if not _covered(p, [q for q in existing if q != p])]
    return [{"source": p, "target": p, "read_only": True} for p in roots]


def container_env() -> dict[str, str]:
    """Environment a container needs so the wrapper finds the mounted interpreter."""
    return {"DOUBLE_PYTHON": interpreter_path()}


def docker_volumes() -> dict[str, dict[str, str]]:
    """interpreter_mounts() in the Docker SDK's ``volumes=`` form."""
    return {m["source"]: {"bind": m["target"], "mode": "ro" if m["read_only"] else "rw"}
            for m in interpreter_mounts()}


def docker_cli_args() -> list[str]:
    """``-v``/``-e`` arguments for ``docker run`` / ``docker create``."""
    out: list[str] = []
    for m in interpreter_mounts():
        out += ["-v", f"{m['source']}:{m['target']}:{'ro' if m['read_only'] else 'rw'}"]
    for k, v in container_env().items():
        out += ["-e", f"{k}={v}"]
    return out


def build_image(force: bool = False, timeout: float = 300) -> str:
    """Run build.sh (fast when the image is up to date); return the image name."""
    cmd = ["bash", BUILD_SCRIPT, "--python", interpreter_path(), "--image", IMAGE]
    if force:
        cmd.append("--force")
    subprocess.run(cmd, check=True, timeout=timeout)
    return IMAGE


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "--docker-args"
    if arg == "--interpreter-path":
        print(interpreter_path())
    elif arg == "--mounts":
        for m in interpreter_mounts():
            print(f"{m['source']}:{m['target']}:{'ro' if m['read_only'] else 'rw'}")
    elif arg == "--docker-args":
        print(" ".join(docker_cli_args()))
    else:
        print("usage: mounts.py [--interpreter-path | --mounts | --docker-args]", file=sys.stderr)
        sys.exit(2)
