"""One readiness loop: a multi-rank (EP=2) launch is N single-rank launches. Its ranks start, are followed and
are waited for by the same code as a single-node `run` (lifecycle/ranks.py, lifecycle/readiness.py), so it
honours the engine's readiness style as a single rank does; and no module but lifecycle/readiness.py asks an
engine's /health (or sends the real first request) for a launch."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.catalog import Catalog
from metralectl.lifecycle import readiness
from metralectl.lifecycle.events import LogLine, Ready, Step
from metralectl.lifecycle.launch import LaunchOptions, launch
from metralectl.lifecycle.launch_multi import start_and_wait_multi
from metralectl.lifecycle.multinode import MultiOptions, Node
from metralectl.core.render import spec_for
from metralectl.seams import machine
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.endpoint import base_url
from tests.fakes.lifecycle import GB10_IMAGE, Recorder, gb10_runtime, on_port
from tests.fakes.runtime import PREFIX, Answer, Boot, FakeRuntime, Listen, Log, engine_boot, image
from tests.ports import own_port
from tests.unit.recipe_helpers import catalog

PACKAGE = Path(__file__).resolve().parents[2] / "metralectl"
EP2 = "qwen3.5-122b-a10b-ep2"
MARKER = "The server is fired up and ready to roll!"


@pytest.fixture(autouse=True)
def arm64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64


def _ep2(cat: Catalog, head_boot: Boot, listener: Recorder) -> tuple[Any, FakeRuntime, FakeRuntime, str]:
    """An EP=2 launch's start on two fake nodes (this machine's daemon and a remote one), past staging and probing:
    the head serves on a port the test owns, the worker logs and keeps running."""
    head = gb10_runtime()
    worker = FakeRuntime(images=[image(GB10_IMAGE, "linux/arm64")],
                         endpoint=Endpoint("tcp://10.77.0.2:2375", "--worker"))  # a name only: nothing connects
    recipe = cat.recipe(EP2)
    nodes = [Node(0, "head", head, "ID|a", "a", "aarch64"), Node(1, "worker", worker, "ID|b", "b", "aarch64")]
    specs = [dataclasses.replace(spec_for(cat, recipe, rank=n.rank, master_addr="10.77.0.1",
                                          roce_interface="enp1s0f1np1", gpus_override=None), port=own_port())
             for n in nodes]
    head.script(specs[0].name, head_boot)
    worker.script(specs[1].name, Boot((Log(PREFIX + "rank 1 (worker): joined the rendezvous"),)))
    url = base_url("127.0.0.1", specs[0].port)
    launched = start_and_wait_multi(recipe, cat, nodes, specs, url, "enp1s0f1np1", "10.77.0.1", 29500,
                                    LaunchOptions(check_weights=False, pull=False),
                                    MultiOptions(first_request_timeout_s=10), listener)
    return launched, head, worker, url


def test_single_and_multi_rank_launches_wait_in_the_one_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[tuple[int, FakeRuntime]], str]] = []
    loop = readiness.wait_ready

    def spy(ranks: Any, url: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(([(w.rank, w.runtime) for w in ranks], url))
        return loop(ranks, url, *args, **kwargs)

    monkeypatch.setattr(readiness, "wait_ready", spy)
    single, port = gb10_runtime(), own_port()
    single.script("metralectl-qwen3.5-27b", engine_boot("m"))
    recipe, sets = on_port(catalog(), "qwen3.5-27b", port)
    launch(recipe, catalog(), single, options=LaunchOptions(check_weights=False, pull=False, sets=tuple(sets)),
           on_event=Recorder())
    launched, head, worker, url = _ep2(catalog(), engine_boot("m"), Recorder())
    assert calls == [([(0, single)], base_url("127.0.0.1", port)), ([(0, head), (1, worker)], url)]
    assert launched.model == "m" and [r.rank for r in launched.ranks] == [0, 1]


def test_an_ep2_launch_honours_the_engines_readiness_style() -> None:
    """An engine whose readiness style is warm-up-marker: its health 200 is not enough, on two ranks as on one."""
    cat = catalog()
    metrale = cat.engines["metrale"]
    warm = dataclasses.replace(metrale, readiness=dataclasses.replace(metrale.readiness, style="warm-up-marker",
                                                                      marker=re.compile(re.escape(MARKER))))
    cat = dataclasses.replace(cat, engines={**cat.engines, "metrale": warm})
    boot = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
                 Answer(200, {"status": "ready", "model": "m"}, after_s=0.1),
                 Log(PREFIX + "Server live and ready at {bind}:{port} running {model}"),
                 Log(PREFIX + MARKER, after_s=1.0)), model="m")
    listener = Recorder()
    launched, _, _, _ = _ep2(cat, boot, listener)
    events = listener.events
    marker = next(i for i, e in enumerate(events) if isinstance(e, LogLine) and MARKER in e.line)
    waiting = [i for i, e in enumerate(events) if isinstance(e, Step) and "warm-up line" in e.detail]
    ready = next(i for i, e in enumerate(events) if isinstance(e, Ready))
    assert len(waiting) == 1 and waiting[0] < marker < ready
    assert launched.phases["ready"] >= 1.0


# --- no second loop -----------------------------------------------------------------------------------------------
# Asking an engine's health or sending it the real first request: the client's calls, and the loop's own names.
ASKING = {"health", "health_once", "answer_one"}
LOOP = {"HealthPoller", "FirstAnswer", "wait_ready", "health_now"}
ALLOWED = {
    "lifecycle/readiness.py": "the one readiness loop",
    "lifecycle/ranks.py": "starts a launch's ranks and hands them to readiness.wait_ready",
    "lifecycle/launch.py": "`run` of what serves already asks readiness.health_now once, not a launch",
    "lifecycle/swap.py": "a swap's repair asks readiness.health_now once, not a launch",
    "lifecycle/status.py": "`ps`: one health answer per row (health_once, no httpx import), not a launch",
}


def _used(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ASKING | LOOP:
                names.add(called)
        elif isinstance(node, ast.Name) and node.id in LOOP:
            names.add(node.id)
        elif isinstance(node, ast.alias) and node.name in ASKING | LOOP:
            names.add(node.name)
    return names


def test_no_module_but_readiness_polls_health_for_a_launch() -> None:
    offenders = {}
    for path in sorted((PACKAGE / "lifecycle").glob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        used = _used(ast.parse(path.read_text()))
        if used and rel not in ALLOWED:
            offenders[rel] = sorted(used)
    assert offenders == {}, f"only lifecycle/readiness.py waits on an engine's health: {offenders}"
    for rel in ("lifecycle/ranks.py", "lifecycle/launch.py", "lifecycle/swap.py"):  # callers of readiness, no more
        used = _used(ast.parse((PACKAGE / rel).read_text()))
        assert used <= {"wait_ready", "health_now"}, (rel, used)
    polling = [p.relative_to(PACKAGE).as_posix() for p in sorted(PACKAGE.rglob("*.py"))
               if {"HealthPoller", "answer_one", "FirstAnswer"} & _used(ast.parse(p.read_text()))]
    assert polling == ["lifecycle/readiness.py"]  # the /health poll and the real first request: the loop's alone


# Following a booting engine's log and draining it once its container is down (`logs.drain(...)`; swap's drain
# of requests in flight is another matter): logfollow's, for the loop alone.
FOLLOWING = {"follow_logs", "log_tail", "Logs"}


def test_no_lifecycle_module_but_logfollow_follows_a_boots_log() -> None:
    """A second waiting loop would follow the containers' logs itself (or drain them after an exit): only
    lifecycle/logfollow.py reads a starting engine's log, and only the one loop (readiness.py) drives it."""
    users: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / "lifecycle").glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else \
                node.name if isinstance(node, (ast.alias, ast.FunctionDef, ast.ClassDef)) else ""
            if name in FOLLOWING or (name == "drain" and isinstance(node, ast.Attribute)):
                found.add(name)
        if found and path.name != "local_runtime.py":  # a runtime (containers + host processes): it hands the
            users[path.relative_to(PACKAGE).as_posix()] = found  # calls to the one that holds the engine, reads none
    assert users == {"lifecycle/logfollow.py": {"follow_logs", "Logs"}, "lifecycle/readiness.py": {"Logs", "drain"}}, \
        users


# --- multinode.py: the topology --------------------------------------------------------------------------------
LAUNCHING = {"lifecycle.launch", "lifecycle.launch_multi", "lifecycle.ranks", "lifecycle.readiness",
             "lifecycle.logfollow", "lifecycle.stop", "lifecycle.node_stage", "lifecycle.rdma", "lifecycle.boot"}
STARTING = {"create_and_start", "remove", "stop", "kill", "follow_logs", "save", "forget"}


def test_multinode_keeps_only_the_topology() -> None:
    """What ranks exist, on which node, with which arguments and environment: multinode.py imports nothing that
    stages, starts, waits for, records or stops a launch, and touches no container but its probes."""
    tree = ast.parse((PACKAGE / "lifecycle" / "multinode.py").read_text())
    imported = {n.module.removeprefix("metralectl.") for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {f"lifecycle.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and n.module == "metralectl.lifecycle" for a in n.names}
    assert imported & LAUNCHING == set()
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert called & STARTING == set()
    assert called >= {"run_probe", "daemon_identity"}  # it asks the nodes what they are, through the same seam
