"""Resumable downloads of large LFS files: our own ranged HTTP GET, because huggingface_hub (>= 1.0)
deletes its temporary file when a download is interrupted, so a multi-GB file killed by Ctrl-C starts
again from zero.

Only LFS files of at least RESUMABLE_MIN_BYTES take this path: they carry the sha256 that names the part
file and proves the finished one, and they are where a restart hurts; small files stay with
huggingface_hub (a restart costs a second). One file:
  1. its part (partials.py) is reused when its sidecar names the same repo, path, sha256 and size; a part
     of the same path with another sha256 is an older version of the file: deleted, said out loud;
  2. GET {endpoint}/{repo}/resolve/{commit}/{path} with `Range: bytes=<have>-` and `If-Range: <ETag that
     served the part>`; redirects followed by hand (the CDN is another host: no Authorization there);
  3. 206 from <have>: append; 200: the server ignored the range or the object changed: start over, said;
  4. fsync every FSYNC_EVERY bytes and on the way out, so what is kept after a crash is on disk;
  5. a dropped connection is retried from the bytes on disk (RETRIES times without progress);
  6. sha256 of the whole file against the Hub's LFS oid: a mismatch deletes the part and fails; a match
     renames it into blobs/<sha256> (atomic, same folder tree) and links snapshots/<commit>/<path> to it,
     exactly as huggingface_hub lays out its cache.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from metralectl.atomicfile import place, symlink_atomic
from metralectl.core.progress import human_bytes
from metralectl.seams import partials
from metralectl.seams.hfcache import RepoFile
from metralectl.seams.partials import Partial
from metralectl.seams.transfer import Account, Cancelled
from metralectl.seams.weights_errors import WeightsError

if TYPE_CHECKING:
    import httpx  # imported where it is used: `list` reaches this module and must not load httpx

RESUMABLE_MIN_BYTES = 16 << 20
FSYNC_EVERY = 64 << 20
RETRIES = 5  # attempts in a row that bring no new byte
MAX_REDIRECTS = 10
TIMEOUT_S = 30.0

Note = Callable[[str], None]


def resumable(spec: RepoFile) -> bool:
    return spec.sha256 is not None and spec.size >= RESUMABLE_MIN_BYTES


class HubHTTPError(Exception):
    """An HTTP error answer, shaped for weights_errors.hub_error (it reads .response.status_code,
    .server_message and the class names huggingface_hub uses)."""

    def __init__(self, response: Any, message: str) -> None:
        super().__init__(message)
        self.response = response
        self.server_message = response.headers.get("X-Error-Message", "")


class GatedRepoError(HubHTTPError):
    pass


class RepositoryNotFoundError(HubHTTPError):
    pass


class RevisionNotFoundError(HubHTTPError):
    pass


class EntryNotFoundError(HubHTTPError):
    pass


_BY_CODE: dict[str, type[HubHTTPError]] = {"GatedRepo": GatedRepoError, "RepoNotFound": RepositoryNotFoundError,
                                           "RevisionNotFound": RevisionNotFoundError,
                                           "EntryNotFound": EntryNotFoundError}


def kept(base: Path, spec: RepoFile) -> int:
    """Bytes of `spec` already on disk in a reusable part (0 when none)."""
    assert spec.sha256 is not None
    found = partials.read(partials.folder(base) / f"{spec.sha256}.part")
    if found is None or (found.sha256, found.size) != (spec.sha256, spec.size):
        return 0
    return min(found.have, spec.size)


def drop_superseded(repo: str, base: Path, wanted: list[RepoFile], note: Note) -> None:
    """Parts of a wanted path downloaded for another version of it (the file changed on the Hub): deleted."""
    by_path = {f.path: f for f in wanted if f.sha256}
    contents = {f.sha256 for f in wanted}
    for old in partials.listed(base):
        new = by_path.get(old.path)
        if old.repo == repo and new is not None and old.sha256 not in contents:
            partials.discard(old)
            note(f"discarded {human_bytes(old.have)} of {old.path} downloaded earlier: the file changed on the "
                 f"Hub (sha256 {old.sha256[:12]}… then, {str(new.sha256)[:12]}… now); downloading it afresh")


def fetch(repo: str, commit: str, spec: RepoFile, base: Path, url: str, headers: dict[str, str], account: Account,
          note: Note) -> bool:
    """Download, verify and place one file. False when the blob was already there (two paths of one content):
    only linked, left to the caller's verification."""
    assert spec.sha256 is not None
    with _content_lock(spec.sha256):
        blob = base / "blobs" / spec.sha256
        if blob.is_file() and blob.stat().st_size == spec.size:
            _link(base, commit, spec, blob)
            return False
        found = _open_part(repo, commit, spec, base)
        account.begin(spec, already=found.have)
        if found.have:
            note(f"resuming {spec.path} at {human_bytes(found.have)} of {human_bytes(spec.size)}")
        _fill(url, headers, found, spec, commit, account, note)
        _verify_and_place(base, commit, spec, found, account)
        return True


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _content_lock(sha256: str) -> threading.Lock:
    """One worker per content: two paths of the same file share its part and its blob."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(sha256, threading.Lock())


def _open_part(repo: str, commit: str, spec: RepoFile, base: Path) -> Partial:
    """The part to continue (same content: sha256 and size), or a fresh empty one with its sidecar."""
    assert spec.sha256 is not None
    folder = partials.folder(base)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    part = folder / f"{spec.sha256}.part"
    found = partials.read(part)
    if found is not None and (found.sha256, found.size) == (spec.sha256, spec.size) and found.have <= spec.size:
        return found
    if found is not None:
        partials.discard(found)
    part.with_suffix(".json").unlink(missing_ok=True)
    os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    fresh = Partial(part, part.with_suffix(".json"), repo, spec.path, spec.sha256, spec.size, 0)
    partials.write_meta(fresh, commit)
    return fresh


def _fill(url: str, headers: dict[str, str], found: Partial, spec: RepoFile, commit: str, account: Account,
          note: Note) -> None:
    """GET the rest until the part holds spec.size bytes; RETRIES attempts in a row without a new byte fail."""
    import httpx

    idle = 0
    last: BaseException | None = None
    with httpx.Client(timeout=httpx.Timeout(TIMEOUT_S), follow_redirects=False) as client:
        while (have := found.part.stat().st_size) < spec.size:
            if idle >= RETRIES:
                if last is not None:
                    raise last
                raise WeightsError(f"{spec.path}: {RETRIES} attempts in a row brought no new byte "
                                   f"({human_bytes(have)} of {human_bytes(spec.size)} kept)",
                                   "pull again later; if it repeats, a proxy or the CDN is failing this file")
            found = partials.read(found.part) or found  # the validator a broken attempt recorded
            try:
                _transfer(client, url, headers, found, have, commit, account, note)
                last = None
            except httpx.TransportError as exc:  # a dropped or stalled connection: go on from the bytes on disk
                last = exc
            idle = 0 if found.part.stat().st_size > have else idle + 1


def _transfer(client: httpx.Client, url: str, headers: dict[str, str], found: Partial, have: int, commit: str,
              account: Account, note: Note) -> None:
    """One GET from `have`, appended to the part."""
    request_headers = dict(headers)
    if have:
        request_headers["Range"] = f"bytes={have}-"
        if found.validator and not found.validator.startswith("W/"):
            request_headers["If-Range"] = found.validator
    response = _open(client, url, request_headers)
    try:
        if response.status_code == 206:
            start, total = _content_range(response.headers.get("Content-Range", ""))
            if total != found.size:
                raise _wrong_size(found, total)
            if start != have:
                note(f"{found.path}: the server answered bytes from {start} for a request from {have}; starting over")
                os.truncate(found.part, 0)
                account.restart(found.path)
                return
        elif response.status_code == 200:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) != found.size:
                raise _wrong_size(found, int(length))
            if have:
                note(f"{found.path}: the server sent the whole file instead of the rest (it ignores ranges, or the "
                     f"file changed): starting over, {human_bytes(have)} discarded")
                os.truncate(found.part, 0)
                account.restart(found.path)
                have = 0
        else:
            raise _http_error(response, found.path)
        etag = response.headers.get("ETag")
        if etag != found.validator:
            partials.write_meta(Partial(found.part, found.meta, found.repo, found.path, found.sha256, found.size,
                                        have, etag), commit)
        written = 0
        unsynced = 0
        with open(found.part, "r+b") as fh:
            fh.seek(have)
            try:
                for chunk in response.iter_bytes():  # as they arrive: a Ctrl-C keeps all but the bytes in flight
                    if have + written + len(chunk) > found.size:
                        partials.discard(found)  # nothing of it is worth keeping
                        raise WeightsError(f"{found.path}: the server sent more than the {found.size} bytes the Hub "
                                           "lists; the partial download was deleted",
                                           "pull again; if it repeats, a proxy is altering the transfer")
                    fh.write(chunk)
                    fh.flush()  # in the kernel now: a Ctrl-C or kill loses nothing written
                    written += len(chunk)
                    unsynced += len(chunk)
                    if unsynced >= FSYNC_EVERY:
                        os.fsync(fh.fileno())
                        unsynced = 0
                    account.add(len(chunk))  # raises Cancelled after Ctrl-C
            finally:
                fh.flush()
                os.fsync(fh.fileno())
    finally:
        response.close()


def _open(client: httpx.Client, url: str, headers: dict[str, str]) -> httpx.Response:
    """GET with redirects followed by hand: Authorization goes to the Hub's host only, never to the CDN."""
    origin = urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS + 1):
        here = headers if urlsplit(url).netloc == origin else {k: v for k, v in headers.items()
                                                              if k.lower() != "authorization"}
        response = client.send(client.build_request("GET", url, headers=here), stream=True)
        if response.status_code not in (301, 302, 303, 307, 308) or "Location" not in response.headers:
            return response
        response.close()
        url = urljoin(url, response.headers["Location"])
    raise WeightsError(f"more than {MAX_REDIRECTS} redirects fetching {url}", "check HF_ENDPOINT and proxies")


def _wrong_size(found: Partial, served: int) -> WeightsError:
    partials.discard(found)
    return WeightsError(f"{found.path}: the server's object is {served} bytes, the Hub lists {found.size}; the partial "
                        "download was deleted and nothing was placed in the cache",
                        "pull again later; if it repeats, a proxy or the CDN is serving a damaged object")


def _content_range(value: str) -> tuple[int, int]:
    """`bytes START-END/TOTAL` -> (START, TOTAL); (-1, -1) when unreadable."""
    try:
        unit, _, spec = value.partition(" ")
        span, _, total = spec.partition("/")
        return int(span.split("-")[0]), int(total)
    except ValueError:
        return -1, -1


def _http_error(response: httpx.Response, path: str) -> HubHTTPError:
    response.read()
    cls = _BY_CODE.get(response.headers.get("X-Error-Code", ""), HubHTTPError)
    says = response.headers.get("X-Error-Message", "")
    return cls(response, f"{response.status_code}{f' ({says})' if says else ''}")


def _verify_and_place(base: Path, commit: str, spec: RepoFile, found: Partial, account: Account) -> None:
    digest = hashlib.sha256()
    with open(found.part, "rb") as fh:
        while chunk := fh.read(8 << 20):
            if account.cancel.is_set():
                raise Cancelled()
            digest.update(chunk)
    actual = digest.hexdigest()
    if actual != spec.sha256:
        partials.discard(found)
        raise WeightsError(
            f"{spec.path}: the downloaded file's sha256 is {actual[:16]}…, the Hub lists {str(spec.sha256)[:16]}…; "
            "the partial download was deleted and nothing was placed in the cache",
            "pull again to fetch it afresh; if it repeats, the disk, a proxy or the CDN is corrupting data")
    blob = base / "blobs" / spec.sha256
    blob.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(found.part, 0o666 & ~_umask())  # as huggingface_hub leaves its blobs
    place(found.part, blob)
    _link(base, commit, spec, blob)
    found.meta.unlink(missing_ok=True)
    try:
        found.part.parent.rmdir()  # the last partial of the repository: leave no empty folder behind
    except OSError:
        pass


def _link(base: Path, commit: str, spec: RepoFile, blob: Path) -> None:
    """snapshots/<commit>/PATH -> the blob, relative, replaced atomically (huggingface_hub's layout)."""
    pointer = base / "snapshots" / commit / spec.path
    pointer.parent.mkdir(parents=True, exist_ok=True)
    symlink_atomic(pointer, os.path.relpath(blob, pointer.parent))


def _umask() -> int:
    """The process umask without changing it (os.umask would race other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def kept_message(base: Path, todo: list[RepoFile], again: str) -> list[str]:
    """After Ctrl-C: what is kept of each resumable file, and how to go on."""
    out = []
    for spec in todo:
        if not resumable(spec):
            continue
        have = kept(base, spec)
        if 0 < have < spec.size or (have == spec.size and (partials.folder(base) / f"{spec.sha256}.part").exists()):
            out.append(f"kept {human_bytes(have)} of {human_bytes(spec.size)} of {spec.path}; {again} resumes it")
    return out

