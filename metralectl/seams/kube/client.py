"""The Kubernetes API calls `--on kube` makes, over httpx against the REST API (no client library): server-side
apply (fieldManager=metralectl, force), pods by label, a pod's log (tail, capped), events, delete by name, and a
GET through the API server's service proxy. Every answer is read capped (seams/bounded.py) and within a deadline
(a stream that never ends stops); an answer that is no JSON object, too deep, or names an object outside the
API's name grammar is exit 65; a redirect is never followed (exit 69, naming where it pointed); the server's own
words reach an error only escaped (safetext.clean) and cut short."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from metralectl.errors import ExitCode, MetralError
from metralectl.safetext import clean
from metralectl.seams import bounded

if TYPE_CHECKING:
    from metralectl.seams.kube.config import KubeConfig

FIELD_MANAGER = "metralectl"
APPLY_TYPE = "application/apply-patch+yaml"
LIST_LIMIT = 16 << 20  # a list of pods or events
LOG_LIMIT = 1 << 20  # a pod's log tail
FOLLOW_LINE_LIMIT = 64 << 10  # one line of a followed log: its rest past this is dropped, so memory stays bounded
TIMEOUT_S = 15.0  # one read
DEADLINE_S = 120.0  # a whole answer: a server that trickles bytes forever is cut here
# a name the API server gives an object (DNS-1123 subdomain): it goes into a URL path, so never '/' or '..'
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# kind -> (API prefix, plural) of what `export kube` renders
KINDS = {
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Service": ("/api/v1", "services"),
    "LeaderWorkerSet": ("/apis/leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
}


class KubeFailed(MetralError):
    """The API server refused a call or could not be reached."""

    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, message: str, hint: str | None = None, *, status: int = 0) -> None:
        super().__init__(message, hint)
        self.status = status


class KubeAnswerInvalid(MetralError):
    """The API server answered something no API server sends: not JSON, too deep, the wrong shape, a bad name."""

    exit_code = ExitCode.DATA


class KubeClient:
    def __init__(self, config: KubeConfig, timeout_s: float = TIMEOUT_S, deadline_s: float = DEADLINE_S) -> None:
        import httpx

        headers = {"Accept": "application/json", "User-Agent": "metralectl"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self.config = config
        self.deadline_s = deadline_s
        self._http = httpx.Client(base_url=config.server, headers=headers, timeout=timeout_s, trust_env=False,
                                  verify=config.ssl_context(), follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the calls
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of one object (JSON is YAML: the body is the object, exactly)."""
        path = object_path(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        data = self._call("PATCH", path, params={"fieldManager": FIELD_MANAGER, "force": "true"},
                          content=json.dumps(obj).encode(), content_type=APPLY_TYPE, what=f"apply {obj['kind']}")
        return _object(data, f"apply {obj['kind']}")

    def objects(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        prefix, plural = KINDS[kind] if kind in KINDS else ("/api/v1", kind)
        data = self._call("GET", f"{prefix}/namespaces/{quote(namespace, safe='')}/{plural}",
                          params={"labelSelector": selector}, what=f"list {plural}")
        return _items(data, f"list {plural}")

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.objects("pods", namespace, selector)

    def events(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        data = self._call("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/events",
                          params={"fieldSelector": f"involvedObject.name={checked_name(pod)}"}, what="list events")
        return _items(data, "list events")

    def log(self, namespace: str, pod: str, tail: int, *, previous: bool = False) -> list[str]:
        """The last `tail` lines of the pod's engine container (limitBytes asks the server to stop; the read is
        capped whatever it sends)."""
        params = {"container": "engine", "tailLines": str(tail), "limitBytes": str(LOG_LIMIT)}
        if previous:
            params["previous"] = "true"
        data = self._call("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{checked_name(pod)}/log",
                          params=params, what="pod log", limit=LOG_LIMIT, accept="text/plain")
        return data.decode("utf-8", "replace").splitlines()

    def follow_log(self, namespace: str, pod: str, tail: int) -> Iterator[str]:
        """The pod's engine container's last `tail` lines, then each line as it is written, until the stream ends
        (the container exited, or the server closed it). No deadline and no read timeout: an engine may say nothing
        for hours. A line is kept to FOLLOW_LINE_LIMIT bytes; the rest of a longer one is dropped, said at its end."""
        import httpx

        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{checked_name(pod)}/log"
        params = {"container": "engine", "tailLines": str(tail), "follow": "true"}
        try:
            with self._http.stream("GET", path, params=params, headers={"Accept": "text/plain"},
                                   timeout=httpx.Timeout(TIMEOUT_S, read=None)) as response:
                _checked(response, "follow pod log")
                yield from _lines(response.iter_bytes(), FOLLOW_LINE_LIMIT)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete one object (its pods follow: propagationPolicy Background). False: it was already gone."""
        try:
            self._call("DELETE", object_path(kind, namespace, name), params={"propagationPolicy": "Background"},
                       what=f"delete {kind}")
        except KubeFailed as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def proxy_get(self, namespace: str, service: str, port: int, path: str) -> tuple[int, str]:
        """GET `path` of a Service through the API server's service proxy: (status, the body's first bytes)."""
        import httpx

        target = (f"/api/v1/namespaces/{quote(namespace, safe='')}/services/{checked_name(service)}:{port}/proxy/"
                  f"{path.lstrip('/')}")
        try:
            with self._http.stream("GET", target) as response:
                body = bounded.peek(self._timed(response.iter_bytes(), "the service proxy"), 4096)
                return response.status_code, body.decode("utf-8", "replace")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _call(self, method: str, path: str, *, params: dict[str, str] | None = None, content: bytes | None = None,
              content_type: str | None = None, what: str, limit: int = LIST_LIMIT, accept: str | None = None) -> bytes:
        import httpx

        headers = {}
        if content_type:
            headers["Content-Type"] = content_type
        if accept:
            headers["Accept"] = accept
        try:
            with self._http.stream(method, path, params=params, content=content, headers=headers) as response:
                _checked(response, what)
                return bounded.read_chunks(self._timed(response.iter_bytes(), what), limit,
                                           f"the API server's answer to {what}")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _timed(self, chunks: Iterator[bytes], what: str) -> Iterator[bytes]:
        """The chunks of an answer until the deadline: one read has its own timeout, the whole answer this one."""
        end = time.monotonic() + self.deadline_s
        for chunk in chunks:
            if time.monotonic() > end:
                raise KubeFailed(f"{what}: the API server kept sending for more than {self.deadline_s:.0f} s; "
                                 "metralectl stopped reading", "check what answers at the kubeconfig's server")
            yield chunk

    def _unreachable(self, exc: Exception) -> KubeFailed:
        return KubeFailed(f"the API server at {clean(self.config.server, 200)} (context "
                          f"{clean(self.config.context, 80)}) did not answer: {clean(type(exc).__name__)}: "
                          f"{clean(str(exc), 300)}", "check the cluster is up and the kubeconfig's server and CA")


def _checked(response: Any, what: str) -> None:
    """A refusal (4xx, 5xx: its Status message, escaped) or a redirect (never followed: the token would go with it)
    as KubeFailed; a 2xx passes."""
    if response.status_code >= 400:
        body = bounded.peek(response.iter_bytes()).decode("utf-8", "replace")
        raise _refused(what, response.status_code, body)
    if response.status_code >= 300:
        where = clean(response.headers.get("location", "nowhere"), 200)
        raise KubeFailed(f"{what}: the API server answered {response.status_code}, a redirect to {where}; "
                         "metralectl does not follow redirects of the API server",
                         "point the kubeconfig's server at the API server itself", status=response.status_code)


def _lines(chunks: Iterator[bytes], limit: int) -> Iterator[str]:
    """The lines of a byte stream as they complete, each cut to `limit` bytes (the rest dropped up to its newline,
    and the cut said); an unterminated last line too."""
    line, dropped = bytearray(), 0
    for chunk in chunks:
        at = 0
        while at < len(chunk):
            end = chunk.find(b"\n", at)
            piece = chunk[at:] if end < 0 else chunk[at:end]
            room = limit - len(line)
            line += piece[:room]
            dropped += max(0, len(piece) - room)
            if end < 0:
                break
            yield _line_text(line, dropped)
            line, dropped, at = bytearray(), 0, end + 1
    if line or dropped:
        yield _line_text(line, dropped)


def _line_text(line: bytearray, dropped: int) -> str:
    text = line.decode("utf-8", "replace")
    return f"{text} [... {dropped} more bytes of this line dropped]" if dropped else text


def object_path(kind: str, namespace: str, name: str) -> str:
    prefix, plural = KINDS[kind]
    return f"{prefix}/namespaces/{quote(namespace, safe='')}/{plural}/{checked_name(name)}"


def checked_name(name: object) -> str:
    """An object's name as the API server gives it (a DNS-1123 subdomain), before it goes into a URL path."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise KubeAnswerInvalid(f"the API server named an object {clean(str(name), 80)!r}, which is no Kubernetes "
                                "name (lower-case letters, digits, '-' and '.')",
                                "check what answers at the kubeconfig's server")
    return name


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError), or nested past Python's stack
        value = None
    if not isinstance(value, dict):
        raise KubeAnswerInvalid(f"the API server's answer to {what} is not a JSON object ({len(data)} bytes)",
                                "check what answers at the kubeconfig's server")
    return value


def _items(data: bytes, what: str) -> list[dict[str, Any]]:
    items = _object(data, what).get("items")
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _refused(what: str, status: int, body: str) -> KubeFailed:
    """The API server's Status (its message, escaped and cut short), with the fix its code implies."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    said = clean(str(message if isinstance(message, str) else body), 300)
    hint = {401: "the kubeconfig's credentials were refused: renew the token or certificate",
            403: "the user lacks RBAC rights for this: a Role granting it in the namespace",
            404: "the resource or namespace does not exist (a LeaderWorkerSet needs LWS installed)"}.get(
        status, "see the API server's words above")
    return KubeFailed(f"{what}: the API server answered {status}: {said}", hint, status=status)
