"""The ContainerRuntime contract, one suite run against both real runtimes: DockerRuntime on $DOCKER_HOST and
ProcessRuntime (engines as host processes). The same workload (workload.py) runs in each; what the lifecycle
relies on (launch, ps, logs, stop, swap, rm) must hold alike: a start is found by name and id with its labels and
owner, its log is tailed and followed, stop drains (the workload sees SIGTERM and finishes) or kills what ignores
SIGTERM once the timeout has passed, the exit code is kept until removal, removal refuses a running one without
force, `containers()` filters as `ps` and the launch's checks ask, and a removal by labels refuses wrong labels.

It holds on a busy machine (docs/development.md, "Tests that hold on a busy box"): each launch has a name of its
own (conftest.py), a test waits for what it can see (a log line, an exit), and a verdict is an outcome or an order
(drained: exit 0 and the workload's own "drained"; killed: 137 after its "SIGTERM ignored", not before the
timeout), never a time taken.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER, LABEL_RECIPE, LABEL_RUN_ID, owner
from metralectl.seams.docker.errors import RuntimeCause, RuntimeFailure
from metralectl.seams.docker.protocol import ContainerRuntime
from tests.contract.conftest import SpecFor


def _until(condition, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def test_start_inspect_logs_stop_drains_exit_code_remove(runtime: ContainerRuntime, spec_for: SpecFor) -> None:
    spec = spec_for()
    started = runtime.create_and_start(spec, {LABEL_RUN_ID: "run-1"})
    assert started.running and started.name == spec.name
    expected = {**spec.labels, LABEL_RUN_ID: "run-1"}
    assert {k: started.labels.get(k) for k in expected} == expected  # (a container adds its image's labels)
    assert started.managed and started.owner == owner()
    assert runtime.inspect(started.id) == runtime.inspect(spec.name)
    assert runtime.inspect(spec.name).running  # type: ignore[union-attr]
    assert started.started_at and started.started_at[:4].isdigit() and started.exit_code is None
    _until(lambda: "workload up" in runtime.log_tail(spec.name, 5))
    assert runtime.container_pids(started.id)

    stop = threading.Event()
    followed: list[str] = []
    for line in runtime.follow_logs(started.id, tail=1, stop=stop):
        followed.append(line)
        stop.set()
    assert followed == ["workload up"]

    runtime.stop(started.id, timeout_s=60)
    after = runtime.inspect(started.id)
    assert after is not None and after.status == "exited" and after.exit_code == 0, after  # drained, not killed
    assert after.finished_at and not after.oom_killed
    log = runtime.log_tail(started.id, 10)
    assert log[-2:] == ["SIGTERM seen, draining", "drained"], log
    assert list(runtime.follow_logs(started.id)) == ["workload up", "SIGTERM seen, draining", "drained"]
    assert runtime.wait_exit(started.id, 5) == 0
    assert runtime.container_pids(started.id) == set()
    runtime.remove(started.id)
    assert runtime.inspect(started.id) is None and runtime.inspect(spec.name) is None
    assert spec.name not in [c.name for c in runtime.containers()]


def test_a_workload_that_exits_3_at_start(runtime: ContainerRuntime, spec_for: SpecFor) -> None:
    spec = spec_for("--exit", "3")
    started = runtime.create_and_start(spec)
    assert runtime.wait_exit(started.id, 60) == 3
    after = runtime.inspect(spec.name)
    assert after is not None and after.status == "exited" and after.exit_code == 3 and not after.running
    assert runtime.log_tail(spec.name, 5) == ["workload up", "exiting with 3"]
    assert list(runtime.follow_logs(spec.name)) == ["workload up", "exiting with 3"]  # ends: it has exited
    runtime.stop(spec.name, timeout_s=1)  # stopping what has exited is no error
    assert runtime.inspect(spec.name).exit_code == 3  # type: ignore[union-attr]


def test_a_workload_that_ignores_sigterm_is_killed_after_the_timeout(runtime: ContainerRuntime,
                                                                     spec_for: SpecFor) -> None:
    spec = spec_for("--ignore-sigterm")
    started = runtime.create_and_start(spec)
    _until(lambda: "workload up" in runtime.log_tail(spec.name, 5))
    began = time.monotonic()
    runtime.stop(started.id, timeout_s=2)
    assert time.monotonic() - began >= 1.9  # not killed before the timeout (a busy machine only makes it longer)
    after = runtime.inspect(started.id)
    assert after is not None and after.status == "exited" and after.exit_code == 137, after
    assert "SIGTERM ignored" in runtime.log_tail(spec.name, 5)  # SIGTERM first, then the kill
    assert runtime.container_pids(started.id) == set()


def test_remove_refuses_a_running_one_unless_forced(runtime: ContainerRuntime, spec_for: SpecFor) -> None:
    spec = spec_for()
    started = runtime.create_and_start(spec)
    with pytest.raises(RuntimeFailure) as refused:
        runtime.remove(started.id)
    assert refused.value.cause is RuntimeCause.CONFLICT
    assert runtime.inspect(spec.name).running  # type: ignore[union-attr]
    runtime.remove(started.id, force=True)
    assert runtime.inspect(spec.name) is None


def test_a_second_start_under_a_taken_name_is_a_conflict(runtime: ContainerRuntime, spec_for: SpecFor) -> None:
    spec = spec_for()
    runtime.create_and_start(spec, {LABEL_RUN_ID: "first"})
    with pytest.raises(RuntimeFailure) as refused:
        runtime.create_and_start(spec, {LABEL_RUN_ID: "second"})
    assert refused.value.cause is RuntimeCause.CONFLICT
    assert [c.labels[LABEL_RUN_ID] for c in runtime.containers() if c.name == spec.name] == ["first"]


def test_containers_filters_managed_owner_and_state(runtime: ContainerRuntime, spec_for: SpecFor) -> None:
    mine = spec_for()
    theirs = spec_for(labels={LABEL_MANAGED: "true", LABEL_OWNER: "someone-else", LABEL_RECIPE: "contract"})
    helper = spec_for(labels={LABEL_OWNER: owner()})  # not an engine of ours: no managed label
    exited = spec_for("--exit", "0")
    for spec in (mine, theirs, helper, exited):
        runtime.create_and_start(spec)
    assert runtime.wait_exit(exited.name, 60) == 0

    def names(**kwargs: bool) -> set[str]:
        ours = {mine.name, theirs.name, helper.name, exited.name}
        return {c.name for c in runtime.containers(**kwargs)} & ours  # the daemon holds other tests' too

    assert names() == {mine.name, exited.name}
    assert names(all_states=False) == {mine.name}
    assert names(mine=False) == {mine.name, theirs.name, exited.name}
    assert names(managed_only=False) == {mine.name, theirs.name, helper.name, exited.name}
    assert names(managed_only=False, all_states=False) == {mine.name, theirs.name, helper.name}


def test_remove_if_labelled_refuses_wrong_labels(runtime: ContainerRuntime, spec_for: SpecFor) -> None:
    spec = spec_for()
    runtime.create_and_start(spec, {LABEL_RUN_ID: "this-run"})
    assert runtime.remove_if_labelled(spec.name, {LABEL_RUN_ID: "another-run"}) is False
    assert runtime.inspect(spec.name).running  # type: ignore[union-attr]
    assert runtime.remove_if_labelled(spec.name, {LABEL_RUN_ID: "this-run"}) is True
    assert runtime.inspect(spec.name) is None
    assert runtime.remove_if_labelled(spec.name, {LABEL_RUN_ID: "this-run"}) is False  # nothing left to remove


def test_kill_ends_it_at_once_with_137(runtime: ContainerRuntime, spec_for: SpecFor) -> None:
    spec = spec_for("--ignore-sigterm")
    started = runtime.create_and_start(spec)
    _until(lambda: "workload up" in runtime.log_tail(spec.name, 5))
    runtime.kill(started.id)
    assert runtime.wait_exit(started.id, 60) == 137
    assert runtime.inspect(started.id).exit_code == 137  # type: ignore[union-attr]


def test_unknown_names_are_nothing_to_act_on(runtime: ContainerRuntime) -> None:
    missing = "metralectl-ct-no-such-one"
    assert runtime.inspect(missing) is None and runtime.log_tail(missing) == []
    assert list(runtime.follow_logs(missing)) == [] and runtime.container_pids(missing) == set()
    runtime.stop(missing, timeout_s=1)
    runtime.kill(missing)
    runtime.remove(missing, force=True)
    assert runtime.remove_if_labelled(missing, {}) is False
    assert runtime.wait_exit(missing, 1) == 0  # as Docker answers for a container that is not there


def test_a_start_kept_off_the_gateways_cpus_runs_on_the_others_only(runtime: ContainerRuntime,
                                                                     spec_for: SpecFor) -> None:
    """spec.cpu_ids (box.yaml's gateway-cpus, lifecycle/placing.off_gateway_cpus): Docker's cpuset, a host process's
    affinity; the kernel's account of each of its processes says so."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: no other to keep a workload on")
    spec = replace(spec_for(), cpu_ids=(allowed[-1],))
    started = runtime.create_and_start(spec)
    try:
        _until(lambda: "workload up" in runtime.log_tail(spec.name, 5))
        pids = runtime.container_pids(started.id)
        assert pids
        for pid in pids:
            status = Path(f"/proc/{pid}/status").read_text()
            cpus = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                        if line.startswith("Cpus_allowed_list"))
            assert cpus == str(allowed[-1]), (pid, cpus)
    finally:
        runtime.kill(started.id)
        runtime.remove(started.id, force=True)
