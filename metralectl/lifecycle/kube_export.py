"""A recipe as Kubernetes or Compose manifests (`metralectl export kube|compose RECIPE`): data, no cluster.

Every rank's container is the spec the Docker path renders (lifecycle/specs.spec_here -> core/render), never a
second renderer: its image, argv (as `args`: Kubernetes' `args` and Compose's `command` replace the image's CMD
exactly as `docker run IMAGE ARGV...` does), environment, labels, HF cache mount, GPUs, host network and IPC, and a
multi-rank launch's profile (RDMA devices, IPC_LOCK, shm). What the cluster decides at start is read from
LeaderWorkerSet's environment through Kubernetes' own `$(VAR)` expansion of `args`: the head's address is
rendered as `$(LWS_LEADER_ADDRESS)` (and, for more than two ranks, a worker's rank as `$(LWS_WORKER_INDEX)`),
so substituting those two values gives back `run --print --rank N --master-addr ADDR` word for word
(tests/unit/test_kube_export.py holds it). A literal `$(` in a recipe's value is written `$$(` (Kubernetes'
escape), and `$` as `$$` in Compose files (Compose's).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metralectl.core.fit import parallel_sizes
from metralectl.core.labels import LABEL_RANK
from metralectl.errors import ExitCode, MetralError

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.core.render import ContainerSpec

LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
GPU_RESOURCE = "nvidia.com/gpu"
PROBE_PERIOD_S = 10
LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_FIRST_LOAD_S = 1800.0  # a class without a boot timeout: half an hour for a first load
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035: Services, LWS names
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # DNS-1123 label


@dataclass(frozen=True)
class KubeOptions:
    namespace: str | None = None
    roce_interface: str | None = None  # NCCL_SOCKET_IFNAME on every rank (multi-rank: required, never guessed)
    rdma_device: str | None = None  # NCCL_IB_HCA on every rank (optional, as for `run`)
    rdma: bool = True
    gpus: int | None = None  # nvidia.com/gpu per pod; default: the recipe's count, for "all" its tensor × pipeline size


def dns_label(text: str, limit: int = 63) -> str:
    """`text` as a DNS-1035 label (what Services, LeaderWorkerSets and container names need: lower-case
    letters, digits and '-', a letter first, at most `limit`). Unchanged when it already is one; otherwise
    escaped and suffixed with 6 hex digits of its hash, so two names that escape alike stay apart."""
    if len(text) <= limit and _DNS_LABEL.match(text):
        return text
    body = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-") or "x"
    if not body[0].isalpha():
        body = "m-" + body
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{body[:limit - 7].rstrip('-')}-{digest}"


def label_value(text: str) -> str:
    """`text` as a Kubernetes label value (63 characters of [A-Za-z0-9_.-], alphanumeric at both ends):
    unchanged when valid, else escaped with a hash suffix as dns_label does."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    body = re.sub(r"[^A-Za-z0-9_.-]", "-", text).strip("-_.") or "x"
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{body[:56].rstrip('-_.')}-{digest}"


def _kube_text(word: str) -> str:
    """A word of a recipe for `args`/`env` values: Kubernetes expands `$(VAR)`; `$$(` keeps it literal. The one
    reference left to expand is the head's address this module rendered (the word, or inside one: `ADDR:PORT`)."""
    return word.replace("$(", "$$(").replace("$" + LEADER_ADDRESS, LEADER_ADDRESS)


def _shm_quantity(size: str) -> str:
    """Docker's --shm-size (`32gb`: binary units) as a Kubernetes quantity (`32Gi`)."""
    match = re.fullmatch(r"(\d+)([kmgt]?)b?", size.strip().lower())
    if not match:
        raise MetralError(f"shm size {size!r} is not a size Docker would take", "a number with k, m, g or t")
    number, unit = match.groups()
    return number + {"": "", "k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti"}[unit]


def rank_specs(catalog: Catalog, recipe: Recipe, options: KubeOptions) -> list[ContainerSpec]:
    """Each rank's spec, exactly as `run --print --rank N --master-addr $(LWS_LEADER_ADDRESS)` renders it."""
    from metralectl.lifecycle.specs import spec_here

    if recipe.runtime == "process":
        raise MetralError(f"{recipe.name} runs as a host process (runtime: process); manifests run containers",
                          "export a recipe that runs in Docker (`--runtime docker` is the same recipe in a container)",
                          exit_code=ExitCode.USAGE)
    if recipe.engine_config:  # a file `run` writes on this host before the start: no manifest carries it yet
        raise MetralError(f"{recipe.name} has an engine-config: section (a file `run` writes and mounts); exports "
                          "do not carry it yet", f"serve it with `metralectl run {recipe.name}`",
                          exit_code=ExitCode.USAGE)
    if recipe.multi_rank and not options.roce_interface:
        raise MetralError(f"{recipe.name} is multi-rank: NCCL_SOCKET_IFNAME must be named, never guessed",
                          "pass --roce-interface IF (the ConnectX port with an IPv4 address on every node, e.g. "
                          "enp1s0f0np0)", exit_code=ExitCode.USAGE)
    return [spec_here(catalog, recipe, rank=rank, master_addr=LEADER_ADDRESS, roce_interface=options.roce_interface,
                      rdma=options.rdma, rdma_device=options.rdma_device,
                      engine_token=None)  # a host file no manifest carries: exports leave engine auth off
            for rank in range(recipe.resources.world_size)]


def worker_argv(specs: list[ContainerSpec]) -> list[str]:
    """The one argv of LWS's worker template: rank 1's; with more workers, the words that differ between them must
    be each one's rank, and read `$(LWS_WORKER_INDEX)` (anything else differing has no place in one template)."""
    workers = [list(spec.command) for spec in specs[1:]]
    template = [_kube_text(word) for word in workers[0]]
    for rank, argv in enumerate(workers[1:], start=2):
        if len(argv) != len(workers[0]):
            raise MetralError(f"rank {rank}'s command differs from rank 1's in length; one LWS worker template "
                              "cannot hold both", "give the worker ranks the same settings", exit_code=ExitCode.DATA)
        for at, (first, word) in enumerate(zip(workers[0], argv)):
            if first == word:
                continue
            if first == "1" and word == str(rank):
                template[at] = WORKER_INDEX
            else:
                raise MetralError(f"rank {rank} differs from rank 1 in {word!r} (not its rank number)",
                                  "give the worker ranks the same settings", exit_code=ExitCode.DATA)
    return template


def _env(spec: ContainerSpec) -> list[dict[str, str]]:
    return [{"name": key, "value": _kube_text(value)} for key, value in spec.env.items()]


def _labels(spec: ContainerSpec, name: str) -> dict[str, str]:
    labels = {NAME_LABEL: "metralectl", INSTANCE_LABEL: name, MANAGED_BY_LABEL: "metralectl"}
    labels.update({key: label_value(value) for key, value in spec.labels.items() if key != LABEL_RANK})
    return labels


def _gpus(spec: ContainerSpec, options: KubeOptions, spread: int) -> int | None:
    """nvidia.com/gpu for one pod: --gpus, else the recipe's count, else (`all`) the GPUs the engine spreads the
    model over (its tensor × pipeline parallel sizes, `spread`; 1 without them): a pod asks a count, never "all"."""
    if spec.gpus is None:
        return None
    if options.gpus is not None:
        return options.gpus
    return spec.gpus if isinstance(spec.gpus, int) else spread


def _probes(catalog: Catalog, recipe: Recipe, spec: ContainerSpec) -> dict[str, Any]:
    """The head's readiness from the engine file: GET its health path answers the ready status (every
    readiness style polls /health; a warm-up marker or a lazy load cannot be read by the kubelet, so it
    judges by /health alone). The startup probe allows the hardware class's boot timeout (a first load)."""
    contract = catalog.engines[recipe.engine]
    hardware = catalog.hardware.get(recipe.hardware)
    boot = (hardware.boot_timeout_s if hardware is not None else 0) or DEFAULT_FIRST_LOAD_S
    get: dict[str, Any] = {"path": contract.readiness.health_path, "port": spec.port}
    if spec.bind not in ("0.0.0.0", "::", ""):  # the kubelet runs on the node: with host network, its loopback
        get["host"] = "127.0.0.1" if spec.bind == "localhost" else spec.bind
    return {
        "startupProbe": {"httpGet": get, "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 5,
                         "failureThreshold": max(1, int(-(-boot // PROBE_PERIOD_S)))},
        "readinessProbe": {"httpGet": get, "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 5,
                           "failureThreshold": 3},
    }


def _pod_spec(catalog: Catalog, recipe: Recipe, spec: ContainerSpec, args: list[str], options: KubeOptions,
              *, head: bool) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for n, mount in enumerate(spec.mounts):
        volume = "hf-cache" if n == 0 else f"hf-cache-{n}"
        volumes.append({"name": volume, "hostPath": {"path": mount.source, "type": "Directory"}})
        mounts.append({"name": volume, "mountPath": mount.target, **({"readOnly": True} if mount.read_only else {})})
    for n, device in enumerate(spec.devices):
        volume = "rdma" if n == 0 else f"rdma-{n}"
        volumes.append({"name": volume, "hostPath": {"path": device}})
        mounts.append({"name": volume, "mountPath": device})
    if spec.shm_size:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": _shm_quantity(spec.shm_size)}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    container: dict[str, Any] = {"name": "engine", "image": spec.image, "args": args, "env": _env(spec)}
    tp, pp = parallel_sizes(recipe.serve, catalog.engines[recipe.engine].fit_roles)
    gpus = _gpus(spec, options, tp * pp)
    if gpus is not None:
        container["resources"] = {"limits": {GPU_RESOURCE: gpus}}
    if spec.cap_add:
        container["securityContext"] = {"capabilities": {"add": list(spec.cap_add)}}
    if mounts:
        container["volumeMounts"] = mounts
    if head:
        container["ports"] = [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}]
        container.update(_probes(catalog, recipe, spec))
    pod: dict[str, Any] = {
        "hostNetwork": spec.network_mode == "host",
        "hostIPC": spec.ipc_mode == "host",
        "dnsPolicy": "ClusterFirstWithHostNet" if spec.network_mode == "host" else "ClusterFirst",
        "containers": [container],
    }
    if volumes:
        pod["volumes"] = volumes
    return pod


def _metadata(name: str, labels: dict[str, str], options: KubeOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if options.namespace:
        meta["namespace"] = options.namespace
    return meta


def kube_manifests(catalog: Catalog, recipe: Recipe, options: KubeOptions) -> list[dict[str, Any]]:
    """A Deployment + Service (one rank), or a LeaderWorkerSet of the recipe's ranks + a Service to its head."""
    if options.namespace is not None and not (len(options.namespace) <= 63 and _NAMESPACE.match(options.namespace)):
        raise MetralError(f"namespace {options.namespace!r} is not a DNS-1123 label",
                          "at most 63 lower-case letters, digits and '-', alphanumeric at both ends",
                          exit_code=ExitCode.USAGE)
    specs = rank_specs(catalog, recipe, options)
    head = specs[0]
    # an LWS names its pods <name>-<group>-<index>: room for those suffixes
    name = dns_label(head.name if not recipe.multi_rank else head.name.removesuffix("-r0"),
                     48 if recipe.multi_rank else 63)
    labels = _labels(head, name)
    head_args = [_kube_text(word) for word in head.command]
    service_port = {"name": "http", "port": head.port, "targetPort": head.port, "protocol": "TCP"}
    if not recipe.multi_rank:
        selector = {INSTANCE_LABEL: name}
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _metadata(name, labels, options),
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},  # one GPU holder at a time, as `run --replace`
                "selector": {"matchLabels": selector},
                "template": {"metadata": {"labels": labels},
                             "spec": _pod_spec(catalog, recipe, head, head_args, options, head=True)},
            },
        }
        service = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(name, labels, options),
                   "spec": {"selector": selector, "ports": [service_port]}}
        return [deployment, service]
    workers = worker_argv(specs)
    leader_labels = {**labels, LABEL_RANK: "0"}
    worker_labels = _labels(specs[1], name)  # its own spec hash (a worker's spec is its own)
    if len(specs) == 2:
        worker_labels[LABEL_RANK] = "1"
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {LWS_NAME_LABEL: name}}, "topologyKey": "kubernetes.io/hostname"}]}}
    leader_pod = {**_pod_spec(catalog, recipe, head, head_args, options, head=True), "affinity": anti}
    worker_pod = {**_pod_spec(catalog, recipe, specs[1], workers, options, head=False), "affinity": anti}
    lws = {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": _metadata(name, labels, options),
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",  # the head binds the rendezvous; workers retry until it answers
            "leaderWorkerTemplate": {
                "size": recipe.resources.world_size,
                "restartPolicy": "RecreateGroupOnPodRestart",  # a rank lost is the group lost (as `run`)
                "leaderTemplate": {"metadata": {"labels": leader_labels}, "spec": leader_pod},
                "workerTemplate": {"metadata": {"labels": worker_labels}, "spec": worker_pod},
            },
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(name, labels, options),
               "spec": {"selector": {LWS_NAME_LABEL: name, LWS_INDEX_LABEL: "0"}, "ports": [service_port]}}
    return [lws, service]


def _compose_text(word: str) -> str:
    return word.replace("$", "$$")


def compose_file(catalog: Catalog, recipe: Recipe, *, gpus: int | None = None) -> dict[str, Any]:
    """One box: a Compose file of the one rank, the same container `run` would start."""
    if recipe.multi_rank:
        raise MetralError(f"{recipe.name} has {recipe.resources.world_size} ranks on separate nodes; a Compose file "
                          "is one box", f"`metralectl export kube {recipe.name}` (a LeaderWorkerSet), or `metralectl "
                          f"run {recipe.name} --worker NODE`", exit_code=ExitCode.USAGE)
    spec = rank_specs(catalog, recipe, KubeOptions())[0]
    service: dict[str, Any] = {
        "image": spec.image,
        "container_name": spec.name,
        "command": [_compose_text(word) for word in spec.command],
        "network_mode": spec.network_mode,
        "ipc": spec.ipc_mode,
        "environment": {key: _compose_text(value) for key, value in spec.env.items()},
        "labels": {key: _compose_text(value) for key, value in spec.labels.items()},
        "volumes": [{"type": "bind", "source": m.source, "target": m.target, **({"read_only": True} if m.read_only
                                                                                 else {})} for m in spec.mounts],
    }
    if spec.gpus is not None:
        count: int | str = gpus if gpus is not None else spec.gpus
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": count, "capabilities": ["gpu"]}]}}}
    return {"services": {dns_label(recipe.name): service}}


def dump(documents: list[dict[str, Any]]) -> str:
    """YAML documents, keys in the order built (safe_dump quotes whatever would read back as another type)."""
    import yaml

    class _Plain(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # no &id001 anchors: each object reads whole
            return True

    return "---\n".join(yaml.dump(doc, Dumper=_Plain, sort_keys=False, default_flow_style=False, width=100)
                         for doc in documents)
