"""HTTP to a Hugging Face Hub or mirror (HF_ENDPOINT), on metralectl's own terms — no huggingface_hub here.

What a server says is data: its listing is read capped (MAX_LISTING_BYTES) and checked name by name by the
caller (weights.hub_listing); its headers name nothing on disk (ETag, X-Repo-Commit and X-Linked-Etag are
never used as paths: huggingface_hub's downloader does, which is why metralectl downloads itself).
Redirects are followed by hand: at most MAX_REDIRECTS, never from https to anything else, and the
token (Authorization) goes to the endpoint's own host only, never to the CDN it redirects to.
httpx is imported where it is used: `list` reaches the modules that import this one.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urljoin, urlsplit

from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean
from metralectl.seams.weights_errors import WeightsError

if TYPE_CHECKING:
    import httpx

MAX_REDIRECTS = 10
MAX_LISTING_BYTES = 64 << 20  # a model-info answer: 100k files fit
TIMEOUT_S = 30.0
DEFAULT_ENDPOINT = "https://huggingface.co"
_REDIRECTS = (301, 302, 303, 307, 308)


class HubDataError(WeightsError):
    """The server answered with something no Hub sends (a redirect loop, a lying size or range, an answer
    that is not a listing): exit 65, nothing placed."""

    exit_code = ExitCode.DATA


class HubHTTPError(Exception):
    """An HTTP error answer, shaped for weights_errors.hub_error (it reads .response.status_code,
    .server_message and the class names huggingface_hub uses)."""

    def __init__(self, response: Any, message: str) -> None:
        super().__init__(message)
        self.response = response
        self.server_message = clean(response.headers.get("X-Error-Message", ""), 300)


class GatedRepoError(HubHTTPError):
    pass


class RepositoryNotFoundError(HubHTTPError):
    pass


class RevisionNotFoundError(HubHTTPError):
    pass


class EntryNotFoundError(HubHTTPError):
    pass


class OfflineModeIsEnabled(ConnectionError):
    """HF_HUB_OFFLINE is set: the Hub is not asked (hub_error counts it as unreachable)."""


_BY_CODE: dict[str, type[HubHTTPError]] = {"GatedRepo": GatedRepoError, "RepoNotFound": RepositoryNotFoundError,
                                           "RevisionNotFound": RevisionNotFoundError,
                                           "EntryNotFound": EntryNotFoundError}


def endpoint() -> str:
    """HF_ENDPOINT read now, not at import (tests and mirrors set it late); the Hub without it."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def endpoint_named() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def listing_url(repo: str, revision: str) -> str:
    """`repo` passed the repo grammar; the revision is quoted whole (a branch may hold a slash)."""
    return f"{endpoint()}/api/models/{repo}/revision/{quote(revision, safe='')}?blobs=true"


def file_url(repo: str, commit: str, path: str) -> str:
    """The resolve URL of a checked repo path at a checked commit."""
    return f"{endpoint()}/{repo}/resolve/{commit}/{quote(path)}"


def checked_headers(sent: dict[str, str]) -> dict[str, str]:
    """`sent` (the token, as huggingface_hub builds it) with no compression asked for: the bytes on disk are the
    bytes on the wire. A header that cannot be sent as it is (a token with a newline in it) is refused, not
    sent (httpx would raise an internal error)."""
    out = {**sent, "Accept-Encoding": "identity"}
    for key, value in out.items():
        if not (isinstance(value, str) and value.isascii() and value.isprintable()):
            what = "the Hugging Face token (HF_TOKEN, or the one `hf auth login` saved)" if key == "Authorization" \
                else f"the {key} header"
            raise WeightsError(f"{what} holds characters the {key} header cannot carry (not ASCII, a line break or "
                               "another control character)",
                               "fix HF_TOKEN or the token file (`hf auth login`); nothing was sent",
                               exit_code=ExitCode.DATA)
    return out


def client() -> httpx.Client:
    import httpx

    return httpx.Client(timeout=httpx.Timeout(TIMEOUT_S), follow_redirects=False)


def open_get(http: httpx.Client, url: str, sent: dict[str, str], head_first: bool = False) -> httpx.Response:
    """GET with redirects followed by hand (streamed; the caller closes it). `head_first`: ask the first URL
    with HEAD and GET only where it leads (one GET per file, as huggingface_hub does); an error answer to the
    HEAD is returned as it is (its status and headers say what went wrong)."""
    origin = urlsplit(url)
    hops = 0
    if head_first:
        response = _send(http, "HEAD", url, sent, origin)
        response.close()
        location = response.headers.get("Location")
        if response.status_code in _REDIRECTS and location is not None:
            url, hops = _next(url, location), 1
        elif response.status_code >= 400:
            return response
    for _ in range(hops, MAX_REDIRECTS + 1):
        response = _send(http, "GET", url, sent, origin)
        location = response.headers.get("Location")
        if response.status_code not in _REDIRECTS or location is None:
            return response
        response.close()
        url = _next(url, location)
    raise HubDataError(f"more than {MAX_REDIRECTS} redirects fetching {clean(url, 200)} (a redirect loop); nothing "
                       "was placed", _CHECK)


def _send(http: httpx.Client, method: str, url: str, sent: dict[str, str], origin: Any) -> httpx.Response:
    """One request; the token and cookies only to the origin's own scheme and host."""
    import httpx

    here = urlsplit(url)
    send = sent if (here.scheme, here.netloc) == (origin.scheme, origin.netloc) else {
        k: v for k, v in sent.items() if k.lower() not in ("authorization", "cookie")}
    try:
        return http.send(http.build_request(method, url, headers=send), stream=True)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise HubDataError(f"the server sent a URL that cannot be fetched: {clean(url, 200)!r} "
                           f"({clean(str(exc), 120)}); nothing was placed", _CHECK) from None


_CHECK = "check HF_ENDPOINT (unset it for https://huggingface.co) and any proxy in between"


def _next(url: str, location: str) -> str:
    target = urljoin(url, location)
    scheme = urlsplit(target).scheme
    if scheme not in ("http", "https") or (urlsplit(url).scheme == "https" and scheme != "https"):
        raise HubDataError(f"the server redirected {clean(url, 120)} to {clean(target, 120)!r}: from https only to "
                           "https, and only over http(s); nothing was placed", _CHECK)
    return target


def http_error(response: httpx.Response, path: str) -> HubHTTPError:
    response.close()
    cls = _BY_CODE.get(response.headers.get("X-Error-Code", ""), HubHTTPError)
    says = clean(response.headers.get("X-Error-Message", ""), 200)
    return cls(response, f"{response.status_code}{f' ({says})' if says else ''}")


def read_capped(response: httpx.Response, limit: int, what: str) -> bytes:
    """The whole body, refused beyond `limit` bytes whatever Content-Length says (read while streaming)."""
    chunks: list[bytes] = []
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > limit:
            response.close()
            raise HubDataError(f"{what}: the server's answer is larger than {limit} bytes; not read further", _CHECK)
        chunks.append(chunk)
    return b"".join(chunks)


def get_json(repo: str, revision: str, sent: dict[str, str]) -> object:
    """The model-info answer for `repo` at `revision` (files with sizes and hashes), parsed; HubHTTPError on an
    HTTP error, HubDataError when it is no JSON or too large, httpx's errors when unreachable."""
    if offline():
        raise OfflineModeIsEnabled("HF_HUB_OFFLINE is set")
    what = f"the listing of {repo}@{clean(revision, 60)}"
    with client() as http:
        response = open_get(http, listing_url(repo, revision), sent)
        try:
            if response.status_code != 200:
                raise http_error(response, "")
            body = read_capped(response, MAX_LISTING_BYTES, what)
        finally:
            response.close()
    try:
        data: object = json.loads(body)
        return data
    except ValueError:
        raise HubDataError(f"{what}: the server's answer is not JSON; nothing was written", _CHECK) from None


def content_range(value: str) -> tuple[int, int, int] | None:
    """`bytes START-END/TOTAL` -> (START, END, TOTAL); None unless it is exactly that, in order."""
    unit, _, spec = value.partition(" ")
    span, _, total = spec.partition("/")
    start, _, end = span.partition("-")
    if unit != "bytes" or not all(x.isdigit() and x.isascii() for x in (start, end, total)):
        return None
    first, last, whole = int(start), int(end), int(total)
    return (first, last, whole) if first <= last < whole else None


def fail_data(message: str) -> MetralError:
    return HubDataError(message, "pull again later; if it repeats, the Hub, a mirror or a proxy is sending "
                        "something else than the file (check HF_ENDPOINT)")
