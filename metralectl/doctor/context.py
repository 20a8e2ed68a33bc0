"""What the checks look at, gathered once and shared: who we are, the catalog, the Docker daemon, the GPUs.

Every source of facts is injectable (tests pass fakes; the defaults, here, are the real seams). Facts
that may block (the daemon, NVML) are each a `facts.Fact`: computed in its own daemon thread with an
absolute deadline counted from the start of the run, `Unanswered` once it has passed. Who runs doctor
is `identity.Identity`. Nothing here imports docker or pynvml; the seams do, lazily, when a fact is
first asked for.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.gpudata import GpuInfo, GpuSample, GpuSystem, GpuUnavailable
    from metralectl.core.recipe import Recipe
    from metralectl.seams.docker.protocol import ContainerRuntime
    from metralectl.seams.docker.containers import ContainerInfo
    from metralectl.seams.docker.images import ImageState

from metralectl.doctor.facts import ContainerPids, Fact, GpuFacts
from metralectl.doctor.identity import Identity, current_identity
from metralectl.seams.ports import bind_error

T = TypeVar("T")

DOCKER_BUDGET_S = 2.2  # the daemon must have answered by then: "unreachable" is reported within 3 s
FACT_BUDGET_S = 2.4  # NVML, docker info, the labelled containers
DEFAULT_PORT = 8888


class GpuProbeLike(Protocol):
    def open(self) -> GpuSystem | GpuUnavailable: ...

    def sample(self) -> tuple[GpuSample, ...]: ...

    def close(self) -> None: ...


def _default_runtime() -> ContainerRuntime:
    from metralectl.seams.docker.runtime import open_runtime

    return open_runtime()


def _default_probe(gpu_classes: tuple[tuple[str, str], ...], unified: frozenset[str]) -> GpuProbeLike:
    from metralectl.seams.gpu import NvmlProbe

    return NvmlProbe(gpu_classes=gpu_classes, unified_classes=unified)


def _default_catalog() -> Catalog:
    from metralectl.core.catalog import load_catalog

    return load_catalog()


def _default_container_pids(runtime: ContainerRuntime, container_id: str) -> set[int]:
    from metralectl.seams.docker.runtime import container_pids

    return container_pids(runtime, container_id)


def _default_cpu_arch() -> str:
    from metralectl.seams.machine import cpu_arch

    return cpu_arch()


def _default_proc_gpu_names() -> list[str]:
    from metralectl.seams.machine import gpu_names

    return gpu_names()


def _default_endpoint() -> tuple[str, str]:
    """(URL, where it came from) the SDK will use: DOCKER_HOST, the CLI's current context, the default socket."""
    host = os.environ.get("DOCKER_HOST")
    if host:
        return host, "DOCKER_HOST"
    try:
        from metralectl.seams.docker.endpoints import resolve_endpoint

        endpoint = resolve_endpoint()
        return endpoint.url, endpoint.source
    except Exception:  # noqa: BLE001 - the SDK missing or a broken CLI config: the default socket
        return "unix:///var/run/docker.sock", "default"


def listening_process(port: int) -> dict[str, Any]:
    """{pid, process} of whoever listens on port, where this user may see it (other users' PIDs need root)."""
    try:
        import psutil
    except ImportError:
        return {}
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return {}
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            holder: dict[str, Any] = {"pid": conn.pid}
            try:
                holder["process"] = psutil.Process(conn.pid).name()
            except psutil.Error:
                pass
            return holder
    return {}


def _default_agent_view() -> dict[str, Any] | None:
    """The running agent's own answer: None when no agent runs; {"pid", "port", "status"|"error"} otherwise."""
    import json

    from metralectl.seams.agent_files import read_state

    state = read_state()
    if state is None:
        return None
    port = int(state.get("api_port") or 0)
    view: dict[str, Any] = {"pid": state.get("pid"), "port": port, "how": state.get("how")}
    from metralectl.seams.bounded import CONTROL_LIMIT, TooLarge
    from metralectl.seams.httpclient import Failed, loopback

    try:
        reply = loopback(port, "GET", "/api/status", headers={"Host": f"127.0.0.1:{port}", "Connection": "close"},
                         timeout=1.5, limit=CONTROL_LIMIT, what=f"the agent on port {port}")
        if reply.status != 200:
            view["error"] = f"HTTP Error {reply.status}: {reply.reason}"
        else:
            view["status"] = json.loads(reply.body)
    except Failed as exc:
        view["error"] = exc.detail or exc.kind
    except (ValueError, RecursionError, TooLarge) as exc:
        view["error"] = str(exc)
    return view


def _default_agent_unit() -> bool:
    """Whether the user's systemd answers and has the agent's unit (then it is what starts the agent)."""
    from metralectl.seams.user_systemd import unit_loaded

    return unit_loaded()


class Context:
    """Options of this run plus the shared, lazily gathered facts."""

    def __init__(
        self,
        *,
        port: int | None = None,
        recipe: str | None = None,
        recipe_sets: tuple[str, ...] = (),  # --runtime process: the recipe with that override
        environ: Mapping[str, str] | None = None,
        identity: Identity | None = None,
        runtime_factory: Callable[[], ContainerRuntime] = _default_runtime,
        gpu_probe_factory: Callable[[tuple[tuple[str, str], ...], frozenset[str]], GpuProbeLike] = _default_probe,
        catalog_loader: Callable[[], Catalog] = _default_catalog,
        container_pids: Callable[[ContainerRuntime, str], set[int]] = _default_container_pids,
        which: Callable[..., str | None] = shutil.which,
        cpu_arch: Callable[[], str] = _default_cpu_arch,
        proc_gpu_names: Callable[[], list[str]] = _default_proc_gpu_names,
        port_probe: Callable[[str, int], OSError | None] = bind_error,
        port_holder: Callable[[int], dict[str, Any]] = listening_process,
        endpoint: Callable[[], tuple[str, str]] = _default_endpoint,
        disk_usage: Callable[[Path], Any] = shutil.disk_usage,
        agent_view: Callable[[], dict[str, Any] | None] | None = None,
        agent_unit: Callable[[], bool] | None = None,
        path_exists: Callable[[str], bool] = os.path.exists,
        proc_root: Path = Path("/proc"),
        scan_budget_s: float = 0.8,
        docker_budget_s: float = DOCKER_BUDGET_S,
        fact_budget_s: float = FACT_BUDGET_S,
    ) -> None:
        self.port_option = port
        self.recipe_name = recipe
        self.recipe_sets = recipe_sets
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self._identity = identity
        self.runtime_factory = runtime_factory
        self.gpu_probe_factory = gpu_probe_factory
        self.catalog_loader = catalog_loader
        self.container_pids_fn = container_pids
        self.which = which
        self.cpu_arch = cpu_arch
        self.proc_gpu_names = proc_gpu_names
        self.port_probe = port_probe
        self.port_holder = port_holder
        self.endpoint = endpoint
        self.disk_usage = disk_usage
        self.agent_view = agent_view or _default_agent_view
        self.agent_unit = agent_unit or _default_agent_unit
        self.path_exists = path_exists
        self.proc_root = proc_root
        self.scan_budget_s = scan_budget_s
        self.docker_budget_s = docker_budget_s
        self.fact_budget_s = fact_budget_s
        self.started = time.monotonic()
        self.runtime_lock = threading.Lock()  # docker-py clients are shared between check threads
        self._facts: dict[str, Fact[Any]] = {}
        self._facts_lock = threading.Lock()
        self._cleanups: list[threading.Event] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def begin(self) -> None:
        """Deadlines count from here."""
        self.started = time.monotonic()

    def must_finish(self) -> threading.Event:
        """An event a check sets once what it started outside this process (a container) is cleaned up."""
        event = threading.Event()
        with self._facts_lock:
            self._cleanups.append(event)
        return event

    def close(self, grace_s: float = 10.0) -> None:
        """Wait (bounded) for checks still cleaning up, e.g. removing a probe container; then close the shared
        runtime (a connection the checks opened lazily; one still connecting is left to the process's exit)."""
        deadline = time.monotonic() + grace_s
        for event in list(self._cleanups):
            event.wait(max(0.0, deadline - time.monotonic()))
        with self._facts_lock:
            docker = self._facts.get("docker")
        runtime = docker.settled() if docker is not None else None
        if runtime is not None:
            runtime.close()

    # -- facts ----------------------------------------------------------------------------------
    def _fact(self, name: str, compute: Callable[[], T], budget_s: float) -> T:
        with self._facts_lock:
            fact = self._facts.get(name)
            if fact is None:
                fact = Fact(name, compute, self.started + budget_s, budget_s)
                self._facts[name] = fact
        return fact.get()  # type: ignore[no-any-return]

    @property
    def identity(self) -> Identity:
        if self._identity is None:
            self._identity = current_identity(self.environ)
        return self._identity

    def catalog(self) -> Catalog:
        return self._fact("catalog", self.catalog_loader, self.fact_budget_s)

    def recipe(self) -> Recipe | None:
        """The recipe --recipe names, with --runtime's override (a --set, as `run` applies it)."""
        if not self.recipe_name:
            return None
        recipe = self.catalog().recipe(self.recipe_name)
        if self.recipe_sets:
            from metralectl.core.overrides import apply_sets

            recipe = apply_sets(self.catalog(), recipe, list(self.recipe_sets))
        return recipe

    def runtime(self) -> ContainerRuntime:
        """A connected runtime, or the DockerUnavailable / ImportError / Unanswered that says why not."""
        return self._fact("docker", self.runtime_factory, self.docker_budget_s)

    def docker_info(self) -> dict[str, Any]:
        def compute() -> dict[str, Any]:
            runtime = self.runtime()
            with self.runtime_lock:
                return dict(runtime.info())

        return self._fact("docker-info", compute, self.fact_budget_s)

    def our_containers(self) -> ContainerPids:
        def compute() -> ContainerPids:
            runtime = self.runtime()
            with self.runtime_lock:
                running = runtime.containers(managed_only=True, all_states=False)
                names = {c.id: c.name for c in running}
                pids = {pid: c.name for c in running for pid in self.container_pids_fn(runtime, c.id)}
            return ContainerPids(names, pids)

        return self._fact("containers", compute, self.fact_budget_s)

    def container(self, container_id: str) -> ContainerInfo | None:
        """The container with this id as the daemon reports it (any state, anyone's), None when it knows none."""
        runtime = self.runtime()
        with self.runtime_lock:
            return runtime.inspect(container_id)

    def image_state(self, ref: str, label: str | None = None) -> ImageState:
        runtime = self.runtime()
        with self.runtime_lock:
            return runtime.image_state(ref, label)

    def gpus(self) -> GpuFacts:
        def compute() -> GpuFacts:
            from metralectl.core.gpudata import DEFAULT_GPU_CLASSES, DEFAULT_UNIFIED_CLASSES

            classes: tuple[tuple[str, str], ...] = DEFAULT_GPU_CLASSES
            unified: frozenset[str] = DEFAULT_UNIFIED_CLASSES
            try:
                hardware = list(self.catalog().hardware.values())
            except Exception:  # noqa: BLE001 - a broken catalog is reported by its own checks
                hardware = []  # NVML still answers; classes come from the built-in names
            # The catalog's gpu-names first (they are the product's data), the defaults after.
            classes = tuple((n, hw.id) for hw in hardware for n in hw.gpu_names) + classes
            if hardware:
                unified = frozenset(hw.id for hw in hardware if hw.unified_memory)
            probe = self.gpu_probe_factory(classes, unified)
            system = probe.open()
            try:
                samples = tuple(probe.sample()) if getattr(system, "gpus", None) else ()
            finally:
                probe.close()
            return GpuFacts(system, samples)

        return self._fact("nvml", compute, self.fact_budget_s)

    # -- derived --------------------------------------------------------------------------------
    def detected_gpu(self) -> tuple[str | None, str | None, str]:
        """(hardware class id, GPU name, how it was found) from NVML, else the driver's /proc entries."""
        gpus = self._nvml_gpus()
        if gpus:
            first = gpus[0]
            return first.hw_class, first.name, "NVML"
        names = self.proc_gpu_names()
        if names:
            from metralectl.seams.machine import classify

            try:
                hw = classify(names, self.catalog().hardware.values())
            except Exception:  # noqa: BLE001
                hw = None
            return hw, names[0], "/proc/driver/nvidia"
        return None, None, "none"

    def gpu_count(self) -> int:
        """This machine's GPUs, as detected_gpu finds them (0: none found)."""
        gpus = self._nvml_gpus()
        return len(gpus) if gpus else len(self.proc_gpu_names())

    def _nvml_gpus(self) -> tuple[GpuInfo, ...]:
        """NVML's GPUs (empty when it cannot say: the callers fall back to the driver's /proc entries)."""
        try:
            system = self.gpus().system
        except Exception:  # noqa: BLE001 - fall back to /proc
            return ()
        return getattr(system, "gpus", None) or ()

    def target_hardware(self) -> tuple[str | None, str]:
        """The class to judge against: the recipe's (with --recipe), else the detected one."""
        recipe = self.recipe()
        if recipe is not None:
            return recipe.hardware, f"recipe {recipe.name}"
        hw, name, how = self.detected_gpu()
        return hw, (f"detected {name} ({how})" if hw else "no known GPU detected")

    def port_and_bind(self) -> tuple[int, str, str]:
        """(port, bind address, where the port came from)."""
        recipe = self.recipe()
        bind = recipe.resources.bind if recipe is not None else "127.0.0.1"
        if self.port_option is not None:
            return self.port_option, bind, "--port"
        if recipe is not None:
            return recipe.resources.port, bind, f"recipe {recipe.name}"
        return DEFAULT_PORT, bind, "default"
