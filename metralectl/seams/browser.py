"""A headless Chromium already on this machine, used to rasterise a page or an SVG to PNG (`bench report --png`).

Why Chromium and not a Python library: metralectl has no imaging dependency (no Pillow, cairo or matplotlib in its
install), its plots are SVG with text, and rasterising text needs a font renderer; a headless browser is the one
offline renderer commonly present (Debian's `chromium`, which `scripts/bootstrap.sh` installs for the page tests).
Without one, --png says so (exit 69) and --svg / --html still work: a browser opens those.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from metralectl.errors import ExitCode, MetralError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
TIMEOUT_S = 60.0


class NoBrowser(MetralError):
    exit_code = ExitCode.UNAVAILABLE


def find() -> str | None:
    override = os.environ.get("METRALE_CHROMIUM")
    if override:
        return override if Path(override).is_file() else None
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


def screenshot(source: Path, out: Path, width: int, height: int) -> None:
    """Render `source` (an .svg or .html file) at width x height CSS pixels into the PNG `out`."""
    binary = find()
    if binary is None:
        raise NoBrowser("--png needs a headless Chromium (chromium, chromium-browser or google-chrome on PATH, or "
                        "METRALE_CHROMIUM) to rasterise the plots, and none was found",
                        "install one (Debian: apt-get install chromium), or use --svg / --html (any browser "
                        "opens them)")
    with tempfile.TemporaryDirectory(prefix="metrale-chromium-") as profile:
        command = [binary, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                   "--no-default-browser-check", f"--user-data-dir={profile}", "--force-device-scale-factor=1",
                   f"--window-size={width},{height}", f"--screenshot={out}", source.resolve().as_uri()]
        if os.geteuid() == 0:
            command.insert(1, "--no-sandbox")  # Chromium refuses root without it
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise NoBrowser(f"{binary} did not finish rendering {source.name} within {TIMEOUT_S:.0f} s") from None
        except OSError as exc:
            raise NoBrowser(f"cannot start {binary}: {exc.strerror}") from None
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr or "").strip().splitlines()[-3:]
        raise NoBrowser(f"{binary} could not render {source.name} (exit {done.returncode}): {' | '.join(tail)}")
