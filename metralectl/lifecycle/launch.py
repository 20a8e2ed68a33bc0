"""`run`: preflight, start the container, wait until the engine is really ready, or clean up.

Ready means `GET /health` = 200, polled from the moment the container starts (lifecycle/readiness.py);
the engine's log lines are hints for phases, progress and failure causes. A start that fails is
classified in one line, its logs are kept, and its container removed (unless keep_failed). Ctrl-C at
any point removes the half-started container.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from metralectl import cancel
from metralectl.seams import machine, store, weights_state
from metralectl.core.catalog import Catalog
from metralectl.seams.endpoint import EngineClient, base_url
from metralectl.seams.ports import port_free
from metralectl.errors import ExitCode, MetralError
from metralectl.core.contract import Readiness
from metralectl.lifecycle.boot import REMEDIES, BootLog, Diagnosis, diagnose_exit, message_of
from metralectl.lifecycle.preflight import (containers_refusal, launch_refusal, multi_rank_refusal, observe,
                                            port_refusal, same_launch)
from metralectl.lifecycle.events import (ContainerStarted, Failed, Listener, LogLine, Phase, Ready, Step, Transfer,
                                         Warning_, ignore)
from metralectl.lifecycle.readiness import (BootClock, HealthPoller, StyleGate, fault_diagnosis, stall_diagnosis,
                                            timeout_diagnosis, warnings_at_ready)
from metralectl.core.recipe import Recipe
from metralectl.core.labels import LABEL_ENDPOINT, LABEL_RUN_ID, LABEL_SETS
from metralectl.core.render import ContainerSpec, owner, spec_for
from metralectl.seams.container_runtime import ContainerRuntime
from metralectl.seams.docker_runtime import GPU_CAUSES, ContainerInfo, RuntimeFailure

DRAIN_S = 5.0  # after the container is down: how long its last log lines may take to arrive
POLL_WAIT_S = 0.02  # the waiting loop's tick: it sees a new /health answer within this of the poll
# A boot that logged a failure signature and still answered 200 must stay up this long before it counts as
# ready: the engine's OOM watchdog reads every ~2 s and exits after 3 low readings, and field logs show its
# first reading before the ready line and the exit 3 s after it (engine-facts §2).
HOLD_S = 8.0


@dataclass(frozen=True)
class LaunchOptions:
    replace: bool = False
    keep_failed: bool = False
    stall_timeout_s: float = 300.0  # no new log line and no change in the /health answer for this long = stalled
    boot_timeout_s: float | None = None  # default: the hardware class's (900 s on GB10)
    check_weights: bool = True
    pull: bool = True  # pull a missing image / download missing weights before starting (else refuse)
    sets: tuple[str, ...] = ()  # the --set overrides, recorded so a swap can restore this exact recipe


@dataclass(frozen=True)
class Launched:
    run_id: str
    recipe: str
    container: str
    container_id: str
    url: str
    model: str | None
    ready_s: float
    phases: dict[str, float] = field(default_factory=dict)
    log_path: str = ""
    ready_at: float = 0.0  # wall-clock time (epoch s) the first /health 200 arrived
    already_serving: bool = False  # this very recipe, with these settings, was served already: nothing started


class LaunchFailed(MetralError):
    """The engine did not become ready; its diagnosis names the cause and the remedy."""

    exit_code = ExitCode.FAILED

    def __init__(self, diagnosis: Diagnosis, last_lines: list[str], log_path: str, kept: str | None = None) -> None:
        where = f"; logs kept in {log_path}" + (f"; container {kept} kept" if kept else "")
        super().__init__(f"start failed ({diagnosis.cause}): {diagnosis.message}{where}", diagnosis.remedy)
        self.diagnosis = diagnosis
        self.last_lines = last_lines
        self.log_path = log_path


def stage(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, options: LaunchOptions, on_event: Listener) -> None:
    """The image and the weights, present and right for this machine — pulled when missing unless told not to."""
    from metralectl.core import images
    from metralectl.seams import weights
    info = catalog.image_for(recipe)
    arch = machine.cpu_arch()
    on_event(Step("image", info.ref))
    state = runtime.image_state(info.ref, info.revision_label)
    if not state.present and options.pull:
        images.pull(info, runtime, arch, _transfer("image", on_event))
    images.image_preflight(info, runtime, arch, recipe.name)
    if not options.check_weights:
        return
    on_event(Step("weights", recipe.checkpoint.repo))
    cache = weights_state.checkpoint_state(recipe.checkpoint)
    if cache.status in ("absent", "partial") and options.pull:
        weights.pull(recipe, _transfer("weights", on_event))
    elif cache.status == "present":
        on_event(Warning_(f"weights of {recipe.checkpoint.repo} are present but not verified "
                          f"(`metralectl pull {recipe.name}` verifies them)"))
        weights.serving_preflight(recipe, cache)  # a GGUF quant: llama-server must load these very files
        return
    weights.weights_preflight(recipe)


def _transfer(kind: str, on_event: Listener) -> Callable[[object], None]:
    """A pull's progress as Transfer events; each report is also a place a cancel stops the pull."""
    def progress(value: object) -> None:
        cancel.checkpoint()
        on_event(Transfer(kind, value))
    return progress


def check_containers(recipe: Recipe, runtime: ContainerRuntime, spec: ContainerSpec, options: LaunchOptions, *,
                     ignore_running: tuple[str, ...] = (), where: str = "") -> list[ContainerInfo]:
    """Refuse a foreign container holding spec's name, another user's model, or (without --replace) one of
    ours serving (lifecycle/preflight.py says which); return ours that are running (what --replace stops).
    `where` names the node."""
    existing = runtime.inspect(spec.name)
    others = [c for c in runtime.containers(mine=False) if c.running and c.owner != owner()]
    running = [c for c in runtime.containers() if c.running and c.name not in ignore_running]
    refused = containers_refusal(recipe, spec, options, existing, others, running, where=where)
    if refused is not None:
        raise refused.error
    return running


def preflight(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, spec: ContainerSpec, options: LaunchOptions,
              on_event: Listener, *, ignore_running: tuple[str, ...] = (), check_port: bool = True) -> None:
    """Everything that can refuse a launch before anything starts: first what is known now
    (lifecycle/preflight.py, the answer the dashboard's plan shows too), then staging (which pulls what
    is missing unless told not to), then the containers and the port again (staging can take minutes)."""
    refused = multi_rank_refusal(recipe) or launch_refusal(recipe, spec, options,
                                                           observe(recipe, catalog, runtime, spec),
                                                           ignore_running=ignore_running)
    if refused is not None:
        raise refused.error
    cancel.checkpoint()
    stage(recipe, catalog, runtime, options, on_event)
    cancel.checkpoint()
    running = check_containers(recipe, runtime, spec, options, ignore_running=ignore_running)
    if not check_port:
        return
    on_event(Step("port", f"{spec.bind}:{spec.port}"))
    refused = port_refusal(spec, None if running else port_free(spec.bind, spec.port), running)
    if refused is not None:
        raise refused.error


def launch(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, *, options: LaunchOptions = LaunchOptions(),
           on_event: Listener = ignore, gpus_override: str | int | None = "recipe") -> Launched:
    spec = spec_for(catalog, recipe, gpus_override=gpus_override)
    if not options.replace:
        served = already_serving(recipe, catalog, runtime, spec, on_event)
        if served is not None:
            return served
    preflight(recipe, catalog, runtime, spec, options, on_event)
    replaced: list[str] = []
    if options.replace:
        from metralectl.lifecycle.multinode import stop_deployments_on
        from metralectl.lifecycle.stop import stop_containers

        stop_deployments_on(runtime, on_event)  # a multi-rank deployment with a rank here goes as a whole
        for result in stop_containers(runtime, [c for c in runtime.containers() if c.running], on_event=on_event):
            on_event(Step("replaced", result.name))
            replaced.append(result.recipe or result.name)
    stale = runtime.inspect(spec.name)
    if stale is not None:  # ours, not running: a leftover of an earlier failed run
        runtime.remove(stale.id, force=True)
    try:
        return start_and_wait(recipe, catalog, runtime, spec, options, on_event)
    except KeyboardInterrupt:
        if not replaced:
            raise
        # --replace already stopped what served: the user must hear that nothing serves now, and how to undo it
        raise LaunchInterrupted(
            f"interrupted while {recipe.name} was starting: nothing serves now ({', '.join(replaced)} was stopped "
            f"by --replace, {recipe.name}'s container was removed)",
            f"`metralectl run {replaced[0]}` serves it again") from None


def already_serving(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, spec: ContainerSpec,
                    on_event: Listener) -> Launched | None:
    """`run` of exactly what serves (preflight.same_launch) is done already: its endpoint, as a launch would
    give it, once its engine answers ready; running but not ready is refused (its logs say why). None: not served."""
    from metralectl.lifecycle.readiness import classify_health
    from metralectl.seams.endpoint import health_once

    same = same_launch(spec, [c for c in runtime.containers() if c.running])
    if same is None:
        return None
    url = same.labels.get(LABEL_ENDPOINT) or base_url(spec.bind, spec.port)
    readiness = catalog.engines[recipe.engine].readiness
    health = classify_health(health_once(url, timeout=5.0, path=readiness.health_path), readiness)
    if health.kind != "ready":
        raise MetralError(f"{recipe.name} is already running with these settings ({same.name}), but its engine is "
                          f"not ready: GET {readiness.health_path}: {health.describe()}",
                          f"`metralectl logs {recipe.name}` shows why; `metralectl run {recipe.name} --replace` restarts it")
    on_event(Step("serving", f"{recipe.name} is already served with these settings ({same.name}): nothing to start"))
    with EngineClient(url) as client:
        model = client.served_model()
    return Launched(same.labels.get(LABEL_RUN_ID, ""), recipe.name, same.name, same.id, url, model, 0.0,
                    already_serving=True)


class LaunchInterrupted(MetralError):
    """Ctrl-C after `run --replace` stopped what served: nothing serves, and the message says so."""

    exit_code = ExitCode.INTERRUPTED


def start_and_wait(recipe: Recipe, catalog: Catalog, runtime: ContainerRuntime, spec: ContainerSpec,
                   options: LaunchOptions, on_event: Listener) -> Launched:
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    url = base_url(spec.bind, spec.port)
    labels = {LABEL_RUN_ID: run_id, LABEL_ENDPOINT: url, LABEL_SETS: "\x1f".join(options.sets)}
    log_path = store.logs_dir() / f"{run_id}-{recipe.name}.log"
    boot_timeout = options.boot_timeout_s or catalog.hardware[recipe.hardware].boot_timeout_s
    contract = catalog.engines[recipe.engine]
    container: ContainerInfo | None = None
    started = time.monotonic()
    try:
        on_event(Step("starting", spec.name))
        cancel.checkpoint()
        try:
            container = runtime.create_and_start(spec, labels)
        except RuntimeFailure as exc:
            cause = "gpu-runtime-missing" if exc.cause in GPU_CAUSES else "start-refused"
            raise LaunchFailed(Diagnosis(cause, exc.message, exc.hint or REMEDIES.get(cause, "")), [], str(log_path)) from None
        cancel.checkpoint()  # cancelled while the daemon created it: the cleanup below removes it
        on_event(ContainerStarted(spec.name, container.id, run_id))
        log = BootLog(contract, spec.bind, spec.port)
        phases, ready_at = _wait_ready(runtime, container, log, log_path, url, boot_timeout, options.stall_timeout_s,
                                       started, on_event, contract.readiness)
        cancel.checkpoint()  # a cancel that came before ready was reported wins: the cleanup below
        with EngineClient(url) as client:
            model = client.served_model()
        elapsed = time.monotonic() - started
        on_event(Ready(url, model, elapsed))
        store.append_jsonl(store.state_dir() / "runs.jsonl", {"run_id": run_id, "recipe": recipe.name, "outcome": "ready",
                                                             "container": spec.name, "ready_s": round(elapsed, 3),
                                                             "ready_at": ready_at, "at": time.time(),
                                                             "sets": list(options.sets)})
        return Launched(run_id, recipe.name, spec.name, container.id, url, model, elapsed, phases, str(log_path),
                        ready_at)
    except LaunchFailed as failure:
        kept = None
        if container is not None:
            if options.keep_failed:
                kept = spec.name
            else:
                runtime.remove(container.id, force=True)
        on_event(Failed(failure.diagnosis.cause, failure.diagnosis.message, failure.diagnosis.remedy,
                        tuple(failure.last_lines)))
        store.append_jsonl(store.state_dir() / "runs.jsonl", {"run_id": run_id, "recipe": recipe.name, "outcome": "failed",
                                                             "cause": failure.diagnosis.cause, "at": time.time()})
        raise LaunchFailed(failure.diagnosis, failure.last_lines, failure.log_path, kept) from None
    except BaseException:
        # Ctrl-C, a crash, a lost daemon: nothing half-started may stay behind.
        if container is not None:
            _remove_quietly(runtime, container.id)
        else:  # interrupted inside create/start: find this launch's container by its name and run id
            try:
                runtime.remove_if_labelled(spec.name, {LABEL_RUN_ID: run_id})
            except MetralError:
                pass
        raise


def _remove_quietly(runtime: ContainerRuntime, container_id: str) -> None:
    try:
        runtime.remove(container_id, force=True)
    except MetralError:
        pass


def _wait_ready(runtime: ContainerRuntime, container: ContainerInfo, log: BootLog, log_path: Path, url: str,
                boot_timeout: float, stall_timeout: float, started: float, on_event: Listener,
                readiness: Readiness) -> tuple[dict[str, float], float]:
    """Until GET /health = 200 (polled from the start), a faulted answer, the container's exit, a stall or the
    boot timeout. Returns the phases and the wall-clock time the 200 arrived."""
    lines: queue.Queue[str | None] = queue.Queue()
    stop = threading.Event()
    follower = threading.Thread(target=_follow, args=(runtime, container.id, lines, stop), daemon=True)
    follower.start()
    poller = HealthPoller(url, readiness)
    poller.start()
    style = StyleGate(readiness, url, on_event)
    phases: dict[str, float] = {}
    clock = BootClock(started, boot_timeout, stall_timeout)
    next_state_check = 0.0
    log_ended = False
    seen_changes = 0
    hold_until: float | None = None
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            cancel.checkpoint()  # every tick of the wait (POLL_WAIT_S): a silent boot is cancelled within one
            try:
                line = lines.get(timeout=POLL_WAIT_S)
            except queue.Empty:
                line = ""
            now = time.monotonic()
            if line is None:
                log_ended = True
            elif line:
                _take(line, fd, log, on_event, phases, now - started)
                clock.progressed(now)
            health = poller.state
            if poller.changes != seen_changes:
                seen_changes = poller.changes
                clock.progressed(now)
                if health.kind != "down":
                    on_event(Step("health", f"GET {readiness.health_path}: {health.describe()}"))
            if health.kind == "ready" and hold_until is None and not style.satisfied(log):
                pass  # healthy, but the engine's readiness style wants more (a warm-up marker, a first answer)
            elif health.kind == "ready" and hold_until is None:
                if "ready" not in phases:
                    phases["ready"] = now - started
                    on_event(Phase("ready", f"GET {readiness.health_path}: {health.describe()}", now - started))
                if log.failure is None:
                    return phases, poller.ready_at or time.time()
                hold_until = now + HOLD_S  # e.g. a first OOM-watchdog reading: it may still exit seconds after ready
                on_event(Step("holding", f"the engine logged `{log.failure.message}` while starting: checking it stays "
                                         f"up for {HOLD_S:g} s"))
            if hold_until is not None and now >= hold_until:
                for warning in warnings_at_ready(log, HOLD_S):
                    on_event(Warning_(warning))
                return phases, poller.ready_at or time.time()
            if health.kind == "faulted":
                raise LaunchFailed(fault_diagnosis(health, url), list(log.tail)[-30:], str(log_path))
            if now >= next_state_check or log_ended:
                next_state_check = now + 0.5
                info = runtime.inspect(container.id)
                if info is None or not info.running:
                    _drain(lines, fd, log, on_event, log_ended)
                    code = info.exit_code if info else None
                    raise LaunchFailed(diagnose_exit(code, bool(info and info.oom_killed), log), list(log.tail)[-30:],
                                       str(log_path))
            if hold_until is not None:
                continue  # ready already; only an exit (checked above) can still fail the start
            if clock.timed_out(now):
                raise LaunchFailed(timeout_diagnosis(log, health, url, boot_timeout), list(log.tail)[-30:],
                                   str(log_path))
            if clock.stalled(now):
                raise LaunchFailed(stall_diagnosis(log, health, url, stall_timeout), list(log.tail)[-30:],
                                   str(log_path))
    finally:
        stop.set()
        poller.stop()
        os.close(fd)


def _take(line: str, fd: int, log: BootLog, on_event: Listener, phases: dict[str, float], elapsed: float) -> None:
    """One engine log line: into the kept log, to the listener (cleaned), and read for its phase."""
    phase = log.feed(line)
    clean = log.tail[-1]
    os.write(fd, (clean + "\n").encode())
    on_event(LogLine(clean))
    if phase is not None and phase not in phases:
        phases[phase] = elapsed
        on_event(Phase(phase, message_of(clean, log.contract.log_prefix), elapsed))


def _follow(runtime: ContainerRuntime, container_id: str, lines: queue.Queue[str | None], stop: threading.Event) -> None:
    try:
        for line in runtime.follow_logs(container_id, stop=stop):
            lines.put(line)
            if stop.is_set():
                break
    except MetralError:
        pass
    finally:
        lines.put(None)


def _drain(lines: queue.Queue[str | None], fd: int, log: BootLog, on_event: Listener, ended: bool) -> None:
    """Take the lines the follower still holds, so the diagnosis sees the engine's last words: until the
    follower reaches the end of the log (it can lag the container's exit on a loaded machine), at most DRAIN_S."""
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.05)
        except queue.Empty:
            if ended:
                return
            continue
        if line is None:
            return
        log.feed(line)
        os.write(fd, (log.tail[-1] + "\n").encode())
        on_event(LogLine(log.tail[-1]))
