"""huggingface_hub's exceptions as an operator's errors, each with a remedy.

Classes are recognised by name along the MRO rather than imported: they moved between
huggingface_hub.utils and huggingface_hub.errors across versions, and this keeps the only
huggingface_hub import in weights.py.
"""

from __future__ import annotations

from metralectl import paths
from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean


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
