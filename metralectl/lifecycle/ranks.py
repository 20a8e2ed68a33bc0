"""A launch's ranks: start each container, wait for them as one, then keep or remove them.

A single-node `run` is one rank; an EP=2 launch (lifecycle/multinode.py) is two, on two nodes' Docker
daemons, the head first (it binds the rendezvous; the worker retries until then). Both go through this
one start, the one waiting loop (lifecycle/readiness.py `wait_ready`), one failure handling (a rank that
fails takes every rank down, its logs kept, unless --keep-failed) and one clean-up on Ctrl-C, a crash or
a lost daemon: nothing half-started stays behind on any node. What only a multi-rank launch has, its
deployment record on disk, comes in as a `Record`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from metralectl import cancel
from metralectl.core.catalog import Catalog
from metralectl.core.labels import LABEL_ENDPOINT, LABEL_ENGINE_AUTH, LABEL_RUN_ID, LABEL_SETS
from metralectl.core.recipe import Recipe
from metralectl.core.render import ContainerSpec
from metralectl.errors import MetralError
from metralectl.lifecycle.boot import REMEDIES, BootLog, Diagnosis, LaunchFailed
from metralectl.lifecycle.events import ContainerStarted, Failed, Listener, Ready, Step, Warning_
from metralectl.lifecycle.logfollow import Watched, rank_label
from metralectl.lifecycle import readiness
from metralectl.lifecycle.engine_token import engine_headers
from metralectl.seams import store
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.errors import GPU_CAUSES, RuntimeFailure
from metralectl.seams.docker.protocol import ContainerRuntime
from metralectl.seams.endpoint import EngineClient

if TYPE_CHECKING:
    from metralectl.lifecycle.launch import LaunchOptions


@dataclass
class Rank:
    """One container of a launch: where it runs, what it runs, where its log is kept."""

    rank: int
    runtime: ContainerRuntime
    spec: ContainerSpec
    log_path: Path
    role: str = ""  # "head" | "worker" in a multi-rank launch; "" for a single rank
    where: str = ""  # its node, as messages name it
    container: ContainerInfo | None = None  # once started

    @property
    def label(self) -> str:
        return rank_label(self.rank, self.role, self.where)

    @property
    def shown(self) -> str:
        """Its container's name, and its node in a multi-rank launch."""
        return f"{self.spec.name} ({self.label})" if self.label else self.spec.name


class Record(Protocol):
    """What a launch records beyond its containers' labels (a multi-rank deployment record)."""

    def started(self, rank: int, container_id: str) -> None: ...

    def settled(self, state: str) -> None: ...  # "ready" | "failed" (containers kept or left) | "gone"


class NoRecord:
    def started(self, rank: int, container_id: str) -> None:
        pass

    def settled(self, state: str) -> None:
        pass


@dataclass(frozen=True)
class Booted:
    url: str
    model: str | None
    ready_s: float
    ready_at: float  # wall-clock time (epoch s) the first /health 200 arrived
    phases: dict[str, float] = field(default_factory=dict)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def boot(recipe: Recipe, catalog: Catalog, ranks: Sequence[Rank], run_id: str, url: str, options: LaunchOptions,
         on_event: Listener, *, record: Record = NoRecord(), answer_timeout_s: float | None = None,
         network: str = "", run_entry: dict[str, Any] | None = None) -> Booted:
    """Start every rank (ranks[0], the head, serves `url`), wait until the launch is ready, or fail it.
    `answer_timeout_s` and `network` go to the waiting loop; `run_entry`: more of runs.jsonl's ready line."""
    contract = catalog.engines[recipe.engine]
    boot_timeout = options.boot_timeout_s or catalog.hardware[recipe.hardware].boot_timeout_s
    clock = readiness.BootClock(time.monotonic(), boot_timeout, options.stall_timeout_s)
    try:
        for rank in ranks:
            labels = {LABEL_RUN_ID: run_id, LABEL_SETS: "\x1f".join(options.sets)}
            if rank.rank == 0:
                labels[LABEL_ENDPOINT] = url
            _start(rank, labels, run_id, on_event)
            assert rank.container is not None
            record.started(rank.rank, rank.container.id)
        watched = [Watched(r.rank, r.runtime, r.container.id, BootLog(contract, r.spec.bind, r.spec.port), r.log_path,
                           r.role, r.where) for r in ranks if r.container is not None]
        headers = engine_headers(ranks[0].spec.labels)  # the engine token, when the engine asks it
        phases, ready_at = readiness.wait_ready(watched, url, contract.readiness, clock, on_event,
                                                answer_timeout_s=answer_timeout_s, network=network, headers=headers)
        cancel.checkpoint()  # a cancel that came before ready was reported wins: the cleanup below
        with EngineClient(url, headers=headers) as client:
            model = client.served_model()
        elapsed = time.monotonic() - clock.started
        on_event(Ready(url, model, elapsed))
        record.settled("ready")
        store.append_jsonl(store.state_dir() / "runs.jsonl", {
            "run_id": run_id, "recipe": recipe.name, "outcome": "ready", "container": ranks[0].spec.name,
            **(run_entry or {}), "ready_s": round(elapsed, 3), "ready_at": ready_at, "at": time.time(),
            "sets": list(options.sets)})
        return Booted(url, model, elapsed, ready_at, phases)
    except LaunchFailed as failure:
        started = [r for r in ranks if r.container is not None]
        kept = None
        if options.keep_failed and started:
            kept = " and ".join(r.spec.name for r in started)
            record.settled("failed")
        else:
            left = remove(started)
            if left:
                on_event(Warning_(f"could not remove {', '.join(left)}; `metralectl stop {recipe.name}` retries"))
            record.settled("failed" if left else "gone")
        on_event(Failed(failure.diagnosis.cause, failure.diagnosis.message, failure.diagnosis.remedy,
                        tuple(failure.last_lines)))
        store.append_jsonl(store.state_dir() / "runs.jsonl", {"run_id": run_id, "recipe": recipe.name,
                                                             "outcome": "failed", "cause": failure.diagnosis.cause,
                                                             "at": time.time()})
        raise LaunchFailed(failure.diagnosis, failure.last_lines, failure.log_path, kept) from None
    except BaseException:
        # Ctrl-C, a crash, a lost daemon: nothing half-started may stay behind, on any node, including a rank
        # whose create/start was interrupted before we learnt its container's id (found by name and run id).
        left = remove([r for r in ranks if r.container is not None])
        for rank in ranks:
            if rank.container is None:
                try:
                    rank.runtime.remove_if_labelled(rank.spec.name, {LABEL_RUN_ID: run_id})
                except MetralError:
                    left.append(rank.shown)
        if not left:
            record.settled("gone")
        raise


def _start(rank: Rank, labels: dict[str, str], run_id: str, on_event: Listener) -> None:
    on_event(Step("starting", rank.shown))
    cancel.checkpoint()
    if rank.spec.files or LABEL_ENGINE_AUTH in rank.spec.labels:  # its generated config, the engine token
        _write_files(rank.spec)
    try:
        rank.container = rank.runtime.create_and_start(rank.spec, labels)
    except RuntimeFailure as exc:
        cause = "gpu-runtime-missing" if exc.cause in GPU_CAUSES else "start-refused"
        where = f"{rank.label}: " if rank.label else ""
        raise LaunchFailed(Diagnosis(cause, where + exc.message, exc.hint or REMEDIES.get(cause, "")), [],
                           str(rank.log_path)) from None
    cancel.checkpoint()  # cancelled while the daemon created it: boot's cleanup removes it
    on_event(ContainerStarted(rank.spec.name, rank.container.id, run_id))


def remove(ranks: Sequence[Rank]) -> list[str]:
    """Remove the started ranks' containers; return the ones that could not be removed."""
    left = []
    for rank in ranks:
        if rank.container is None:
            continue
        try:
            rank.runtime.remove(rank.container.id, force=True)
        except MetralError:
            left.append(rank.shown)
    return left


def _write_files(spec: ContainerSpec) -> None:
    """The spec's generated files, written before its engine starts; a write that fails stops the start."""
    from metralectl.lifecycle.specs import write_spec_files

    try:
        write_spec_files(spec)
    except OSError as exc:
        where = spec.files[0].host_path if spec.files else "metralectl's engine token"
        raise MetralError(f"could not write {where}: {exc.strerror or exc}",
                          "check that the state directory (~/.metrale/state) is writable") from None
