"""The Kubernetes API calls `--on kube` makes, over httpx against the REST API (no client library): server-side
apply (fieldManager=metralectl, force), pods by label, a pod's log (tail, capped), events, delete by name, and a
GET through the API server's service proxy. Every answer is read capped (seams/bounded.py); the server's own
words reach an error only escaped (safetext.clean) and cut short."""

from __future__ import annotations

import json
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
TIMEOUT_S = 15.0
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


class KubeClient:
    def __init__(self, config: KubeConfig, timeout_s: float = TIMEOUT_S) -> None:
        import httpx

        headers = {"Accept": "application/json", "User-Agent": "metralectl"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self.config = config
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
        answer = json.loads(data)
        return answer if isinstance(answer, dict) else {}

    def objects(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        prefix, plural = KINDS[kind] if kind in KINDS else ("/api/v1", kind)
        data = self._call("GET", f"{prefix}/namespaces/{quote(namespace)}/{plural}",
                          params={"labelSelector": selector}, what=f"list {plural}")
        items = json.loads(data).get("items")
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.objects("pods", namespace, selector)

    def events(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        data = self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/events",
                          params={"fieldSelector": f"involvedObject.name={pod}"}, what="list events")
        items = json.loads(data).get("items")
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    def log(self, namespace: str, pod: str, tail: int, *, previous: bool = False) -> list[str]:
        """The last `tail` lines of the pod's engine container (limitBytes asks the server to stop; the read is
        capped whatever it sends)."""
        params = {"container": "engine", "tailLines": str(tail), "limitBytes": str(LOG_LIMIT)}
        if previous:
            params["previous"] = "true"
        data = self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/log", params=params,
                          what="pod log", limit=LOG_LIMIT, accept="text/plain")
        return data.decode("utf-8", "replace").splitlines()

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

        target = f"/api/v1/namespaces/{quote(namespace)}/services/{quote(service)}:{port}/proxy/{path.lstrip('/')}"
        try:
            with self._http.stream("GET", target) as response:
                return response.status_code, bounded.peek(response.iter_bytes(), 4096).decode("utf-8", "replace")
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
                if response.status_code >= 400:
                    body = bounded.peek(response.iter_bytes()).decode("utf-8", "replace")
                    raise _refused(what, response.status_code, body)
                return bounded.httpx_body(response, limit, f"the API server's answer to {what}")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: Exception) -> KubeFailed:
        return KubeFailed(f"the API server at {clean(self.config.server, 200)} (context "
                          f"{clean(self.config.context, 80)}) did not answer: {clean(type(exc).__name__)}: "
                          f"{clean(str(exc), 300)}", "check the cluster is up and the kubeconfig's server and CA")


def object_path(kind: str, namespace: str, name: str) -> str:
    prefix, plural = KINDS[kind]
    return f"{prefix}/namespaces/{quote(namespace)}/{plural}/{quote(name)}"


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
