"""The runtime contract's fixtures: each real runtime, and a spec of the same workload (workload.py) for each.

`runtime_kind` is "docker" (the real DockerRuntime on $DOCKER_HOST, the workload in an image built FROM the engine
double's bundled image, which carries this machine's interpreter at its own path; marked `docker`, so it joins the
Docker tests' group and skips without a daemon, except under CI) or "process" (ProcessRuntime: the workload run by
this interpreter as a host process; no daemon needed). Every launch a test makes is named `metralectl-ct-*` and
removed afterwards, whatever the test did.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metralectl.core.labels import LABEL_MANAGED, LABEL_OWNER, LABEL_RECIPE, owner
from metralectl.core.render import ContainerSpec
from metralectl.seams.docker.protocol import ContainerRuntime
from tests.integration.conftest import docker_daemon  # noqa: F401  (the fixture, for the docker half)

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workload.py"
WORKLOAD_IMAGE = "metralectl-test/runtime-workload:latest"
IN_IMAGE = "/usr/local/lib/metralectl-workload/workload.py"
SpecFor = Callable[..., ContainerSpec]


def _workload_image() -> str:
    """The workload as a container: the engine double's bundled image (this machine's interpreter at its host
    path) plus workload.py as the entrypoint. Built locally, nothing pulled; a second build is Docker's cache."""
    sys.path.insert(0, str(HERE.parent / "docker_image"))
    import bundle

    base = bundle.build_bundled()
    interpreter = str(bundle._interpreter())
    bundle._docker_build(WORKLOAD_IMAGE, f"FROM {base}\nCOPY workload.py {IN_IMAGE}\n"
                                         f'ENTRYPOINT ["{interpreter}", "-u", "{IN_IMAGE}"]\nCMD []\n',
                         {"workload.py": WORKLOAD})
    return WORKLOAD_IMAGE


@pytest.fixture(scope="session")
def workload_image(docker_daemon: None) -> str:  # noqa: F811
    return _workload_image()


# The docker half is a Docker test (the Docker tests' xdist group, their skip rule); the process half needs no daemon.
@pytest.fixture(params=[pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.integration]), "process"])
def runtime_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
def launched() -> list[str]:
    """The names this test's launches have (removed at its end)."""
    return []


@pytest.fixture()
def runtime(runtime_kind: str, launched: list[str], request: pytest.FixtureRequest) -> Iterator[ContainerRuntime]:
    if runtime_kind == "docker":
        request.getfixturevalue("workload_image")
        from metralectl.seams.docker.runtime import DockerRuntime

        rt: ContainerRuntime = DockerRuntime()
    else:
        from metralectl.seams.process.runtime import ProcessRuntime

        rt = ProcessRuntime()
    try:
        yield rt
    finally:
        for name in launched:
            try:
                rt.remove(name, force=True)
            except Exception:  # noqa: BLE001 - cleanup: the test's own assertion is what matters
                pass
        rt.close()


@pytest.fixture()
def spec_for(runtime: ContainerRuntime, runtime_kind: str, launched: list[str]) -> SpecFor:
    """spec_for(*workload args, env=..., labels=..., name=...): a spec of the workload for this runtime."""

    def make(*args: str, env: dict[str, str] | None = None, labels: dict[str, str] | None = None,
             name: str | None = None) -> ContainerSpec:
        name = name or f"metralectl-ct-{uuid.uuid4().hex[:8]}"
        launched.append(name)
        base = {LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_RECIPE: "contract"}
        labels = base if labels is None else labels
        if runtime_kind == "docker":
            return ContainerSpec(name=name, image=WORKLOAD_IMAGE, command=tuple(args), env=dict(env or {}),
                                 labels=labels, gpus=None)
        exe = sys.executable
        return ContainerSpec(name=name, image=f"process:{exe}", command=(exe, "-u", str(WORKLOAD), *args),
                             env=dict(env or {}), labels=labels, gpus=None)

    return make


def proc_alive(pid: int) -> bool:
    """Whether a process runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")

