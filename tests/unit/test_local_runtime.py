"""This machine's runtime: its Docker containers and its host processes as one ContainerRuntime
(lifecycle/local_runtime.py), so every reader finds a host process, and run/swap/stop act on it, by the code
they use for containers."""

from __future__ import annotations

from pathlib import Path

import pytest

from metralectl.app.serving import Change, Serving
from metralectl.core.overrides import apply_sets
from metralectl.errors import MetralError
from metralectl.lifecycle.local_runtime import LocalRuntime, open_local
from metralectl.lifecycle.specs import spec_here
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import DockerUnavailable
from tests.fakes.runtime import FakeRuntime, image
from tests.unit.recipe_helpers import catalog

PROCESS = Endpoint("process://local", "process")
LLAMA = "qwen3.5-35b-a3b-llamacpp"


def _unreachable() -> FakeRuntime:
    raise DockerUnavailable("not-running", "nothing listens at /var/run/docker.sock", "start the daemon")


def test_engines_of_both_runtimes_are_listed_and_each_call_goes_to_its_holder() -> None:
    docker, procs = FakeRuntime(), FakeRuntime(endpoint=PROCESS)
    container = docker.serving("a")
    process = procs.serving("b")
    local = LocalRuntime(docker, procs)
    assert {c.name for c in local.containers()} == {container.name, process.name}
    assert local.endpoint is docker.endpoint
    assert local.inspect(process.id) == process and local.inspect(container.name) == container
    local.stop(process.id, timeout_s=0.1)
    assert [c[0] for c in procs.calls if c[0] == "stop"] == ["stop"] and not [c for c in docker.calls if c[0] == "stop"]
    local.remove(container.id, force=True)
    assert docker.removed == [container.id] and procs.removed == []


def test_a_spec_starts_where_its_image_says() -> None:
    cat = catalog()
    docker = FakeRuntime(images=[image(cat.image_for(cat.recipe("demo-cpu")).ref)])
    procs = FakeRuntime(endpoint=PROCESS, images=[image("process:/opt/llama-server")])
    local = LocalRuntime(docker, procs)
    recipe = apply_sets(cat, cat.recipe(LLAMA), ["runtime=process"])
    local.create_and_start(spec_here(cat, recipe, program="/opt/llama-server"))
    local.create_and_start(spec_here(cat, cat.recipe("demo-cpu")))
    assert [s.image for s in procs.created] == ["process:/opt/llama-server"]
    assert [s.name for s in docker.created] == ["metralectl-demo-cpu"]


def test_without_docker_the_host_processes_alone_and_docker_s_error_for_what_needs_it() -> None:
    procs = FakeRuntime(endpoint=PROCESS)
    served = procs.serving("b")
    local = open_local(docker=_unreachable, processes=lambda: procs)
    assert local.docker is None and local.endpoint is procs.endpoint
    assert local.containers() == [served]
    with pytest.raises(DockerUnavailable, match="nothing listens"):
        local.image_state("metrale/x:1")
    assert local.inspect("not-there") is None  # asking about what is not a host process needs no Docker


def test_without_docker_and_no_host_process_opening_says_docker_s_error_as_before() -> None:
    procs = FakeRuntime(endpoint=PROCESS)
    with pytest.raises(DockerUnavailable):
        open_local(docker=_unreachable, processes=lambda: procs)
    assert procs.closed == 1
    assert open_local(need_docker=False, docker=_unreachable, processes=lambda: procs).containers() == []


def test_closing_closes_both() -> None:
    docker, procs = FakeRuntime(), FakeRuntime(endpoint=PROCESS)
    with LocalRuntime(docker, procs):
        pass
    assert docker.closed == procs.closed == 1


def _serving(docker: FakeRuntime | None, procs: FakeRuntime) -> Serving:
    factory = (lambda: LocalRuntime(docker, procs)) if docker is not None else \
        (lambda: LocalRuntime(None, procs, MetralError("no Docker")))
    return Serving(catalog=catalog, runtime=factory)


def test_a_host_process_holds_its_share_of_the_box() -> None:
    """A container that does not fit the budget beside a served host process is refused with the numbers (the
    same refusal as beside a container), and `stop` finds the host process when only it serves."""
    from metralectl import paths

    (paths.config_dir() / "box.yaml").write_text("budget: 1.5\n")
    cat = catalog()
    docker, procs = FakeRuntime(images=[image(cat.image_for(cat.recipe("demo-cpu")).ref)]), FakeRuntime(endpoint=PROCESS)
    procs.serving(LLAMA)
    serving = _serving(docker, procs)
    with pytest.raises(MetralError, match=f"demo-cpu needs 0.54 GB, but the footprint of what serves is not known: "
                                          f"{LLAMA}: unknown") as refused:
        serving.run(Change.run("demo-cpu"), lambda e: None)
    assert "`metralectl run demo-cpu --replace`" in (refused.value.hint or "")
    assert f"`metralectl stop {LLAMA}`" in (refused.value.hint or "")
    stopped = serving.stop(Change.stop(), lambda e: None)
    assert [r.recipe for r in stopped.containers] == [LLAMA]
    assert not [c for c in procs.all() if c.running]


def test_where_no_engine_ever_ran_as_a_process_the_process_runtime_is_not_loaded(isolated_env: Path) -> None:
    """`ps` pays nothing for host processes until one ran here; the directory it looks for is the runtime's own."""
    from metralectl.lifecycle.local_runtime import has_process_states
    from metralectl.seams.process.state import states_dir

    assert Path(states_dir().root) == isolated_env / "metrale" / "state" / "processes"
    assert not has_process_states()
    docker = FakeRuntime()
    local = open_local(docker=lambda: docker)
    assert local.containers() == [] and local._processes is None
    local.close()
    assert docker.closed == 1
    (isolated_env / "metrale" / "state" / "processes").mkdir(parents=True)
    assert has_process_states() and open_local(docker=lambda: docker).processes is not None


def test_a_swap_crosses_from_a_container_to_a_host_process_and_rolls_back_to_the_container(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The swap's code is the runtime's contract: the old container stops through Docker, the new host process
    starts through the process runtime on the served address; one that fails gives way to the container again."""
    from metralectl.lifecycle.launch import LaunchOptions, launch
    from metralectl.lifecycle.swap import SwapRolledBack, swap
    from metralectl.seams import machine
    from tests.fakes.lifecycle import gb10_runtime, on_port
    from tests.fakes.runtime import PREFIX, Boot, Exit, Listen, Log, engine_boot
    from tests.ports import own_port

    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64
    cat, port, program = catalog(), own_port(), tmp_path / "bin" / "met"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(program.parent))  # found where `run` finds it: the fake runtime starts nothing
    docker = gb10_runtime()
    procs = FakeRuntime(endpoint=PROCESS, images=[image(f"process:{program}")])
    docker.script("metralectl-qwen3.5-27b", engine_boot("old/model"))
    procs.script("metralectl-qwen3.5-35b-a3b", engine_boot("new/model"),
                 Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(), Log("Error: no weights", after_s=0.05),
                       Exit(1))))
    local = LocalRuntime(docker, procs)
    old, sets = on_port(cat, "qwen3.5-27b", port)
    options = LaunchOptions(check_weights=False, pull=False)
    launch(old, cat, local, options=LaunchOptions(check_weights=False, pull=False, sets=tuple(sets)))
    new = apply_sets(cat, cat.recipe("qwen3.5-35b-a3b"), ["runtime=process"])
    result = swap(new, ["runtime=process"], cat, local, options=options)
    assert result.outcome == "swapped" and result.url == f"http://127.0.0.1:{port}" and result.model == "new/model"
    assert [c.name for c in docker.all() if c.running] == [] and procs.created[0].image == f"process:{program}"
    back = swap(old, sets, cat, local, options=options)  # and back into a container
    assert back.outcome == "swapped" and [c.name for c in procs.all() if c.running] == []
    with pytest.raises(SwapRolledBack, match="the previous recipe qwen3.5-27b serves again"):
        swap(new, ["runtime=process"], cat, local, options=options)  # this start fails: the container again
    assert [c.name for c in docker.all() if c.running] == ["metralectl-qwen3.5-27b"]
    assert [c.name for c in procs.all() if c.running] == []
