"""The agent's job API, the one its page drives (and a peer's benchmark unit beside it): request bodies, the
events long-poll, cancel (cooperative: the job's token), busy, against a real LocalApiServer on loopback with
fake operations; the event JSON the page reads; finding the running agent. And the CLI beside a running agent:
it changes what is served itself, under the lifecycle lock, and is refused (75, the holder named) while one of
the agent's jobs holds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metralectl import cancel
from metralectl.agent import security
from metralectl.agent.api import LocalApiServer
from metralectl.agent.jobs import JobRunner
from metralectl.app.agent_client import AgentClient, AgentGone, NotOurAgent, running_agent
from metralectl.errors import ExitCode, MetralError
from metralectl.lifecycle import events as ev
from metralectl.seams.store import lifecycle_lock
from tests.ports import own_port

REPO = Path(__file__).resolve().parents[2]
TOKEN = "r" * 43
RECIPE = "qwen3.5-35b-a3b"
LAUNCHED = {"run_id": "20250101-000000-abcdef", "recipe": RECIPE, "container": f"metralectl-{RECIPE}",
            "container_id": "c0ffee", "url": "http://127.0.0.1:8888", "model": "Sehyo/Qwen3.5-35B-A3B-NVFP4",
            "ready_s": 12.5, "phases": {"loading": 1.0, "capturing-graphs": 9.5, "ready": 12.5}, "log_path": "/x.log",
            "ready_at": 1767225600.25, "already_serving": False}
SWAPPED = {"from_recipe": "old", "to_recipe": RECIPE, "outcome": "swapped", "downtime_s": 3.0,
           "phases": {"drain": 0.5, "stop": 1.0, "boot": 1.5}, "message": "", "url": "http://127.0.0.1:8888",
           "model": "m"}
STOPPED = {"name": f"metralectl-{RECIPE}", "recipe": RECIPE, "exit_code": 0, "killed": False, "removed": True,
           "stop_s": 1.25, "memory": "returned"}
ACTIVE = ("starting", "running")


class FakeOps:
    """Fake operations: record what reaches them; `mode` picks how run behaves. They wait as the lifecycle does,
    through metralectl.cancel (its sleep ends at the job's cancel), so a cancel reaches them as it reaches a launch."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.mode = "ready"  # ready | gated | chatty | silent | burst
        self.gate = threading.Event()
        self.interrupted = threading.Event()
        self.check_error: MetralError | None = None

    def capability(self) -> dict[str, Any]:
        return {"can_run": True, "summary": "fake", "problems": [], "checks": []}

    def serving(self) -> dict[str, Any]:
        return {"serving": []}

    def recipes(self) -> dict[str, Any]:
        return {"recipes": []}

    def telemetry(self) -> dict[str, Any]:
        return {"available": False}

    def history(self) -> dict[str, Any]:
        return {"runs": []}

    def check(self, change: Any) -> None:
        self.calls.append(("check", change.recipe, list(change.sets)))
        if self.check_error is not None:
            raise self.check_error

    def apply(self, change: Any, on_event: Any) -> Any:
        """The Change read from the job body (Change.from_json), as LifecycleOps gets it."""
        from metralectl.app.serving_change import RUN_OPTIONS, SWAP_OPTIONS

        options = {k: getattr(change.options, k) for k in (RUN_OPTIONS if change.kind == "run" else SWAP_OPTIONS)}
        if change.kind == "run":
            return self.run(change.recipe, on_event, sets=change.sets, options=options)
        if change.kind == "swap":
            return self.swap(change.recipe, on_event, sets=change.sets, drain_timeout_s=change.drain_timeout_s,
                             options=options)
        return self.stop(change.recipe, on_event, all_=change.all_, timeout_s=change.stop_timeout_s)

    def run(self, recipe: str, on_event: Any, *, sets: Any = (), options: Any = None) -> Any:
        self.calls.append(("run", recipe, list(sets), dict(options or {})))
        try:
            on_event(ev.Step("image", "metrale/metrale:test"))
            if self.mode == "gated":
                self.gate.wait(10)
                on_event(ev.Step("starting", "second"))
                self.gate.clear()
                self.gate.wait(10)
            elif self.mode == "burst":
                for i in range(60):
                    on_event(ev.LogLine(f"line {i}"))
            elif self.mode == "chatty":
                while True:
                    on_event(ev.LogLine("loading ..."))
                    time.sleep(0.02)
            elif self.mode == "silent":  # an engine loading without a word: no event for a long while
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    cancel.sleep(0.05)  # a readiness wait's tick
            on_event(ev.Phase("loading", "loading model", 1.0))
            on_event(ev.Ready(LAUNCHED["url"], LAUNCHED["model"], 12.5))
            return dict(LAUNCHED)
        except KeyboardInterrupt:
            self.interrupted.set()
            on_event(ev.Step("cleanup", "removed the half-started container"))
            raise

    def swap(self, recipe: str, on_event: Any, *, sets: Any = (), drain_timeout_s: float = 60.0,
             options: Any = None) -> Any:
        self.calls.append(("swap", recipe, list(sets), drain_timeout_s, dict(options or {})))
        on_event(ev.Step("staging", f"{recipe} while old serves"))
        return dict(SWAPPED)

    def stop(self, recipe: str | None, on_event: Any, *, all_: bool = False, timeout_s: float = 30.0) -> Any:
        self.calls.append(("stop", recipe, all_, timeout_s))
        if recipe == "nothing":
            return {"stopped": [], "note": "nothing to stop"}
        on_event(ev.Step("stopping", STOPPED["name"]))
        return {"stopped": [dict(STOPPED)]}


class Api:
    """The job API as the page calls it (POST /api/KIND with the bearer token, GET .../events, POST .../cancel)."""

    def __init__(self, port: int, token: str = TOKEN) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.headers = {"Authorization": f"Bearer {token}"}

    def post(self, path: str, body: Any) -> httpx.Response:
        return httpx.post(self.base + path, json=body, headers=self.headers, timeout=10, trust_env=False)

    def start(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.post(f"/api/{kind}", body)
        assert answer.status_code == 202, (answer.status_code, answer.text)
        return dict(answer.json())

    def events(self, job_id: str, after: int, wait_s: float) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        answer = httpx.get(f"{self.base}/api/jobs/{job_id}/events?after={after}&wait={wait_s:g}",
                           timeout=wait_s + 10, trust_env=False)
        assert answer.status_code == 200, answer.text
        value = answer.json()
        return value["events"], value["job"], value["missed"]

    def cancel(self, job_id: str) -> dict[str, Any]:
        answer = self.post(f"/api/jobs/{job_id}/cancel", {})
        assert answer.status_code in (200, 202), answer.text
        return dict(answer.json())

    def follow(self, job: dict[str, Any], wait_s: float = 5) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Every event until the job ends, as the page follows it: (the ended job, its events)."""
        seen: list[dict[str, Any]] = []
        while True:
            events, job, _ = self.events(str(job["id"]), seen[-1]["seq"] if seen else 0, wait_s)
            seen += events
            if job["state"] not in ACTIVE:
                return job, seen


@pytest.fixture()
def agent() -> Iterator[tuple[LocalApiServer, FakeOps, Api]]:
    ops = FakeOps()
    server = LocalApiServer(ops, token=TOKEN, port=0, jobs=JobRunner())
    server.start("test-jobs-api")
    try:
        yield server, ops, Api(server.port)
    finally:
        ops.gate.set()
        server.stop()


# -- bodies -------------------------------------------------------------------------------------------
def test_options_and_sets_reach_the_operations(agent: tuple[LocalApiServer, FakeOps, Api]) -> None:
    _, ops, api = agent
    options = {"replace": True, "keep_failed": True, "stall_timeout_s": 12, "boot_timeout_s": None,
               "check_weights": False, "pull": False}
    job = api.start("run", {"recipe": RECIPE, "sets": ["max-seq-len=4096"], "options": options})
    assert api.follow(job)[0]["state"] == "done"
    swap_opts = {"stall_timeout_s": 5.5, "boot_timeout_s": 100, "check_weights": True, "pull": False}
    api.follow(api.start("swap", {"recipe": RECIPE, "sets": [], "drain_timeout_s": 7, "options": swap_opts}))
    api.follow(api.start("stop", {"recipe": None, "all": True, "timeout_s": 2}))
    api.follow(api.start("run", {"recipe": "page-body"}))  # the page sends just {recipe}
    defaults = {"replace": False, "keep_failed": False, "stall_timeout_s": 300.0, "boot_timeout_s": None,
                "check_weights": True, "pull": True}
    assert ops.calls == [
        ("check", RECIPE, ["max-seq-len=4096"]),
        ("run", RECIPE, ["max-seq-len=4096"], {**options, "stall_timeout_s": 12.0}),
        ("check", RECIPE, []),
        ("swap", RECIPE, [], 7.0, {**swap_opts, "boot_timeout_s": 100.0}),
        ("stop", None, True, 2.0),
        ("check", "page-body", []),
        ("run", "page-body", [], defaults),  # what the body leaves out is the CLI's default
    ]


@pytest.mark.parametrize("kind,body,named", [
    ("run", {"recipe": RECIPE, "replce": True}, "unknown key replce in the run body; valid: recipe, sets, options"),
    ("run", {"recipe": RECIPE, "options": {"drain_timeout_s": 1}}, "unknown key drain_timeout_s in the run options"),
    ("swap", {"recipe": RECIPE, "options": {"replace": True}}, "unknown key replace in the swap options; valid: "
                                                                "stall_timeout_s"),
    ("stop", {"recipe": RECIPE, "sets": []}, "unknown key sets in the stop body; valid: recipe, all, timeout_s"),
    ("run", {"recipe": RECIPE, "sets": "max-seq-len=1"}, "sets must be a list"),
    ("run", {"recipe": RECIPE, "sets": [1]}, "sets must be a list"),
    ("run", {"recipe": RECIPE, "options": {"replace": "yes"}}, "options.replace must be true or false"),
    ("run", {"recipe": RECIPE, "options": {"pull": 1}}, "options.pull must be true or false"),
    ("run", {"recipe": RECIPE, "options": {"stall_timeout_s": -1}}, "options.stall_timeout_s must be a number"),
    ("run", {"recipe": RECIPE, "options": {"stall_timeout_s": None}}, "options.stall_timeout_s must be a number"),
    ("run", {"recipe": RECIPE, "options": {"boot_timeout_s": True}}, "options.boot_timeout_s must be a number"),
    ("run", {"recipe": RECIPE, "options": []}, "options must be an object"),
    ("swap", {"recipe": RECIPE, "drain_timeout_s": "60"}, "drain_timeout_s must be a number"),
    ("stop", {"all": "true"}, "all must be true or false"),
    ("stop", {"timeout_s": -3}, "timeout_s must be a number"),
    ("run", {}, "which recipe?"),
    ("swap", {"recipe": ""}, "recipe must be a recipe name"),
    ("stop", {"recipe": 3}, "recipe must be a recipe name"),
])
def test_bad_bodies_are_refused_naming_the_key(agent: tuple[LocalApiServer, FakeOps, Api], kind: str,
                                               body: dict[str, Any], named: str) -> None:
    server, ops, api = agent
    refused = api.post(f"/api/{kind}", body)
    assert refused.status_code == 400 and named in refused.json()["error"]
    assert refused.json()["exit_code"] == ExitCode.USAGE
    assert server.jobs.list() == [] and not [c for c in ops.calls if c[0] != "check"]


def test_a_bad_set_is_refused_with_the_checkers_message_before_a_job(agent: tuple[LocalApiServer, FakeOps, Api]) -> None:
    from metralectl.agent.ops import LifecycleOps
    from metralectl.app.serving import Change

    server, ops, api = agent
    real = LifecycleOps(lambda: None)
    for sets in (["nonsense=1"], ["max-seq-len=banana"]):
        try:
            real.check(Change.run(RECIPE, sets))
        except MetralError as exc:
            ops.check_error = exc
        else:
            pytest.fail(f"{sets} passed the checker")
        refused = api.post("/api/run", {"recipe": RECIPE, "sets": sets})
        assert refused.status_code == 400 and ops.check_error.message in refused.json()["error"]
        assert refused.json()["exit_code"] == ops.check_error.exit_code
    assert server.jobs.list() == []
    with pytest.raises(MetralError, match="no-such-recipe"):
        real.check(Change.run("no-such-recipe"))


# -- the long-poll ---------------------------------------------------------------------------------------
def test_long_poll_answers_promptly_on_a_new_event_and_on_the_end(agent: tuple[LocalApiServer, FakeOps, Api]) -> None:
    _, ops, api = agent
    ops.mode = "gated"
    job = api.start("run", {"recipe": RECIPE})
    events, state, _ = api.events(job["id"], 0, 5)
    assert [e["seq"] for e in events] == [1] and state["state"] == "running"
    threading.Timer(0.3, ops.gate.set).start()
    started = time.monotonic()
    events, _, _ = api.events(job["id"], 1, 10)
    assert 0.2 < time.monotonic() - started < 6.0  # on the event (0.3 s), not at the 10 s wait's end
    assert [(e["seq"], e["kind"], e["detail"]) for e in events] == [(2, "Step", "second")]
    started = time.monotonic()
    events, state, _ = api.events(job["id"], 2, 0.3)  # nothing new within wait: an empty answer
    assert events == [] and 0.25 < time.monotonic() - started < 6.0 and state["state"] == "running"
    threading.Timer(0.3, ops.gate.set).start()
    started = time.monotonic()
    events, state, _ = api.events(job["id"], 2, 10)
    while state["state"] == "running":  # the last events may come a moment before the end
        more, state, _ = api.events(job["id"], events[-1]["seq"] if events else 2, 10)
        events += more
    assert time.monotonic() - started < 6.0  # on the end, not at the 10 s wait's end
    assert state["state"] == "done" and state["exit_code"] == 0 and state["result"] == LAUNCHED
    assert [e["kind"] for e in events] == ["Phase", "Ready"]


def test_after_resumes_without_duplicates_or_gaps(agent: tuple[LocalApiServer, FakeOps, Api]) -> None:
    _, ops, api = agent
    ops.mode = "burst"
    job = api.start("run", {"recipe": RECIPE})
    while api.events(job["id"], 0, 0)[1]["state"] == "running":
        time.sleep(0.01)
    seen: list[int] = []
    after = 0
    for _ in range(100):  # resume from wherever the last answer ended, in small bites
        events, state, missed = api.events(job["id"], after, 0)
        assert missed == 0
        bite = events[:7]
        seen += [e["seq"] for e in bite]
        if not bite:
            break
        after = bite[-1]["seq"]
    assert seen == list(range(1, 64))  # image step + 60 lines + phase + ready, in order, once each
    assert seen[-1] == state["last_seq"]
    assert api.events(job["id"], 30, 0)[0][0]["seq"] == 31


# -- cancel ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["chatty", "silent"])
def test_cancel_turns_a_running_job_into_cancelled(agent: tuple[LocalApiServer, FakeOps, Api], mode: str) -> None:
    """At the next event when it emits; at its wait's next tick when it is silent (the job's token)."""
    _, ops, api = agent
    ops.mode = mode
    job = api.start("run", {"recipe": RECIPE})
    time.sleep(0.2)
    started = time.monotonic()
    answer = api.cancel(job["id"])
    assert answer["cancel_requested"] is True
    final, events = api.follow(answer)
    assert time.monotonic() - started < 4.0  # the next event or wait tick, not the follow's 5 s wait
    assert ops.interrupted.is_set()  # the fake's cleanup ran, as on Ctrl-C
    assert (final["state"], final["exit_code"]) == ("cancelled", 130)
    assert final["error"] == "cancelled by a client; what it had started was cleaned up"
    events, _, _ = api.events(job["id"], 0, 0)
    assert events[-1]["kind"] == "Step" and events[-1]["name"] == "cleanup"  # the cleanup's events are kept
    assert api.cancel(job["id"])["state"] == "cancelled"  # cancelling an ended job: just its state


def test_stopping_the_server_cancels_a_running_job() -> None:
    ops = FakeOps()
    ops.mode = "silent"
    server = LocalApiServer(ops, token=TOKEN, port=0, jobs=JobRunner())
    server.start("test-stop")
    job = Api(server.port).start("run", {"recipe": RECIPE})
    server.stop()
    state = server.jobs.get(job["id"])
    assert state is not None and state.state == "cancelled" and ops.interrupted.is_set()
    assert state.error == "cancelled by the agent stopping; what it had started was cleaned up"


def test_busy_is_409_naming_the_holder(agent: tuple[LocalApiServer, FakeOps, Api]) -> None:
    server, _, api = agent
    with lifecycle_lock("swap to x"):
        busy = api.post("/api/run", {"recipe": RECIPE})
    assert busy.status_code == 409 and "busy: swap to x" in busy.json()["error"]
    assert busy.json()["exit_code"] == 75 and server.jobs.list() == []


def test_the_page_is_told_what_change_is_in_progress_whoever_started_it(
        agent: tuple[LocalApiServer, FakeOps, Api]) -> None:
    """A CLI command's change is not one of the agent's jobs: GET /api/serving names the lifecycle lock's holder, so
    the page says what is happening; the holder is written by any local user's metralectl, so it is escaped."""
    _, _, api = agent

    def in_progress() -> Any:
        return httpx.get(api.base + "/api/serving", timeout=10, trust_env=False).json()["in_progress"]

    assert in_progress() is None
    with lifecycle_lock("run qwen3-8b \x1b[2J"):
        assert in_progress() == f"run qwen3-8b \\x1b[2J (pid {os.getpid()})"
    assert in_progress() is None


# -- the event JSON the page reads ----------------------------------------------------------------------------
def test_every_event_is_a_json_document_the_page_reads() -> None:
    from metralectl.core.images import LayerProgress
    from metralectl.seams.hf.steps import PullEvent

    samples: list[tuple[ev.Event, dict[str, Any]]] = [
        (ev.Step("image", "ref"), {"kind": "Step", "name": "image", "detail": "ref"}),
        (ev.Warning_("careful"), {"kind": "Warning", "message": "careful"}),
        (ev.ContainerStarted("n", "id", "run"), {"kind": "ContainerStarted", "name": "n", "container_id": "id",
                                                 "run_id": "run"}),
        (ev.Phase("loading", "loading x", 1.5, rank=1), {"kind": "Phase", "phase": "loading", "line": "loading x",
                                                         "elapsed_s": 1.5, "rank": 1}),
        (ev.LogLine("a line"), {"kind": "LogLine", "line": "a line", "rank": None}),
        (ev.Ready("http://127.0.0.1:8888", None, 3.25), {"kind": "Ready", "url": "http://127.0.0.1:8888",
                                                         "model": None, "elapsed_s": 3.25}),
        (ev.Failed("oom", "out of memory", "lower it", ("a", "b")), {"kind": "Failed", "cause": "oom",
                                                                     "message": "out of memory", "remedy": "lower it",
                                                                     "last_lines": ["a", "b"]}),
        (ev.Transfer("image", LayerProgress("ref", "abc", "Downloading", 10, 100)),
         {"kind": "Transfer", "transfer": "image", "progress": {"ref": "ref", "layer": "abc", "status": "Downloading",
                                                                 "current": 10, "total": 100}}),
    ]
    assert {type(e) for e, _ in samples} | {ev.Transfer} == set(ev.Event.__subclasses__())
    for event, expected in samples:
        assert json.loads(json.dumps(ev.to_json(event))) == expected
    weights = ev.to_json(ev.Transfer("weights", PullEvent("org/repo", "download", 5, 10, 1.0, 5.0, 1, 2, "")))
    assert weights["transfer"] == "weights" and weights["progress"]["repo"] == "org/repo"


# -- finding the agent (for `peer units --cancel`, what only the agent can do) ----------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _record_agent(port: int, pid: int) -> None:
    from metralectl.agent.service import state_path
    from metralectl.seams.store import write_json

    security.load_or_create_token()
    write_json(state_path(), {"pid": pid, "api_port": port, "peer_port": None, "fingerprint": "x",
                              "started": time.time()})


def test_discovery(isolated_env: Path) -> None:
    assert running_agent() is None  # none recorded
    _record_agent(8897, os.getpid())
    client = running_agent()
    assert client is not None and client.port == 8897 and client.pid == os.getpid()
    assert client.token == security.load_or_create_token()
    os.chmod(security.token_path(), 0o644)  # an unsafe token file: no agent to talk to
    assert running_agent() is None
    os.chmod(security.token_path(), 0o600)
    _record_agent(8897, _dead_pid())
    assert running_agent() is None


def test_an_unreachable_agent(isolated_env: Path) -> None:
    port = own_port()  # a port nothing listens on (held: nobody else can start listening there)
    with pytest.raises(AgentGone):  # its process is gone
        AgentClient(port, TOKEN, _dead_pid()).cancel_unit("k")
    with pytest.raises(MetralError) as stuck:  # alive but not answering: say so, and how to look at it
        AgentClient(port, TOKEN, os.getpid()).cancel_unit("k")
    assert not isinstance(stuck.value, AgentGone)
    assert f"the agent (pid {os.getpid()}, http://127.0.0.1:{port}/) does not answer" in stuck.value.message
    assert "metralectl agent logs" in (stuck.value.hint or "")


def test_a_wrong_token_is_a_clear_error(agent: tuple[LocalApiServer, FakeOps, Api]) -> None:
    """A client whose token is not the agent's cannot check the agent's proof: it stops before sending the
    token (it might be talking to another process), and says what to do."""
    server, ops, _ = agent
    with pytest.raises(NotOurAgent, match="could not prove it holds this box's agent token") as refused:
        AgentClient(server.port, "x" * 43, os.getpid()).cancel_unit("k")
    assert "token file changed" in (refused.value.hint or "")
    assert ops.calls == []


# -- the CLI beside a running agent ------------------------------------------------------------------------------
def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture()
def recorded(agent: tuple[LocalApiServer, FakeOps, Api], isolated_env: Path) -> tuple[LocalApiServer, FakeOps, Api]:
    """The fake agent, recorded in agent.json as a running agent is."""
    server, ops, api = agent
    security.token_path().parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    security.token_path().write_text(TOKEN + "\n")
    os.chmod(security.token_path(), 0o600)
    _record_agent(server.port, os.getpid())
    return server, ops, api


def test_the_cli_changes_what_is_served_itself_while_an_agent_runs(recorded: tuple[LocalApiServer, FakeOps, Api]) -> None:
    """No job goes to the agent: the command does the change here (here: a Docker that cannot be reached, said as
    the command says it with no agent running), and the agent never hears of it."""
    server, ops, _ = recorded
    unreachable = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    for args in (["run", RECIPE], ["swap", RECIPE], ["stop"]):
        out = _cli(*args, env=unreachable)
        assert out.returncode == ExitCode.UNAVAILABLE, (args, out.stderr)
        assert "nothing listens at DOCKER_HOST" in out.stderr and "agent" not in out.stderr
        assert "Traceback" not in out.stderr
    assert server.jobs.list() == [] and ops.calls == []


def test_the_cli_is_busy_while_an_agent_job_holds_the_lock(recorded: tuple[LocalApiServer, FakeOps, Api]) -> None:
    server, ops, api = recorded
    ops.mode = "silent"
    job = api.start("run", {"recipe": RECIPE})  # the agent's job holds the lifecycle lock while it runs
    for args in (["run", RECIPE], ["swap", RECIPE], ["stop"]):
        busy = _cli(*args, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
        assert busy.returncode == ExitCode.BUSY == 75, (args, busy.stderr)
        assert f"busy: run {RECIPE} (agent) (pid {os.getpid()}) is in progress on this machine" in busy.stderr
        assert "hint: wait for the agent's job to finish, or cancel it on the agent's page" in busy.stderr
        assert "Traceback" not in busy.stderr
    final, _ = api.follow(api.cancel(job["id"]))
    assert final["state"] == "cancelled"
