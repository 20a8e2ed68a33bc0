"""The Change value (read from the agent's job body, as its page sends it), and a stop's one meaning
(app/serving.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from metralectl.app.serving import Change, MultiRank, Serving, Stopped, select_stop
from metralectl.core.render import LABEL_MANAGED, LABEL_OWNER, LABEL_RANK, LABEL_RECIPE, LABEL_RUN_ID, owner
from metralectl.errors import ExitCode, UsageError
from metralectl.lifecycle import deployment
from metralectl.lifecycle.launch import LaunchOptions
from metralectl.lifecycle.memory import NoMemoryWatch
from metralectl.seams.docker.containers import ContainerInfo
from tests.fakes.runtime import FakeRuntime


@pytest.mark.parametrize("body,change", [
    ({"kind": "run", "recipe": "r", "sets": ["serve.max-seq-len=4096"],
      "options": {"replace": True, "keep_failed": True, "stall_timeout_s": 12, "boot_timeout_s": 50,
                  "check_weights": False, "pull": False}},
     Change.run("r", ["serve.max-seq-len=4096"], LaunchOptions(replace=True, keep_failed=True, stall_timeout_s=12,
                                                               boot_timeout_s=50, check_weights=False, pull=False))),
    ({"kind": "run", "recipe": "r"}, Change.run("r")),
    ({"kind": "swap", "recipe": "r", "sets": ["a=1"], "drain_timeout_s": 7,
      "options": {"stall_timeout_s": 5, "boot_timeout_s": None, "pull": False}},
     Change.swap("r", ("a=1",), LaunchOptions(stall_timeout_s=5, boot_timeout_s=None, pull=False), drain_timeout_s=7)),
    ({"kind": "stop"}, Change.stop()), ({"kind": "stop", "recipe": "r", "all": True, "timeout_s": 2},
                                        Change.stop("r", all_=True, timeout_s=2)),
])
def test_a_job_body_reads_as_the_change_it_names(body: dict[str, Any], change: Change) -> None:
    assert Change.from_json(body) == change == Change.from_json(body, kind=change.kind)
    assert change.options.sets == change.sets  # recorded on the container, so a swap can restore it exactly


@pytest.mark.parametrize("make,named", [
    (lambda: Change("restart", "r"), "a change is one of run, swap, stop"),
    (lambda: Change("run"), "which recipe?"),
    (lambda: Change.swap("r", options=LaunchOptions(replace=True)), "replace and keep_failed are for run"),
    (lambda: Change("stop", sets=("a=1",)), "a stop takes no sets"),
    (lambda: Change.run("r", options=LaunchOptions(stall_timeout_s=-1)), "options.stall_timeout_s must be"),
    (lambda: Change("swap", "r", multi=MultiRank("w")), "only a run places"),
    (lambda: Change.from_json({"kind": "run", "recipe": "r", "worker": "ssh://w"}), "unknown key worker in the run body"),
    (lambda: Change.from_json({"kind": "swap", "recipe": "r"}, kind="run"), "kind must be run"),
    (lambda: Change.from_json(["run"]), "must be a JSON object"),
    (lambda: Change.from_json({"kind": "run", "recipe": "r", "options": {"drain_timeout_s": 1}}),
     "unknown key drain_timeout_s in the run options"),
])
def test_a_wrong_change_is_a_usage_error_naming_what(make: Any, named: str) -> None:
    with pytest.raises(UsageError) as refused:
        make()
    assert named in refused.value.message and refused.value.exit_code == ExitCode.USAGE


# -- multi-rank deployments: stopped whole by whoever stops them ------------------------------------------------
def _rank(rt: FakeRuntime, recipe: str, rank: int, run_id: str) -> ContainerInfo:
    name = f"metralectl-{recipe}-r{rank}"
    info = ContainerInfo(f"id-{name}", name, "img", "running", None, False, None, None,
                         {LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_RECIPE: recipe, LABEL_RANK: str(rank),
                          LABEL_RUN_ID: run_id})
    rt.seed(info)
    return info


def _deployment(rt: FakeRuntime, recipe: str = "ep2") -> deployment.Deployment:
    """A two-rank deployment whose ranks both answer on this fake daemon (as if the worker were local)."""
    url = rt.endpoint.url
    ranks = tuple(deployment.RankRecord(r, ("head", "worker")[r], url, "default", "", "box", c.name, c.id)
                  for r, c in ((r, _rank(rt, recipe, r, "run-1")) for r in (0, 1)))
    dep = deployment.Deployment("run-1", recipe, "ready", "http://127.0.0.1:9", "eth0", "10.0.0.1", 29500, ranks,
                                time.time())
    deployment.save(dep)
    return dep


def test_every_front_end_stops_every_rank(isolated_env: Any) -> None:
    """The agent used to refuse a multi-rank stop; Serving.stop — what the agent's job runs, as the CLI's
    and the dashboard's — stops every rank, the head first, and forgets the deployment."""
    rt = FakeRuntime()
    _deployment(rt)
    single = rt.serving("solo")
    assert [d.recipe for d in select_stop(rt, Change.stop("ep2"))[0]] == ["ep2"]
    deps, containers = select_stop(rt, Change.stop(all_=True))
    assert [d.recipe for d in deps] == ["ep2"] and [c.name for c in containers] == [single.name]  # ranks once
    agent_like = Serving(lock_held=True, runtime=lambda: rt, memory=lambda _rt: NoMemoryWatch())
    events: list[Any] = []
    stopped = agent_like.stop(Change.stop("ep2"), events.append)
    assert [(r.rank, r.role, r.result is not None and r.result.removed) for r in stopped.ranks] == [
        (0, "head", True), (1, "worker", True)]
    assert [e.detail for e in events] == ["metralectl-ep2-r0", "metralectl-ep2-r1"]
    assert deployment.load_all() == [] and [c.name for c in rt.all()] == [single.name]
    assert stopped.to_json()["ranks"][1]["result"]["removed"] is True  # what the agent's job records
    nothing = agent_like.stop(Change.stop("solo"), events.append)
    assert [c.name for c in nothing.containers] == [single.name] and rt.all() == []
    assert Stopped().to_json()["note"] == "nothing to stop"
