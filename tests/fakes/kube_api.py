"""A recorded-request fake of the Kubernetes API server: a real HTTP(S) server on loopback that answers the calls
`--on kube` makes the way the API server does (apply returns the object, pods with Ready conditions, logs, events,
delete, the service proxy) and records every request. What the pods do is the test's `pods` setting:
"ready" (Ready as soon as listed), "stuck" (ImagePullBackOff), "never" (Pending). Hostile answers on request."""

from __future__ import annotations

import json
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeKube:
    pods: str = "ready"
    health: int = 200
    log: str = "INFO engine up\n"
    # what `logs -f` streams (follow=true): each piece written and flushed, this long apart (s), then the stream ends
    follow: list[bytes] = field(default_factory=list)
    follow_gap_s: float = 0.05
    follow_gate: threading.Event | None = None  # set by the test: only then is the last piece written
    event: str = "Failed to pull image"
    huge_pods: bool = False
    requests: list[Request] = field(default_factory=list)
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (plural, ns, name)
    lws_installed: bool = False
    refuse_apply: str | None = None  # a Status message to refuse every apply with (403)
    # pods of a deleted object stay listed (terminating) for this many pod lists; -1: for ever (a node that went away)
    terminating_lists: int = 0
    lingering: dict[str, tuple[dict[str, str], int]] = field(default_factory=dict)  # pod name -> (labels, lists left)

    def start(self, context: ssl.SSLContext | None = None) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def finish(self) -> None:  # a client that went mid-stream (Ctrl-C on `logs -f`): no traceback on stderr
                try:
                    super().finish()
                except OSError:
                    pass

            def _answer(self, status: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(self.command, unquote(url.path), {k: v[0] for k, v in parse_qs(url.query).items()},
                                  {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length))
                fake.requests.append(request)
                status, body, ctype = fake.answer(request)
                if request.path.endswith("/log") and request.query.get("follow") == "true" and status == 200:
                    self.send_response(200)  # HTTP/1.0: the body runs until the connection closes, as a follow does
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    try:
                        pieces = [body, *fake.follow]
                        for i, piece in enumerate(pieces):
                            if i == len(pieces) - 1 and fake.follow_gate is not None:
                                fake.follow_gate.wait(60)
                            self.wfile.write(piece)
                            self.wfile.flush()
                            time.sleep(fake.follow_gap_s)
                    except OSError:
                        pass
                    return
                if body is None:  # a huge answer, streamed
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    try:
                        self.wfile.write(b'{"items": [{"x": "')
                        for _ in range(20):  # 20 MiB, more than metralectl reads of a list
                            self.wfile.write(b"A" * (1 << 20))
                    except OSError:
                        pass
                    return
                self._answer(status, body, ctype)

            do_GET = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # bound here: the port is ours from now
        scheme = "http"
        if context is not None:
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, r: Request) -> tuple[int, Any, str]:
        parts = r.path.strip("/").split("/")
        if "proxy" in parts:
            return self.health, b"ok" if self.health == 200 else b"loading", "text/plain"
        if r.path.endswith("/log"):
            return 200, self.log.encode(), "text/plain"
        if parts[-1] == "events":
            return 200, {"kind": "EventList", "items": [{"reason": "Failed", "message": self.event}]}, "application/json"
        if parts[-1] == "pods" and r.method == "GET":
            if self.huge_pods:
                return 200, None, ""
            return 200, {"kind": "PodList", "items": self._pods(r.query.get("labelSelector", ""))}, "application/json"
        # /api(s)/.../namespaces/NS/PLURAL[/NAME]
        at = parts.index("namespaces")
        ns, plural = parts[at + 1], parts[at + 2]
        name = parts[at + 3] if len(parts) > at + 3 else None
        if plural == "leaderworkersets" and not self.lws_installed:
            return 404, {"kind": "Status", "message": "the server could not find the requested resource",
                         "code": 404}, "application/json"
        if r.method == "PATCH" and name and self.refuse_apply is not None:
            return 403, {"kind": "Status", "message": self.refuse_apply, "code": 403}, "application/json"
        if r.method == "PATCH" and name:
            obj = json.loads(r.body)
            stored = {**obj, "metadata": {**obj["metadata"], "uid": "u-" + name, "resourceVersion": "1"}}
            self.objects[(plural, ns, name)] = stored
            return 200, stored, "application/json"
        if r.method == "DELETE" and name:
            before = dict(self._templates())
            if self.objects.pop((plural, ns, name), None) is None:
                return 404, {"kind": "Status", "message": f'{plural} "{name}" not found', "code": 404}, \
                    "application/json"
            if self.terminating_lists:
                gone = {pod: labels for pod, labels in before.items() if pod not in dict(self._templates())}
                self.lingering.update({pod: (labels, self.terminating_lists) for pod, labels in gone.items()})
            return 200, {"kind": "Status", "status": "Success"}, "application/json"
        if r.method == "GET" and name is None:
            wanted = dict(kv.split("=", 1) for kv in r.query.get("labelSelector", "").split(",") if kv)
            items = [o for (p, n, _), o in self.objects.items() if p == plural and n == ns and
                     all(o["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
            return 200, {"items": items}, "application/json"
        return 404, {"kind": "Status", "message": "not faked"}, "application/json"

    def _templates(self) -> list[tuple[str, dict[str, Any]]]:
        """(pod name, its labels) of what the controllers would make: a Deployment's one pod, an LWS's leader
        and workers (LWS's names: NAME-0, NAME-0-1...)."""
        out = []
        for (plural, _, name), obj in self.objects.items():
            if plural == "deployments":
                out.append((name + "-7d9f-abcde", obj["spec"]["template"]["metadata"]["labels"]))
            elif plural == "leaderworkersets":
                group = obj["spec"]["leaderWorkerTemplate"]
                index = "leaderworkerset.sigs.k8s.io/worker-index"  # the rank label LWS's controller adds
                out.append((name + "-0", {**group["leaderTemplate"]["metadata"]["labels"], index: "0"}))
                out.extend((f"{name}-0-{i}", {**group["workerTemplate"]["metadata"]["labels"], index: str(i)})
                           for i in range(1, group["size"]))
        return out

    def _pods(self, selector: str) -> list[dict[str, Any]]:
        pods = []
        for pod_name, (labels, left) in list(self.lingering.items()):  # terminating: listed, then gone
            wanted = dict(kv.split("=", 1) for kv in selector.split(",") if kv)
            if left == 0 or not all(labels.get(k) == v for k, v in wanted.items()):
                continue
            self.lingering[pod_name] = (labels, left - 1 if left > 0 else left)
            pods.append({"metadata": {"name": pod_name, "labels": labels, "deletionTimestamp": "2026-12-04T00:00:00Z"},
                         "spec": {"nodeName": "spark-1"}, "status": {"phase": "Running"}})
        for pod_name, labels in self._templates():
            wanted = dict(kv.split("=", 1) for kv in selector.split(",") if kv)
            if not all(labels.get(k) == v for k, v in wanted.items()):
                continue
            ready = self.pods == "ready"
            status: dict[str, Any] = {"phase": "Running" if ready else "Pending",
                                      "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
            if self.pods == "stuck":
                status["containerStatuses"] = [{"name": "engine", "state": {"waiting": {
                    "reason": "ImagePullBackOff", "message": "Back-off pulling image \x1b]0;owned\x07"}}}]
            pods.append({"metadata": {"name": pod_name, "labels": labels},
                         "spec": {"nodeName": "spark-1"}, "status": status})
        return pods
