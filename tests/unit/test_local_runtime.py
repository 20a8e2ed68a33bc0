"""This machine's runtime: its Docker containers and its host processes as one ContainerRuntime
(lifecycle/local_runtime.py), so every reader finds a host process, and run/swap/stop act on it, by the code
they use for containers."""

from __future__ import annotations

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


def test_a_host_process_is_one_model_of_the_box() -> None:
    """A container cannot be run beside a served host process without --replace (the same refusal as for
    two containers), and `stop` finds the host process when only it serves."""
    cat = catalog()
    docker, procs = FakeRuntime(images=[image(cat.image_for(cat.recipe("demo-cpu")).ref)]), FakeRuntime(endpoint=PROCESS)
    procs.serving(LLAMA)
    serving = _serving(docker, procs)
    with pytest.raises(MetralError, match="already being served"):
        serving.run(Change.run("demo-cpu"), lambda e: None)
    stopped = serving.stop(Change.stop(), lambda e: None)
    assert [r.recipe for r in stopped.containers] == [LLAMA]
    assert not [c for c in procs.all() if c.running]
