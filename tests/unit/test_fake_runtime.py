"""The shared fake keeps to the ContainerRuntime contract, and to the Docker behaviour the lifecycle relies on.

If the Protocol gains or changes a method, DockerRuntime and the fake must follow (the signature test fails
first); the behaviour tests pin what the launch and swap tests take for granted about the fake."""

from __future__ import annotations

import inspect
import threading
import time

import pytest

from metralectl.core.render import LABEL_MANAGED, LABEL_OWNER, ContainerSpec, owner
from metralectl.seams.docker.containers import ContainerInfo
from metralectl.seams.docker.errors import RuntimeFailure
from metralectl.seams.docker.protocol import ContainerRuntime
from metralectl.seams.docker.runtime import DockerRuntime
from metralectl.seams.process.runtime import ProcessRuntime
from tests.fakes.lifecycle import port_released
from tests.fakes.runtime import Boot, Exit, FakeRuntime, Listen, Log, engine_boot, image
from tests.ports import own_port

PROTOCOL_METHODS = sorted(name for name, value in vars(ContainerRuntime).items()
                          if callable(value) and not name.startswith("_") or name in ("__enter__", "__exit__"))


def _params(fn: object) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize("method", PROTOCOL_METHODS)
def test_both_runtimes_and_the_fake_have_the_protocols_signatures(method: str) -> None:
    expected = _params(getattr(ContainerRuntime, method))
    assert _params(getattr(DockerRuntime, method)) == expected
    assert _params(getattr(ProcessRuntime, method)) == expected
    assert _params(getattr(FakeRuntime, method)) == expected


def test_the_protocol_lists_what_callers_use() -> None:
    assert len(PROTOCOL_METHODS) >= 17 and {"create_and_start", "follow_logs", "wait_exit"} <= set(PROTOCOL_METHODS)
    assert isinstance(FakeRuntime(), ContainerRuntime) and isinstance(ProcessRuntime(), ContainerRuntime)


def _spec(name: str = "metralectl-x", port: int = 0) -> ContainerSpec:
    return ContainerSpec(name=name, image="metrale/x:latest", command=(), port=port,
                         labels={LABEL_MANAGED: "true", LABEL_OWNER: owner()})


def _rt(*boots: Boot) -> FakeRuntime:
    rt = FakeRuntime(images=[image("metrale/x:latest")])
    rt.script("metralectl-x", *boots)
    return rt


def test_follow_logs_gives_every_line_and_ends_when_the_container_exits() -> None:
    rt = _rt(Boot((Log("one"), Log("two", after_s=0.1), Exit(3, after_s=0.1))))
    started = rt.create_and_start(_spec())
    assert list(rt.follow_logs(started.id)) == ["one", "two"]
    assert rt.wait_exit(started.id, 5) == 3 and rt.inspect(started.id).status == "exited"  # type: ignore[union-attr]
    assert rt.log_tail(started.id, 1) == ["two"] and list(rt.follow_logs(started.id, tail=1)) == ["two"]


def test_follow_logs_ends_when_told_to_stop() -> None:
    rt = _rt(Boot((Log("one"),)))  # then runs for ever
    started = rt.create_and_start(_spec())
    stop = threading.Event()
    seen = []
    for line in rt.follow_logs(started.id, stop=stop):
        seen.append(line)
        stop.set()
    assert seen == ["one"] and rt.inspect(started.id).running  # type: ignore[union-attr]
    assert rt.wait_exit(started.id, 0.1) is None


def test_stop_kills_what_ignores_sigterm_after_the_timeout_and_remove_refuses_a_running_one() -> None:
    rt = _rt(Boot(sigterm_exit=None))
    started = rt.create_and_start(_spec())
    with pytest.raises(RuntimeFailure, match="cannot remove a running container"):
        rt.remove(started.id)
    rt.stop(started.id, timeout_s=0.2)
    after = rt.inspect(started.id)
    assert after is not None and after.status == "exited" and after.exit_code == 137
    rt.remove(started.id)
    assert rt.inspect(started.id) is None and rt.all() == []


def test_names_are_unique_and_images_must_be_present() -> None:
    rt = _rt(Boot())
    rt.create_and_start(_spec())
    with pytest.raises(RuntimeFailure, match="already in use"):
        rt.create_and_start(_spec())
    with pytest.raises(RuntimeFailure, match="image not found"):
        FakeRuntime().create_and_start(_spec())


def test_the_engines_port_is_bound_while_it_runs_and_freed_when_it_exits() -> None:
    port = own_port()
    rt = _rt(engine_boot("m"), Boot((Listen(),)))
    started = rt.create_and_start(_spec(port=port))
    assert rt.wait_exit(started.id, 0.5) is None and not port_released(port)
    rt.kill(started.id)
    assert port_released(port) and rt.health_of("metralectl-x") is None
    rt.remove(started.id)
    other = FakeRuntime(images=[image("metrale/x:latest")], default_boot=Boot((Listen(),)))
    squatter = other.create_and_start(_spec(port=port))
    deadline = time.monotonic() + 5  # the squatter's Listen runs on its own thread: it binds first
    while other.health_of("metralectl-x") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert other.health_of("metralectl-x") is not None
    rt.create_and_start(_spec(port=port))  # the second start of metralectl-x finds the port taken
    assert rt.wait_exit("metralectl-x", 5) == 1 and "Address already in use" in rt.log_tail("metralectl-x")[-1]
    other.remove(squatter.id, force=True)


def test_listing_keeps_to_the_owner_and_state_filters() -> None:
    rt = FakeRuntime()
    mine = rt.serving("a")
    theirs = rt.serving("b", owner_name="someone-else")
    rt.seed(ContainerInfo("x", "stopped", "img", "exited", 0, False, None, None, dict(mine.labels)))
    rt.seed(ContainerInfo("f", "foreign", "img", "running", None, False, None, None, {}))
    assert {c.name for c in rt.containers()} == {mine.name, "stopped"}
    assert {c.name for c in rt.containers(all_states=False)} == {mine.name}
    assert {c.name for c in rt.containers(mine=False)} == {mine.name, theirs.name, "stopped"}
    assert len(rt.containers(managed_only=False)) == 4


def test_pull_brings_what_the_registry_has_and_fails_loudly_otherwise() -> None:
    wanted = image("metrale/y:latest", "linux/arm64")
    rt = FakeRuntime(pullable=[wanted])
    progress: list[tuple[object, ...]] = []
    assert rt.pull_image(wanted.ref, lambda *a: progress.append(a)) == wanted
    assert rt.image_state(wanted.ref).present and progress[0] == ("abc123", "Downloading", 10, 100)
    with pytest.raises(RuntimeFailure, match="pulling metrale/z:latest failed"):
        rt.pull_image("metrale/z:latest")


def test_a_context_manager_closes_on_every_path() -> None:
    rt = FakeRuntime()
    with pytest.raises(KeyboardInterrupt):
        with rt:
            raise KeyboardInterrupt
    assert rt.closed == 1
