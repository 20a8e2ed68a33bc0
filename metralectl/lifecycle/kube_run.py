"""`run/ps/logs/stop --on kube[:CONTEXT]`: the objects `export kube` renders, applied and watched through the
Kubernetes API (seams/kube). Not a ContainerRuntime: a cluster schedules pods, it does not start containers on
an endpoint, so this is a small use case of its own (docs/kubernetes.md, "Run on a cluster").

run: server-side apply of every object, in export's order; then the pods Ready (the kubelet's probes: GET
/health on the node); then the engine's /health through the API server's service proxy, which proves the
Service reaches it. A failure (a pod that cannot start, the timeout, Ctrl-C) deletes what was applied and says
why: the pod's events and the container's last log lines, escaped."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from metralectl.core.labels import LABEL_RECIPE
from metralectl.errors import ExitCode, MetralError
from metralectl.lifecycle.kube_export import INSTANCE_LABEL, LOOPBACK, MANAGED_BY_LABEL, KubeOptions, \
    kube_manifests, label_value
from metralectl.safetext import clean
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.seams.kube.client import KubeClient

MANAGED = f"{MANAGED_BY_LABEL}=metralectl"
STUCK = {"ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff", "CreateContainerConfigError", "InvalidImageName",
         "CreateContainerError", "RunContainerError"}
POLL_S = 2.0
LOG_LINES = 20


@dataclass
class Ran:
    name: str
    namespace: str
    context: str
    pods: list[str]
    health_url: str
    applied: list[str] = field(default_factory=list)


def parse_on(on: str) -> str | None:
    """`kube` or `kube:CONTEXT` -> the context (None: the kubeconfig's current one)."""
    kind, _, context = on.partition(":")
    if kind != "kube" or (":" in on and not context):
        raise MetralError(f"--on {clean(on, 80)!r}: the one target is kube or kube:CONTEXT",
                          "--on kube (the kubeconfig's current context) or --on kube:CONTEXT", exit_code=ExitCode.USAGE)
    return context or None


def recipe_selector(recipe_name: str | None) -> str:
    return MANAGED if recipe_name is None else f"{MANAGED},{LABEL_RECIPE}={label_value(recipe_name)}"


def run(client: KubeClient, catalog: Catalog, recipe: Recipe, namespace: str, timeout_s: float,
        progress: Callable[[str], None], *, sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S, options: KubeOptions | None = None) -> Ran:
    if recipe.resources.bind in LOOPBACK:
        raise MetralError(f"{recipe.name} binds {recipe.resources.bind}: on a node's host network neither the Service "
                          "nor the API server's proxy reaches it, so readiness could not be judged",
                          "--set resources.bind=0.0.0.0 with auth (serve require-auth) or --set "
                          "resources.expose-acknowledged=true", exit_code=ExitCode.USAGE)
    base = options or KubeOptions()
    objects = kube_manifests(catalog, recipe, KubeOptions(namespace=namespace, roce_interface=base.roce_interface,
                                                          rdma_device=base.rdma_device, rdma=base.rdma, gpus=base.gpus))
    name = objects[0]["metadata"]["name"]
    port = objects[-1]["spec"]["ports"][0]["port"]
    health = catalog.engines[recipe.engine].readiness.health_path
    ran = Ran(name, namespace, client.config.context, [], f"{client.config.server}/api/v1/namespaces/{namespace}/"
              f"services/{name}:{port}/proxy{health}")
    from metralectl.seams.kube.client import KubeFailed

    sent = 0  # objects sent: one whose apply got no answer (a timeout) may have been applied, and is undone too
    try:
        for obj in objects:
            sent += 1
            try:
                client.apply(obj)
            except KubeFailed as exc:
                if exc.status:  # the API server answered: refused, not applied
                    sent -= 1
                raise
            ran.applied.append(obj["kind"])
            progress(f"applied {obj['kind']} {namespace}/{name}")
        deadline = clock() + timeout_s
        ran.pods = _wait_ready(client, namespace, name, recipe.resources.world_size, deadline, progress, sleep, clock,
                               poll_s)
        _wait_health(client, namespace, name, port, health, deadline, progress, sleep, clock, poll_s)
    except BaseException as exc:
        why = _why(client, namespace, name) if ran.applied and not isinstance(exc, KeyboardInterrupt) else []
        _undo(client, objects[:sent], progress)
        if isinstance(exc, MetralError) and why:
            exc.message = exc.message + "\n" + "\n".join(why)
            exc.args = (exc.message,)
        raise
    progress(f"{name} is ready: /health answered through the Service")
    return ran


def _wait_ready(client: KubeClient, namespace: str, name: str, count: int, deadline: float,
                progress: Callable[[str], None], sleep: Callable[[float], None], clock: Callable[[], float],
                poll_s: float) -> list[str]:
    said = ""
    while True:
        pods = client.pods(namespace, f"{INSTANCE_LABEL}={name}")
        ready = [p for p in pods if _ready(p)]
        for pod in pods:
            stuck = _stuck(pod)
            if stuck:
                raise MetralError(f"pod {clean(_name(pod), 80)} cannot start: {stuck}",
                                  "the events and log lines below say why; fix and run again",
                                  exit_code=ExitCode.FAILED)
        line = f"pods ready: {len(ready)} of {count}"
        if line != said:
            progress(line)
            said = line
        if len(ready) >= count:
            return [_name(p) for p in ready]
        if clock() >= deadline:
            raise MetralError(f"{name}: {len(ready)} of {count} pods ready when the boot timeout ran out",
                              "see the events below; --boot-timeout S allows longer", exit_code=ExitCode.FAILED)
        sleep(poll_s)


def _wait_health(client: KubeClient, namespace: str, name: str, port: int, path: str, deadline: float,
                 progress: Callable[[str], None], sleep: Callable[[float], None], clock: Callable[[], float],
                 poll_s: float) -> None:
    progress(f"GET {path} through the API server's service proxy")
    while True:
        status, body = client.proxy_get(namespace, name, port, path)
        if 200 <= status < 300:
            return
        if clock() >= deadline:
            raise MetralError(f"{name}: the pods are ready but {path} through the Service answered {status} "
                              f"({clean(body, 200)}) when the boot timeout ran out",
                              "the Service must reach the engine: the recipe's bind address on the node",
                              exit_code=ExitCode.FAILED)
        sleep(poll_s)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _name(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


def _stuck(pod: dict[str, Any]) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = (status or {}).get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in STUCK:
            return clean(f"{waiting['reason']}: {waiting.get('message', '')}", 300)
        terminated = state.get("terminated")
        if terminated:
            return clean(f"the engine exited {terminated.get('exitCode')} ({terminated.get('reason', '')})", 300)
    return None


def _why(client: KubeClient, namespace: str, name: str) -> list[str]:
    """The pods' warning events and the engine's last log lines, escaped (best effort: never hides the failure)."""
    lines: list[str] = []
    try:
        for pod in client.pods(namespace, f"{INSTANCE_LABEL}={name}"):
            pod_name = _name(pod)
            for event in client.events(namespace, pod_name)[-5:]:
                lines.append(clean(f"  event {pod_name}: {event.get('reason', '')}: {event.get('message', '')}", 300))
            for line in client.log(namespace, pod_name, LOG_LINES):
                lines.append("  log " + clean(pod_name, 80) + ": " + clean(line, 300))
    except MetralError as exc:
        lines.append(f"  (could not read why: {exc.message})")
    return lines


def _undo(client: KubeClient, objects: list[dict[str, Any]], progress: Callable[[str], None]) -> None:
    for obj in reversed(objects):
        meta = obj["metadata"]
        try:
            client.delete(obj["kind"], meta["namespace"], meta["name"])
            progress(f"deleted {obj['kind']} {meta['namespace']}/{meta['name']} (the failed start)")
        except MetralError as exc:
            progress(f"could not delete {obj['kind']} {meta['namespace']}/{meta['name']}: {exc.message}")


def ps(client: KubeClient, namespace: str) -> list[dict[str, Any]]:
    """metralectl's pods in the namespace: recipe, pod, phase, ready, node."""
    rows = []
    for pod in client.pods(namespace, MANAGED):
        labels = (pod.get("metadata") or {}).get("labels") or {}
        status = pod.get("status") or {}
        rows.append({"recipe": str(labels.get(LABEL_RECIPE, "?")), "pod": _name(pod),
                     "phase": str(status.get("phase", "?")), "ready": _ready(pod),
                     "node": str((pod.get("spec") or {}).get("nodeName", ""))})
    return rows


WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # LWS labels each pod of a group with its rank


def logs(client: KubeClient, namespace: str, recipe_name: str | None, tail: int, rank: int | None = None) -> list[str]:
    """The last `tail` lines of the head pod (rank 0), or of rank `rank`'s (log_pod says which)."""
    return client.log(namespace, log_pod(client, namespace, recipe_name, rank), tail)


def log_pod(client: KubeClient, namespace: str, recipe_name: str | None, rank: int | None = None) -> str:
    """The pod whose log `logs` reads: the head's (rank 0), or rank `rank`'s. LWS's worker-index label says which
    pod is which; a Deployment's one pod is rank 0. FAILED when there is none."""
    pods = client.pods(namespace, recipe_selector(recipe_name))
    if not pods:
        raise MetralError(f"no metralectl pod{' of ' + recipe_name if recipe_name else ''} in namespace {namespace}",
                          "`metralectl ps --on kube` lists them", exit_code=ExitCode.FAILED)
    if rank is None:
        return _name(sorted(pods, key=_name)[0])
    ranks = {_labels(pod).get(WORKER_INDEX, "0"): pod for pod in pods}
    if str(rank) not in ranks:
        have = ", ".join(clean(k, 20) for k in sorted(ranks))
        raise MetralError(f"no pod of rank {rank}{' of ' + recipe_name if recipe_name else ''} in namespace "
                          f"{namespace} (ranks there: {have})", "`metralectl ps --on kube` lists them",
                          exit_code=ExitCode.FAILED)
    return _name(ranks[str(rank)])


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    labels = (pod.get("metadata") or {}).get("labels")
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


GRACE_S = 30.0  # what Kubernetes gives a pod between SIGTERM and SIGKILL when its spec sets none (export sets none)


def wait_gone(client: KubeClient, namespace: str, recipe_name: str | None, timeout_s: float,
              progress: Callable[[str], None], *, sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S) -> float:
    """Wait until no pod of the recipe (None: of metralectl's) is left in the namespace: deleting the objects only
    asks; the engine still holds its GPU and its port until its pod ended, and a `run` started before would find
    them taken. The seconds it took; FAILED naming the pods still there after `timeout_s`."""
    selector = recipe_selector(recipe_name)
    start = clock()
    said: int | None = None
    while True:
        left = sorted(_name(pod) for pod in client.pods(namespace, selector))
        if not left:
            return clock() - start
        if len(left) != said:
            progress(f"waiting for {count(len(left), 'pod')} to end: {', '.join(clean(n, 80) for n in left[:4])}")
            said = len(left)
        if clock() - start >= timeout_s:
            raise MetralError(f"{count(len(left), 'pod')} of what was deleted still there after {timeout_s:g} s: "
                              f"{', '.join(clean(n, 80) for n in left[:8])}",
                              f"kubectl -n {clean(namespace, 80)} get pods -l {selector} (a node that stopped answering "
                              "keeps its pods listed until the node controller gives up on it)",
                              exit_code=ExitCode.FAILED)
        sleep(poll_s)


def stop(client: KubeClient, namespace: str, recipe_name: str | None) -> list[str]:
    """Delete metralectl's objects of the recipe (None: all of them) in the namespace; what was deleted."""
    from metralectl.seams.kube.client import KINDS, KubeFailed

    deleted = []
    for kind in KINDS:
        try:
            found = client.objects(kind, namespace, recipe_selector(recipe_name))
        except KubeFailed as exc:
            if kind == "LeaderWorkerSet" and exc.status == 404:  # LWS not installed: nothing of that kind
                continue
            raise
        for obj in found:
            name = _name(obj)  # checked against the API's name grammar by delete(), before it goes into a URL
            if client.delete(kind, namespace, name):
                deleted.append(f"{kind} {namespace}/{name}")
    return deleted
