"""The Hugging Face Hub (or a mirror: HF_ENDPOINT) over HTTP on metralectl's own terms, and what it says as our
errors — no huggingface_hub here.

What a server says is data: its listing is read capped (MAX_LISTING_BYTES) and checked name by name by the
caller (weights.hub_listing); its headers name nothing on disk (ETag, X-Repo-Commit and X-Linked-Etag are
never used as paths: huggingface_hub's downloader does, which is why metralectl downloads itself).
Redirects are followed by hand: at most MAX_REDIRECTS, never from https to anything else, and the
token (Authorization) goes to the endpoint's own host only, never to the CDN it redirects to.
httpx is imported where it is used: `list` reaches the modules that import this one.

hub_error turns what went wrong (the Hub's answer, huggingface_hub's exceptions, the network, the disk) into a
WeightsError with a remedy. huggingface_hub's classes are recognised by name along the MRO rather than
imported: they moved between huggingface_hub.utils and huggingface_hub.errors across versions, and this
keeps the only huggingface_hub import in weights.py.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urljoin, urlsplit

from metralectl import paths
from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean

if TYPE_CHECKING:
    import httpx


class WeightsError(MetralError):
    """Weights are missing, unverifiable, or cannot be fetched."""

    exit_code = ExitCode.FAILED

    network = False  # the Hub could not be reached (a verified local copy may still do)


def _is(exc: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(exc).__mro__)


_NETWORK_NAMES = ("ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException", "ConnectionError",
                  "OfflineModeIsEnabled", "ProxyError", "NetworkError")
_BROKEN_TRANSFER = ("RemoteProtocolError", "ReadError", "ChunkedEncodingError", "IncompleteRead")


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cursor: BaseException | None = exc
    while cursor is not None and cursor not in out:
        out.append(cursor)
        cursor = cursor.__cause__ or cursor.__context__
    return out


def hub_error(exc: BaseException, repo: str, revision: str, token: bool, file: str | None = None,
              endpoint: str | None = None) -> BaseException:
    """A WeightsError with a remedy for what the Hub (or the network, or the disk) said; else exc itself."""
    import errno

    page = f"https://huggingface.co/{repo}"
    what = f"{repo}/{file}" if file else f"{repo}@{revision}"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    # the Hub's (or a mirror's) own words: X-Error-Message, and huggingface_hub adds the body's error on a new line
    server_says = clean(str(getattr(exc, "server_message", None) or ""), 300)
    if isinstance(exc, MetralError):
        return exc
    if isinstance(exc, UnicodeEncodeError) or _is(exc, "LocalProtocolError"):  # a header the client will not send
        return WeightsError(
            "a request to the Hub could not be sent: the Hugging Face token (HF_TOKEN, or the one `hf auth login` "
            "saved) holds a character no token has (not ASCII, a line break or another control character)",
            "set HF_TOKEN to the token exactly as https://huggingface.co/settings/tokens shows it (hf_ and letters)",
            exit_code=ExitCode.DATA)
    if _is(exc, "GatedRepoError"):
        if not token:
            return WeightsError(
                f"{repo} is a gated repository and no Hugging Face token is set (the Hub answered {status})",
                f"open {page}, log in and accept its conditions; create a read token at "
                "https://huggingface.co/settings/tokens; then `export HF_TOKEN=hf_...` (or `hf auth login`) and pull again")
        return WeightsError(
            f"{repo} is a gated repository and your token has not been granted access (the Hub answered {status})",
            f"open {page} logged in as the token's owner (`hf auth whoami` says who) and accept or request "
            "access; approval can take a while on some repositories")
    if status == 401 and ("Invalid credentials" in server_says or (token and not _is(exc, "RepositoryNotFoundError"))):
        return WeightsError("the Hugging Face token was refused (401: invalid or revoked credentials)",
                            "fix HF_TOKEN (or the token saved by `hf auth login`): create one at "
                            "https://huggingface.co/settings/tokens; for a public repo, `unset HF_TOKEN` also works")
    if _is(exc, "RepositoryNotFoundError"):
        why = "it is private and your token cannot see it" if token else "it is private and no token is set"
        return WeightsError(f"no repository {repo} on the Hub (or {why})",
                            "check checkpoint.repo in the recipe; for a private repo set HF_TOKEN to a token that can read it")
    if _is(exc, "RevisionNotFoundError"):
        return WeightsError(f"{repo} has no revision {revision} on the Hub",
                            "the recipe pins a commit the Hub does not have (history rewritten?); fix checkpoint.revision")
    if status == 403:
        return WeightsError(f"the Hub refused access to {what} (403{': ' + server_says if server_says else ''})",
                            "a fine-grained token needs read access to this repository; check it at "
                            "https://huggingface.co/settings/tokens")
    if status == 429:
        return WeightsError("the Hub is rate-limiting these downloads (429)",
                            "wait a few minutes and pull again; an HF_TOKEN raises the limits")
    if status is not None and status >= 500:
        return WeightsError(f"the Hub failed while serving {what} ({status})", "retry later; https://status.huggingface.co",
                            exit_code=ExitCode.UNAVAILABLE)
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return WeightsError(f"{what}: the download ended at a different size than the Hub announced",
                            "pull again (that file starts afresh); if it repeats, a proxy is cutting transfers")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return WeightsError(f"the disk filled up while downloading {what}",
                            "free space or point HF_HUB_CACHE at a larger disk; finished files are kept")
    if isinstance(exc, PermissionError):
        return WeightsError(f"permission denied writing the Hugging Face cache: {clean(str(exc.filename or exc), 300)}",
                            f"if it belongs to root: sudo chown -R $USER: {paths.hf_hub_cache()}")
    names = {type(e).__name__ for e in _chain(exc)}
    if isinstance(exc, OSError) and not names & set(_BROKEN_TRANSFER + _NETWORK_NAMES):
        return WeightsError(f"{what}: the Hugging Face cache could not be changed: {clean(str(exc), 300)}",
                            "fix or remove that path (is another program writing the cache?) and pull again")
    if names & set(_BROKEN_TRANSFER):
        err = WeightsError(f"the download of {what} kept breaking off mid-transfer "
                           f"({type(_chain(exc)[0]).__name__}: {clean(str(_chain(exc)[0]), 200)})",
                           "pull again to continue (finished files are kept); if it repeats, check proxies "
                           "and the link's stability")
        err.network, err.exit_code = True, ExitCode.UNAVAILABLE
        return err
    if names & set(_NETWORK_NAMES) or _is(exc, "LocalEntryNotFoundError"):
        err = WeightsError(f"cannot reach the Hugging Face Hub at {endpoint or 'https://huggingface.co'} "
                           f"({type(_chain(exc)[-1]).__name__})",
                           "check the network / proxy (HTTPS_PROXY) and HF_ENDPOINT, and that HF_HUB_OFFLINE is not "
                           "set; pull again to continue: finished files are kept")
        err.network, err.exit_code = True, ExitCode.UNAVAILABLE  # docs/exit-codes.md: 69, a service not reached
        return err
    if isinstance(exc, (KeyError, TypeError, ValueError, AttributeError, IndexError)) and _raised_in_hub(exc):
        return WeightsError(  # huggingface_hub read an answer no Hub sends (a mirror's, a proxy's)
            f"the Hub at {clean(endpoint or 'https://huggingface.co', 200)} answered for {what} with something a "
            f"Hub does not send ({type(exc).__name__}: {clean(str(exc), 200)})",
            "check HF_ENDPOINT (a mirror must answer as the Hub does) and any proxy in between",
            exit_code=ExitCode.DATA)
    return exc


def _raised_in_hub(exc: BaseException) -> bool:
    """Whether `exc` was raised inside huggingface_hub (reading what the server sent), not in our own code."""
    frame, last = exc.__traceback__, ""
    while frame is not None:
        last, frame = frame.tb_frame.f_code.co_filename, frame.tb_next
    return "huggingface_hub" in last


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
    """An HTTP error answer, shaped for hub_error (it reads .response.status_code,
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
