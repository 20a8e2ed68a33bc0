"""Where `recipes sync` reads a release from: a directory, or an http(s) URL (the release's download base).

Every asset is read whole into memory under a size limit; an HTTP body shorter than its
Content-Length, a 404, a timeout or a refused connection is a ReleaseError naming the asset, never a
half-read file. Standard library only (urllib), imported only by the sync command.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.client import HTTPException
from pathlib import Path

from metralectl import paths
from metralectl.core.release_archive import ReleaseError
from metralectl.safetext import clean

DEFAULT_SOURCE = "https://github.com/Metrale/metrale-inference/releases/download/b34/"  # the pinned release
ENV_SOURCE = "METRALECTL_RECIPES_URL"
CONFIG_FILE = "recipes-sync-source"  # one line in the config dir: a URL or a directory
TIMEOUT_S = 30.0
CHUNK = 1 << 16

Progress = Callable[[str, int, "int | None"], None]  # asset, bytes so far, total when known


def default_source() -> tuple[str, str]:
    """(source, where it was configured): the environment, the config file, else the pinned release."""
    if os.environ.get(ENV_SOURCE, "").strip():
        return os.environ[ENV_SOURCE].strip(), f"${ENV_SOURCE}"
    configured = paths.config_dir() / CONFIG_FILE
    try:
        text = configured.read_text().strip()
    except OSError:
        text = ""
    if text:
        return text.splitlines()[0].strip(), str(configured)
    return DEFAULT_SOURCE, "the default (engine release b34)"


class Source:
    def __init__(self, location: str) -> None:
        self.location = location
        parsed = urllib.parse.urlparse(location)
        self.is_url = parsed.scheme in ("http", "https")
        if parsed.scheme and not self.is_url and len(parsed.scheme) > 1:
            raise ReleaseError(f"cannot sync from {clean(location)!r}: only http(s) URLs and directories are read")
        if not self.is_url and not Path(location).expanduser().is_dir():
            raise ReleaseError(f"{clean(location)} is not a directory holding a release's assets",
                               "give --from a directory with index.json, recipes.tar.gz, serve-options.json "
                               "and their .sha256 files, or an http(s) URL")

    def read(self, name: str, limit: int, progress: Progress | None = None) -> bytes:
        return self._http(name, limit, progress) if self.is_url else self._file(name, limit)

    def _file(self, name: str, limit: int) -> bytes:
        path = Path(self.location).expanduser() / name
        try:
            size = path.stat().st_size
            if size > limit:
                raise ReleaseError(f"{name} is {size} bytes, more than the {limit >> 10} KB this asset may be")
            return path.read_bytes()
        except FileNotFoundError:
            raise ReleaseError(f"{name} is missing from {clean(self.location)}") from None
        except OSError as exc:
            raise ReleaseError(f"cannot read {path}: {exc.strerror or exc}") from None

    def _http(self, name: str, limit: int, progress: Progress | None) -> bytes:
        url = urllib.parse.urljoin(self.location if self.location.endswith("/") else self.location + "/", name)
        request = urllib.request.Request(url, headers={"User-Agent": "metralectl recipes sync"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - http(s) only
                length = response.headers.get("Content-Length")
                expected = int(length) if length and length.isdigit() else None
                if expected is not None and expected > limit:
                    raise ReleaseError(f"{name} is {expected} bytes, more than the {limit >> 10} KB this asset may be")
                data = bytearray()
                while True:
                    chunk = response.read(CHUNK)
                    if not chunk:
                        break
                    data += chunk
                    if len(data) > limit:
                        raise ReleaseError(f"{name} is more than the {limit >> 10} KB this asset may be")
                    if progress is not None:
                        progress(name, len(data), expected)
        except urllib.error.HTTPError as exc:
            raise ReleaseError(f"{clean(url)} answered HTTP {exc.code}",
                               "is this the download base of an engine release?") from None
        except (urllib.error.URLError, HTTPException, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ReleaseError(f"fetching {clean(url)} failed: {clean(str(reason))}",
                               "nothing was installed; the previous synced recipes stay") from None
        if expected is not None and len(data) != expected:
            raise ReleaseError(f"{name}: the server closed the connection after {len(data)} of {expected} bytes",
                               "nothing was installed; the previous synced recipes stay")
        return bytes(data)
