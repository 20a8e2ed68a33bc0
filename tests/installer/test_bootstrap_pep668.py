"""README's development set-up on a system Python that refuses global pip installs (PEP 668).

Debian 12 / Ubuntu 24.04 / DGX OS mark their Python `EXTERNALLY-MANAGED`: `python3 -m pip install …`
stops with `externally-managed-environment`. `scripts/bootstrap.sh` must still set everything up, in the
project venv, from that very Python: this test runs the script as written with the distribution's own
`/usr/bin/python3` first on PATH and checks the venv was built from it and holds a working metralectl.

The Python packages come from a wheel directory filled once per machine from the package index (as the
installer tests' wheel cache does), so the install itself needs no network; the real-engine packages
(torch, transformers) are left out (METRALECTL_SKIP_REALENGINES=1, which the script documents).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def system_stdlib() -> Path | None:
    if not SYSTEM_PYTHON.exists():
        return None
    out = subprocess.run([str(SYSTEM_PYTHON), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    return Path(out.stdout.strip()) if out.returncode == 0 else None


@pytest.fixture(scope="module")
def dev_wheels() -> Path:
    """metralectl's and its test extras' wheels, for the system Python's version, downloaded once."""
    version = subprocess.run([str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version)"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + version.encode()).hexdigest()[:16]
    cache = Path.home() / ".cache" / "metralectl-tests" / f"dev-wheels-{key}"
    if not (cache / ".complete").exists():
        cache.mkdir(parents=True, exist_ok=True)
        # the system Python's own pip: `download` installs nothing, so PEP 668 allows it, and the wheels
        # match that interpreter
        done = subprocess.run([str(SYSTEM_PYTHON), "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                               "-d", str(cache), f"{REPO}[test]", "hatchling>=1.21", "editables"],
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"could not collect the development wheels (needs the package index once):\n{done.stderr[-3000:]}")
        (cache / ".complete").touch()
    return cache


def test_bootstrap_builds_the_project_venv_from_an_externally_managed_python(dev_wheels: Path, tmp_path: Path) -> None:
    stdlib = system_stdlib()
    if stdlib is None or not (stdlib / "EXTERNALLY-MANAGED").exists():
        pytest.skip(f"{SYSTEM_PYTHON} is not an externally managed (PEP 668) Python on this machine")
    base_env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull,
                "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(dev_wheels), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "LANG": "C.UTF-8"}  # fmt: skip
    # what the user would hit without a venv: the system Python refuses
    refused = subprocess.run([str(SYSTEM_PYTHON), "-m", "pip", "install", "--dry-run", "pyyaml"], env=base_env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    if "No module named pip" not in refused.stderr:
        assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr, refused.stderr
    venv = tmp_path / "venv"
    env = {**base_env, "METRALECTL_VENV": str(venv), "METRALECTL_SKIP_REALENGINES": "1"}
    done = subprocess.run(["bash", str(REPO / "scripts" / "bootstrap.sh")], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "externally-managed-environment" not in done.stderr
    base = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.base_prefix)"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert Path(base) == stdlib.parents[1], base  # built from the system Python (/usr), not from ours
    listing = subprocess.run([str(venv / "bin" / "metralectl"), "list"], env={**env, "NO_COLOR": "1"},
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listing.returncode == 0 and "RECIPE" in listing.stdout, listing.stderr
    # editable: the venv runs this checkout
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import metralectl; print(metralectl.__file__)"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert Path(where).resolve().is_relative_to(REPO)
