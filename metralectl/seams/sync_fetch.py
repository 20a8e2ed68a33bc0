"""Where `recipes sync` reads a release from: a directory, or an http(s) URL (the release's download base).

Every asset is read whole into memory under a byte cap, whatever a size field says. From a directory:
opened without blocking and refused unless it is a regular file (a FIFO would block forever, /dev/zero
never ends), then read to at most the cap + 1 bytes. Over HTTP (sync_http): https, or plain http to a
loopback host; plain http elsewhere only with --allow-http; a redirect may not downgrade https to
http nor leave http(s); the body is capped, and every asset has a deadline on top of the per-read
timeout (a server that drips a byte at a time ends with a clear error). A body shorter than its
Content-Length, an HTTP error, a timeout or a refused connection is a ReleaseError naming the asset,
never a half-read file. Standard library only (urllib), imported only by the sync command.
"""

from __future__ import annotations

import os
import ssl
import stat
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from metralectl import paths
from metralectl.core.release_archive import ReleaseError
from metralectl.safetext import clean

DEFAULT_SOURCE = "https://github.com/Metrale/metrale-inference/releases/download/b34/"  # the pinned release
ENV_SOURCE = "METRALECTL_RECIPES_URL"
CONFIG_FILE = "recipes-sync-source"  # one line in the config dir: a URL or a directory
CONFIG_LIMIT = 4096
CHUNK = 1 << 16

Progress = Callable[[str, int, "int | None"], None]  # asset, bytes so far, total when known


def default_source() -> tuple[str, str]:
    """(source, where it was configured): the environment, the config file, else the pinned release."""
    if os.environ.get(ENV_SOURCE, "").strip():
        return os.environ[ENV_SOURCE].strip(), f"${ENV_SOURCE}"
    configured = paths.config_dir() / CONFIG_FILE
    try:
        with open(configured, "rb") as fh:
            text = fh.read(CONFIG_LIMIT).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    if text:
        return text.splitlines()[0].strip(), str(configured)
    return DEFAULT_SOURCE, "the default (engine release b34)"


class Source:
    """A release's download base (http/https) or a directory holding its assets."""

    def __init__(self, location: str, *, allow_http: bool = False, context: ssl.SSLContext | None = None) -> None:
        self.location = location
        self.allow_http = allow_http
        self.context = context  # for https: None is the system's trust store (SSL_CERT_FILE honoured)
        if not location or not location.isprintable():
            raise ReleaseError(f"cannot sync from {clean(location)!r}: the source holds control characters",
                               "give --from a plain URL or directory")
        try:
            parsed = urllib.parse.urlsplit(location)
            parsed.port  # noqa: B018 - a malformed port raises here, not in the middle of a download
        except ValueError as exc:
            raise ReleaseError(f"cannot sync from {clean(location)!r}: {clean(str(exc))}",
                               "give --from an http(s) URL or a directory") from None
        self.is_url = parsed.scheme in ("http", "https")
        if parsed.scheme and not self.is_url and len(parsed.scheme) > 1:
            raise ReleaseError(f"cannot sync from {clean(location)!r}: only http(s) URLs and directories are read")
        if self.is_url:
            from metralectl.seams import sync_http

            sync_http.check_start(location, allow_http)
        elif not Path(location).expanduser().is_dir():
            raise ReleaseError(f"{clean(location)} is not a directory holding a release's assets",
                               "give --from a directory with index.json, recipes.tar.gz, serve-options.json "
                               "and their .sha256 files, or an http(s) URL")

    def read(self, name: str, limit: int, progress: Progress | None = None) -> bytes:
        if self.is_url:
            from metralectl.seams import sync_http

            return sync_http.fetch(self, name, limit, progress)
        return self._file(name, limit)

    def _file(self, name: str, limit: int) -> bytes:
        path = Path(self.location).expanduser() / name
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below like a device.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ReleaseError(f"{name} is missing from {clean(self.location)}") from None
        except OSError as exc:
            raise ReleaseError(f"cannot read {clean(str(path))}: {exc.strerror or exc}") from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                    else "not a regular file"
                raise ReleaseError(f"{clean(str(path))} is {kind}; a release asset is read only from a regular file")
            os.set_blocking(fd, True)
            data = bytearray()
            while len(data) <= limit:  # whatever st_size says: a file may grow while it is read
                chunk = os.read(fd, min(CHUNK, limit + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            raise ReleaseError(f"cannot read {clean(str(path))}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        if len(data) > limit:
            from metralectl.seams.sync_http import size_text

            raise ReleaseError(f"{name} is more than the {size_text(limit)} this asset may be",
                               "a release asset this large is not one metralectl reads; nothing was installed")
        return bytes(data)
