"""The three front ends change what is served through one API (app/serving.py).

Each of them — the CLI (`metralectl run/swap/stop` through cli.main, in-process), the dashboard
(CoreServices.perform, without the Textual app) and the agent (its local API and job runner on loopback,
reached by the CLI's own routed path) — runs the same story against the shared fake runtime
(tests/fakes/runtime.py, whose containers answer /health on loopback): run a recipe; swap to one whose
engine crashes while starting, so the swap rolls back; stop. The event sequences must be the same, event
for event (their timing-free fields), the failures the same message and exit code, and the fake daemons
must end the same (everything stopped and removed).
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metralectl import paths
from metralectl.cli.serve_cmds import _Progress as PRINTER
from metralectl.errors import MetralError
from metralectl.lifecycle import events as ev
from metralectl.lifecycle.memory import NoMemoryWatch
from metralectl.seams import machine
from metralectl.seams.hf import cache as hfcache, listing as hflisting
from tests.ports import own_port
from tests.fakes.runtime import PREFIX, Boot, Exit, FakeRuntime, Listen, Log, engine_boot, image

GB10_IMAGE = "metrale/metrale-inference-gb10:latest"
OLD, NEW = "fe-old", "fe-new"
CRASH = Boot((Log(PREFIX + "Metrale Engine starting..."), Listen(),
              Log("2026-08-26T05:35:05Z ERROR Error: Snapshot 'db821d7' has no weight files (metadata-only)",
                  after_s=0.05), Exit(1)))
TOKEN = "f" * 43


# -- the box: two user recipes on free ports, their weights verified, a fake daemon per front end ----------------
def _weights_complete(repo: str) -> None:
    """A verified snapshot in the HF cache, as `metralectl pull` leaves one."""
    commit = "0" * 40
    base = paths.hf_hub_cache() / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    listing = []
    for name, data in {"config.json": b"{}", "model.safetensors": b"\0" * 16}.items():
        (snap / name).write_bytes(data)
        listing.append(hflisting.RepoFile(name, len(data), hashlib.sha256(data).hexdigest()))
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, hflisting.Listing(repo, commit, tuple(listing)).to_json())


class Daemons:
    """One fake daemon per front end's story, scripted alike; `open_runtime()` hands out the current one."""

    def __init__(self) -> None:
        self.all: list[FakeRuntime] = []

    def fresh(self) -> FakeRuntime:
        rt = FakeRuntime(images=[image(GB10_IMAGE, "linux/arm64")])
        rt.script(f"metralectl-{OLD}", engine_boot("old/model"))  # the first start and the restore alike
        rt.script(f"metralectl-{NEW}", CRASH)
        self.all.append(rt)
        return rt

    def open_runtime(self, *_: Any, **__: Any) -> FakeRuntime:
        return self.all[-1]


@pytest.fixture()
def box(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemons]:
    """User recipes fe-old / fe-new (the shipped gb10 ones on ports the test owns, weights verified in the HF cache);
    every runtime the code opens is the current fake daemon."""
    from metralectl.core.catalog import load_catalog

    recipes = isolated_env / "config" / "recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    for name, base in ((OLD, "qwen3.5-27b"), (NEW, "qwen3.5-35b-a3b")):
        (recipes / f"{name}.yaml").write_text(f"extends: {base}\nname: {name}\ndescription: a front-end test\n"
                                              f"resources:\n  port: {own_port()}\n")
    catalog = load_catalog()
    assert {OLD, NEW} <= set(catalog.recipes), [str(r.path) for r in catalog.refused]
    for name in (OLD, NEW):
        _weights_complete(catalog.recipe(name).checkpoint.repo)
    monkeypatch.setattr(machine, "cpu_arch", lambda: "aarch64")  # the gb10 image is linux/arm64
    monkeypatch.setattr("metralectl.app.serving_direct.memory_watch", lambda runtime: NoMemoryWatch())
    daemons = Daemons()
    monkeypatch.setattr("metralectl.seams.docker.runtime.open_runtime", daemons.open_runtime)
    handler = signal.getsignal(signal.SIGTERM)  # the CLI turns SIGTERM into Ctrl-C for itself
    try:
        yield daemons
    finally:
        signal.signal(signal.SIGTERM, handler)


# -- what is compared ------------------------------------------------------------------------------------------
def key(event: Any) -> tuple[Any, ...] | None:
    """An event's fields that do not depend on timing; None for what arrives in timing-dependent numbers
    (engine log lines, /health answers while polling, transfer progress)."""
    if isinstance(event, (ev.LogLine, ev.Transfer)) or (isinstance(event, ev.Step) and event.name == "health"):
        return None
    if isinstance(event, ev.Step):
        return ("Step", event.name, event.detail)
    if isinstance(event, ev.Phase):
        return ("Phase", event.phase, event.line, event.rank)
    if isinstance(event, ev.ContainerStarted):
        return ("ContainerStarted", event.name)
    if isinstance(event, ev.Ready):
        return ("Ready", event.url, event.model)
    if isinstance(event, ev.Failed):
        return ("Failed", event.cause, event.message, event.remedy)
    if isinstance(event, ev.Warning_):
        return ("Warning", event.message)
    return (type(event).__name__, repr(event))


def sequence(events: list[Any]) -> list[tuple[Any, ...]]:
    return [k for k in map(key, events) if k is not None]


def final_state(rt: FakeRuntime) -> list[tuple[str, str]]:
    return sorted((c.name, c.status) for c in rt.all())


class Story:
    """One front end's run → swap (rolled back) → stop: the events of each step, the swap's failure."""

    def __init__(self) -> None:
        self.events: dict[str, list[Any]] = {"run": [], "swap": [], "stop": []}
        self.failure: tuple[str, int] | None = None
        self.served_after_swap: list[str] = []


# -- the three front ends ---------------------------------------------------------------------------------------
def cli_story(box: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Story, str]:
    """`metralectl run/swap/stop` as a user types them (cli.main, in-process); the events as its printer got them."""
    from metralectl.cli import main as cli_main
    from metralectl.cli import serve_cmds

    story, step = Story(), {"now": "run"}

    class Recording(PRINTER):  # the CLI's own printer, recording what it is handed
        def __call__(self, event: Any) -> None:
            story.events[step["now"]].append(event)
            super().__call__(event)

    monkeypatch.setattr(serve_cmds, "_Progress", Recording)
    rt = box.fresh()

    def cli(*args: str) -> int:
        try:
            cli_main.main(list(args))
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0

    assert cli("run", OLD, "--no-pull") == 0, capsys.readouterr().err
    step["now"] = "swap"
    code = cli("swap", NEW, "--no-pull")
    err = capsys.readouterr().err
    story.failure = (next(line for line in err.splitlines() if line.startswith("metralectl: ")), code)
    story.served_after_swap = [c.name for c in rt.all() if c.running]
    step["now"] = "stop"
    assert cli("stop", OLD) == 0, capsys.readouterr().err
    return story, err


def dashboard_story(box: Any) -> tuple[Story, MetralError]:
    """The dashboard's actions (CoreServices.perform, as its progress screen calls it, without the Textual app)."""
    from metralectl.tui.cancel import CancelToken
    from metralectl.tui.core_services import CoreServices

    story = Story()
    rt = box.fresh()
    services = CoreServices(bench=object())  # type: ignore[arg-type]
    assert services.perform("run", OLD, story.events["run"].append, CancelToken()).status == "done"
    with pytest.raises(MetralError) as failed:
        services.perform("swap", NEW, story.events["swap"].append, CancelToken())
    story.failure = (failed.value.message, failed.value.exit_code)
    story.served_after_swap = [c.name for c in rt.all() if c.running]
    stop_plan = services.plan("stop", None)  # the dashboard stops what its plan chose
    assert stop_plan.recipe == OLD and not stop_plan.blocked
    assert services.perform("stop", stop_plan.recipe, story.events["stop"].append, CancelToken()).status == "done"
    return story, failed.value


def agent_story(box: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Story, Story]:
    """The agent: its local API and job runner in this process, on loopback, driven by the CLI's routed path
    (the job body is Change.to_json()). Returns (the events the agent's jobs recorded, the ones the CLI got back)."""
    from metralectl.agent import security
    from metralectl.agent.api import LocalApiServer
    from metralectl.agent.jobs import JobRunner
    from metralectl.agent.ops import LifecycleOps
    from metralectl.agent.service import state_path
    from metralectl.seams.store import write_json

    rt = box.fresh()
    server = LocalApiServer(LifecycleOps(lambda: None), token=TOKEN, port=0, jobs=JobRunner(grace_s=0.3))
    server.start("test-front-ends")
    try:
        security.token_path().parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        security.token_path().write_text(TOKEN + "\n")
        os.chmod(security.token_path(), 0o600)
        write_json(state_path(), {"pid": os.getpid(), "api_port": server.port, "peer_port": None, "fingerprint": "x",
                                  "started": time.time()})
        routed, err = cli_story_on(rt, capsys, monkeypatch)
        assert "via the agent" in err
        jobs = server.jobs.list()
        assert [(j.kind, j.state) for j in jobs] == [("run", "done"), ("swap", "failed"), ("stop", "done")]
        recorded = Story()
        for job in jobs:
            recorded.events[job.kind] = [ev.from_json(e) for e in job.events]
        swap_job = jobs[1]
        recorded.failure = (swap_job.error or "", swap_job.exit_code or 0)
        recorded.served_after_swap = routed.served_after_swap
        return recorded, routed
    finally:
        server.stop()


def cli_story_on(rt: FakeRuntime, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> tuple[Story, str]:
    """cli_story against a daemon that is already current (the agent's)."""

    class Same:
        @staticmethod
        def fresh() -> FakeRuntime:
            return rt

    return cli_story(Same(), capsys, monkeypatch)


# -- the test ---------------------------------------------------------------------------------------------------
def test_cli_dashboard_and_agent_change_what_is_served_alike(box: Daemons, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cli, cli_err = cli_story(box, capsys, monkeypatch)
    dashboard, dashboard_error = dashboard_story(box)
    agent, routed = agent_story(box, capsys, monkeypatch)
    daemons = box.all
    assert len(daemons) == 3  # one fake daemon per front end

    # the story happened: a run, a swap that rolled back (its own failure, then the old model restored), a stop
    run = sequence(cli.events["run"])
    assert run[0][:2] == ("Step", "image") and ("ContainerStarted", f"metralectl-{OLD}") in run and run[-1][0] == "Ready"
    swap = sequence(cli.events["swap"])
    assert ("Failed", "empty-cache") == swap[[k[0] for k in swap].index("Failed")][:2]
    warnings = [k[1] for k in swap if k[0] == "Warning"]
    assert any(f"restoring {OLD}" in w for w in warnings) and swap[-1][0] == "Ready"
    assert sequence(cli.events["stop"]) == [("Step", "stopping", f"metralectl-{OLD}")]
    assert f"swap to {NEW} failed (empty-cache" in cli_err and f"the previous recipe {OLD} serves again" in cli_err

    # ... and it is the same story, event for event, whichever front end told it
    for name, other in (("dashboard", dashboard), ("agent (its jobs)", agent), ("CLI through the agent", routed)):
        for step in ("run", "swap", "stop"):
            assert sequence(other.events[step]) == sequence(cli.events[step]), f"{name}: {step}"
        assert other.served_after_swap == cli.served_after_swap == [f"metralectl-{OLD}"], name
    assert cli.failure is not None and cli.failure[1] == 1 == dashboard_error.exit_code == agent.failure[1]  # type: ignore[index]
    assert cli.failure[0] == f"metralectl: {dashboard_error.message}"  # type: ignore[index]
    assert agent.failure[0] == dashboard_error.message  # type: ignore[index]
    assert routed.failure == cli.failure

    # the daemons end alike: every container stopped and removed, the same containers created, in the same order
    assert [final_state(rt) for rt in daemons] == [[], [], []]
    created = [[spec.name for spec in rt.created] for rt in daemons]
    assert created[0] == [f"metralectl-{OLD}", f"metralectl-{NEW}", f"metralectl-{OLD}"]
    assert created[1] == created[0] and created[2] == created[0]
