"""The CLI/dashboard -> agent path: request bodies, the events long-poll, cancel, error mapping, discovery
(agent/client.py against a real LocalApiServer on loopback with fake operations), the event JSON, and
`metralectl run/swap/stop` routed through a fake agent in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metralectl.agent import security
from metralectl.agent.api import LocalApiServer
from metralectl.app.agent_client import AgentClient, AgentGone, NotOurAgent, outcome, running_agent
from metralectl.agent.jobs import JobRunner
from metralectl.errors import ExitCode, MetralError, UsageError
from metralectl.lifecycle import events as ev
from metralectl.seams.store import Busy, lifecycle_lock
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


class RoutingOps:
    """Fake operations: record what reaches them; `mode` picks how run behaves."""

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
        body = change.to_json()
        if change.kind == "run":
            return self.run(change.recipe, on_event, sets=change.sets, options=body["options"])
        if change.kind == "swap":
            return self.swap(change.recipe, on_event, sets=change.sets, drain_timeout_s=change.drain_timeout_s,
                             options=body["options"])
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
                    time.sleep(0.01)
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


@pytest.fixture()
def agent() -> Iterator[tuple[LocalApiServer, RoutingOps, AgentClient]]:
    ops = RoutingOps()
    server = LocalApiServer(ops, token=TOKEN, port=0, jobs=JobRunner(grace_s=0.3))
    server.start("test-routing-api")
    try:
        yield server, ops, AgentClient(server.port, TOKEN, os.getpid())
    finally:
        ops.gate.set()
        server.stop()


def _wait_done(client: AgentClient, job: dict[str, Any]) -> dict[str, Any]:
    seen: list[Any] = []
    final, _ = client.follow(job, seen.append, wait_s=5)
    return final


# -- bodies -------------------------------------------------------------------------------------------
def test_options_and_sets_reach_the_operations(agent: tuple[LocalApiServer, RoutingOps, AgentClient]) -> None:
    _, ops, client = agent
    options = {"replace": True, "keep_failed": True, "stall_timeout_s": 12, "boot_timeout_s": None,
               "check_weights": False, "pull": False}
    job = client.start("run", {"recipe": RECIPE, "sets": ["max-seq-len=4096"], "options": options})
    assert _wait_done(client, job)["state"] == "done"
    swap_opts = {"stall_timeout_s": 5.5, "boot_timeout_s": 100, "check_weights": True, "pull": False}
    _wait_done(client, client.start("swap", {"recipe": RECIPE, "sets": [], "drain_timeout_s": 7,
                                             "options": swap_opts}))
    _wait_done(client, client.start("stop", {"recipe": None, "all": True, "timeout_s": 2}))
    _wait_done(client, client.start("run", {"recipe": "page-body"}))  # the page sends just {recipe}
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
def test_bad_bodies_are_refused_naming_the_key(agent: tuple[LocalApiServer, RoutingOps, AgentClient], kind: str,
                                               body: dict[str, Any], named: str) -> None:
    server, ops, client = agent
    with pytest.raises(MetralError) as refused:
        client.start(kind, body)
    assert named in refused.value.message and refused.value.exit_code == ExitCode.USAGE
    assert server.jobs.list() == [] and not [c for c in ops.calls if c[0] != "check"]


def test_a_bad_set_is_refused_with_the_checkers_message_before_a_job(
        agent: tuple[LocalApiServer, RoutingOps, AgentClient]) -> None:
    from metralectl.agent.ops import LifecycleOps
    from metralectl.app.serving import Change

    server, ops, client = agent
    real = LifecycleOps(lambda: None)
    for sets in (["nonsense=1"], ["max-seq-len=banana"]):
        try:
            real.check(Change.run(RECIPE, sets))
        except MetralError as exc:
            ops.check_error = exc
        else:
            pytest.fail(f"{sets} passed the checker")
        with pytest.raises(MetralError) as refused:
            client.start("run", {"recipe": RECIPE, "sets": sets})
        assert ops.check_error.message in refused.value.message
        assert refused.value.exit_code == ops.check_error.exit_code
    assert server.jobs.list() == []
    with pytest.raises(MetralError, match="no-such-recipe"):
        real.check(Change.run("no-such-recipe"))


# -- the long-poll ---------------------------------------------------------------------------------------
def test_long_poll_answers_promptly_on_a_new_event_and_on_the_end(
        agent: tuple[LocalApiServer, RoutingOps, AgentClient]) -> None:
    _, ops, client = agent
    ops.mode = "gated"
    job = client.start("run", {"recipe": RECIPE})
    events, state, _ = client.events(job["id"], 0, 5)
    assert [e["seq"] for e in events] == [1] and state["state"] == "running"
    threading.Timer(0.3, ops.gate.set).start()
    started = time.monotonic()
    events, _, _ = client.events(job["id"], 1, 10)
    assert 0.2 < time.monotonic() - started < 6.0  # on the event (0.3 s), not at the 10 s wait's end
    assert [(e["seq"], e["kind"], e["detail"]) for e in events] == [(2, "Step", "second")]
    started = time.monotonic()
    events, state, _ = client.events(job["id"], 2, 0.3)  # nothing new within wait: an empty answer
    assert events == [] and 0.25 < time.monotonic() - started < 6.0 and state["state"] == "running"
    threading.Timer(0.3, ops.gate.set).start()
    started = time.monotonic()
    events, state, _ = client.events(job["id"], 2, 10)
    while state["state"] == "running":  # the last events may come a moment before the end
        more, state, _ = client.events(job["id"], events[-1]["seq"] if events else 2, 10)
        events += more
    assert time.monotonic() - started < 6.0  # on the end, not at the 10 s wait's end
    assert state["state"] == "done" and state["exit_code"] == 0 and state["result"] == LAUNCHED
    assert [e["kind"] for e in events] == ["Phase", "Ready"]


def test_after_resumes_without_duplicates_or_gaps(agent: tuple[LocalApiServer, RoutingOps, AgentClient]) -> None:
    _, ops, client = agent
    ops.mode = "burst"
    job = client.start("run", {"recipe": RECIPE})
    while client.events(job["id"], 0, 0)[1]["state"] == "running":
        time.sleep(0.01)
    seen: list[int] = []
    after = 0
    for _ in range(100):  # resume from wherever the last answer ended, in small bites
        events, state, missed = client.events(job["id"], after, 0)
        assert missed == 0
        bite = events[:7]
        seen += [e["seq"] for e in bite]
        if not bite:
            break
        after = bite[-1]["seq"]
    assert seen == list(range(1, 64))  # image step + 60 lines + phase + ready, in order, once each
    assert seen[-1] == state["last_seq"]
    assert client.events(job["id"], 30, 0)[0][0]["seq"] == 31


# -- cancel ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["chatty", "silent"])
def test_cancel_turns_a_running_job_into_cancelled(agent: tuple[LocalApiServer, RoutingOps, AgentClient],
                                                   mode: str) -> None:
    """At the next event when it emits; within the grace period (here 0.3 s) when it is silent."""
    _, ops, client = agent
    ops.mode = mode
    job = client.start("run", {"recipe": RECIPE})
    time.sleep(0.2)
    started = time.monotonic()
    answer = client.cancel(job["id"])
    assert answer["cancel_requested"] is True
    final, _ = client.follow(answer, lambda e: None, wait_s=5)
    assert time.monotonic() - started < 4.0  # the next event or the 0.3 s grace, not the follow's 5 s wait
    assert ops.interrupted.is_set()  # the fake's cleanup ran, as on Ctrl-C
    assert (final["state"], final["exit_code"]) == ("cancelled", 130)
    events, _, _ = client.events(job["id"], 0, 0)
    assert events[-1]["kind"] == "Step" and events[-1]["name"] == "cleanup"  # the cleanup's events are kept
    with pytest.raises(MetralError, match="the agent's run job was cancelled by a client") as other:
        outcome(final, False)
    assert other.value.exit_code == 130
    assert client.cancel(job["id"])["state"] == "cancelled"  # cancelling an ended job: just its state


def test_follow_cancels_on_an_interrupt_and_keeps_following(agent: tuple[LocalApiServer, RoutingOps, AgentClient]) -> None:
    _, ops, client = agent
    ops.mode = "chatty"
    seen: list[Any] = []

    def on_event(event: Any) -> None:
        seen.append(event)
        if len(seen) == 3:
            raise KeyboardInterrupt  # Ctrl-C while rendering

    job = client.start("run", {"recipe": RECIPE})
    final, interrupted = client.follow(job, on_event, wait_s=5)
    assert interrupted and final["state"] == "cancelled" and ops.interrupted.is_set()
    assert isinstance(seen[-1], ev.Step) and seen[-1].name == "cleanup"  # the cleanup was followed
    with pytest.raises(KeyboardInterrupt):
        outcome(final, interrupted)


def test_stopping_the_server_cancels_a_running_job() -> None:
    ops = RoutingOps()
    ops.mode = "silent"
    server = LocalApiServer(ops, token=TOKEN, port=0, jobs=JobRunner(grace_s=0.1))
    server.start("test-stop")
    job = AgentClient(server.port, TOKEN, os.getpid()).start("run", {"recipe": RECIPE})
    server.stop()
    state = server.jobs.get(job["id"])
    assert state is not None and state.state == "cancelled" and ops.interrupted.is_set()
    assert state.error == "cancelled by the agent stopping; what it had started was cleaned up"


# -- errors and discovery ------------------------------------------------------------------------------------
def test_busy_maps_to_the_busy_error(agent: tuple[LocalApiServer, RoutingOps, AgentClient]) -> None:
    server, _, client = agent
    with lifecycle_lock("swap to x"):
        with pytest.raises(Busy) as busy:
            client.start("run", {"recipe": RECIPE})
    assert "swap to x" in busy.value.message and busy.value.exit_code == 75
    assert server.jobs.list() == []


def test_a_failed_job_raises_its_error_with_its_exit_code() -> None:
    job = {"kind": "swap", "state": "failed", "error": "DEGRADED: nothing serves", "hint": "ps --repair",
           "exit_code": 3}
    with pytest.raises(MetralError) as failed:
        outcome(job, False)
    assert (failed.value.message, failed.value.hint, failed.value.exit_code) == ("DEGRADED: nothing serves",
                                                                                 "ps --repair", 3)
    assert outcome({"state": "done", "result": {"x": 1}}, True) == {"x": 1}  # finished before the cancel


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


def test_discovery(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert running_agent() is None  # none recorded
    _record_agent(8897, os.getpid())
    client = running_agent()
    assert client is not None and client.port == 8897 and client.pid == os.getpid()
    assert client.token == security.load_or_create_token()
    assert client.describe() == f"via the agent (pid {os.getpid()}, http://127.0.0.1:8897/)"
    monkeypatch.setenv("METRALECTL_DIRECT", "1")
    assert running_agent() is None
    monkeypatch.delenv("METRALECTL_DIRECT")
    os.chmod(security.token_path(), 0o644)  # an unsafe token file: work directly
    assert running_agent() is None
    os.chmod(security.token_path(), 0o600)
    _record_agent(8897, _dead_pid())
    assert running_agent() is None


def test_an_unreachable_agent(isolated_env: Path) -> None:
    port = own_port()  # a port nothing listens on (held: nobody else can start listening there)
    with pytest.raises(AgentGone):  # its process is gone: the caller works directly
        AgentClient(port, TOKEN, _dead_pid()).start("run", {"recipe": RECIPE})
    with pytest.raises(MetralError) as stuck:  # alive but not answering: say so, and how to bypass it
        AgentClient(port, TOKEN, os.getpid()).start("run", {"recipe": RECIPE})
    assert not isinstance(stuck.value, AgentGone)
    assert f"the agent (pid {os.getpid()}, http://127.0.0.1:{port}/) does not answer" in stuck.value.message
    assert "--direct" in (stuck.value.hint or "")


def test_a_wrong_token_is_a_clear_error(agent: tuple[LocalApiServer, RoutingOps, AgentClient]) -> None:
    """A client whose token is not the agent's cannot check the agent's proof: it stops before sending the
    token (it might be talking to another process), and says what to do."""
    server, ops, _ = agent
    with pytest.raises(NotOurAgent, match="could not prove it holds this box's agent token") as refused:
        AgentClient(server.port, "x" * 43, os.getpid()).start("run", {"recipe": RECIPE})
    assert "token file changed" in (refused.value.hint or "") and "--direct" in (refused.value.hint or "")
    assert ops.calls == []


# -- the event JSON ------------------------------------------------------------------------------------------
def test_every_event_survives_json() -> None:
    from metralectl.core.images import LayerProgress
    from metralectl.seams.hf.steps import PullEvent

    samples: list[ev.Event] = [
        ev.Step("image", "ref"), ev.Warning_("careful"), ev.ContainerStarted("n", "id", "run"),
        ev.Phase("loading", "loading x", 1.5, rank=1), ev.LogLine("a line"), ev.LogLine("r1 line", 1),
        ev.Ready("http://127.0.0.1:8888", None, 3.25), ev.Failed("oom", "out of memory", "lower it", ("a", "b")),
        ev.Transfer("image", LayerProgress("ref", "abc", "Downloading", 10, 100)),
        ev.Transfer("weights", PullEvent("org/repo", "download", 5, 10, 1.0, 5.0, 1, 2, "")),
    ]
    assert {type(e) for e in samples} == set(ev.EVENT_CLASSES.values())
    for event in samples:
        data = json.loads(json.dumps({"seq": 7, "t": 1.0, **ev.to_json(event)}))
        assert ev.from_json(data) == event
    assert ev.to_json(ev.Warning_("x"))["kind"] == "Warning"
    assert ev.to_json(samples[-1])["kind"] == "Transfer" and ev.to_json(samples[-1])["transfer"] == "weights"
    for bad in ({"kind": "Nope"}, {"kind": "Step"}, {"kind": "Transfer", "transfer": "video", "progress": {}}):
        with pytest.raises(ValueError):
            ev.from_json(bad)
    assert ev.from_json({"kind": "Step", "name": "x", "from_a_newer_agent": 1}) == ev.Step("x")


# -- the CLI through a fake agent ------------------------------------------------------------------------------
HEAVY = ("docker", "textual", "httpx", "huggingface_hub", "pynvml")


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    code = ("import sys, runpy\n"
            f"sys.argv = ['metralectl', *{list(args)!r}]\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
            "except SystemExit as exc:\n"
            f"    print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
            "    raise\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture()
def recorded(agent: tuple[LocalApiServer, RoutingOps, AgentClient],
             isolated_env: Path) -> tuple[LocalApiServer, RoutingOps]:
    server, ops, _ = agent
    security.token_path().parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    security.token_path().write_text(TOKEN + "\n")
    os.chmod(security.token_path(), 0o600)
    _record_agent(server.port, os.getpid())
    return server, ops


def test_cli_run_goes_through_the_agent(recorded: tuple[LocalApiServer, RoutingOps]) -> None:
    from metralectl.cli.serve_cmds import _print_ready
    from metralectl.lifecycle.launch import Launched

    server, ops = recorded
    out = _cli("run", RECIPE, "--set", "max-seq-len=4096", "--replace", "--boot-timeout", "50")
    assert out.returncode == 0, out.stderr
    assert f"via the agent (pid {os.getpid()}, http://127.0.0.1:{server.port}/)" in out.stderr
    assert "deviation from the validated recipe: serve.max-seq-len: 8192 -> 4096" in out.stderr
    assert "▸ image" in out.stderr and "▸ loading" in out.stderr and "✔ ready in 12.5 s" in out.stderr
    assert "HEAVY=\n" in out.stderr  # the routed path loads neither docker nor httpx
    run_calls = [c for c in ops.calls if c[0] == "run"]
    assert run_calls == [("run", RECIPE, ["max-seq-len=4096"],
                          {"replace": True, "keep_failed": False, "stall_timeout_s": 300.0, "boot_timeout_s": 50.0,
                           "check_weights": True, "pull": True})]
    import contextlib
    import io

    expected = io.StringIO()
    with contextlib.redirect_stdout(expected):
        _print_ready(Launched(**LAUNCHED), False)
    assert out.stdout == expected.getvalue()  # the same lines as the direct path prints
    as_json = _cli("run", RECIPE, "--json")
    assert as_json.returncode == 0 and as_json.stdout == json.dumps(LAUNCHED, indent=2) + "\n"  # order kept


def test_cli_swap_and_stop_go_through_the_agent(recorded: tuple[LocalApiServer, RoutingOps]) -> None:
    _, ops = recorded
    swap = _cli("swap", RECIPE, "--drain-timeout", "5")
    assert swap.returncode == 0, swap.stderr
    assert "via the agent" in swap.stderr and "▸ staging" in swap.stderr
    assert swap.stdout.splitlines()[0] == f"swapped old -> {RECIPE}: downtime 3.0 s (drain 0.5 s, stop 1.0 s, boot 1.5 s)"
    stop = _cli("stop", "--timeout", "4")
    assert stop.returncode == 0 and stop.stdout == (f"stopped metralectl-{RECIPE} ({RECIPE}): exited 0 in 1.2 s; "
                                                    "removed: yes; memory: returned\n")
    assert json.loads(_cli("stop", "--json").stdout) == [STOPPED]
    nothing = _cli("stop", "nothing")
    assert nothing.returncode == 0 and nothing.stdout == "" and "nothing to stop" in nothing.stderr
    assert [c for c in ops.calls if c[0] in ("swap", "stop")] == [
        ("swap", RECIPE, [], 5.0, {"stall_timeout_s": 300.0, "boot_timeout_s": None, "check_weights": True,
                                   "pull": True}),
        ("stop", None, False, 4.0), ("stop", None, False, 30.0), ("stop", "nothing", False, 30.0)]


def test_cli_busy_refusal_and_direct(recorded: tuple[LocalApiServer, RoutingOps]) -> None:
    _, ops = recorded
    with lifecycle_lock("swap to x"):
        busy = _cli("run", RECIPE)
    assert busy.returncode == 75 and "busy: swap to x" in busy.stderr
    ops.check_error = UsageError("--set nope: not a serve flag", "use a serve flag")
    refused = _cli("run", RECIPE)  # what the agent refuses (here: its checker), the CLI refuses the same way
    assert refused.returncode == ExitCode.USAGE and "metralectl: --set nope: not a serve flag" in refused.stderr
    assert "hint: use a serve flag" in refused.stderr
    direct = _cli("run", RECIPE, "--direct", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert "via the agent" not in direct.stderr and direct.returncode != 0  # it went to (a missing) Docker itself
    env_direct = _cli("stop", env={"METRALECTL_DIRECT": "1", "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert "via the agent" not in env_direct.stderr and env_direct.returncode != 0
    assert not [c for c in ops.calls if c[0] in ("run", "stop")]


def test_cli_ctrl_c_cancels_the_job_and_exits_130(recorded: tuple[LocalApiServer, RoutingOps]) -> None:
    server, ops = recorded
    ops.mode = "silent"
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "run", RECIPE], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 30
    while not server.jobs.list() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err  # as the direct path: Typer turns the KeyboardInterrupt into exit 130
    assert out == "" and "Traceback" not in err and "▸ cleanup" in err  # the agent's cleanup was followed
    assert ops.interrupted.is_set() and server.jobs.list()[0].state == "cancelled"


# -- the dashboard through a fake agent ---------------------------------------------------------------------
def test_dashboard_actions_go_through_the_agent(recorded: tuple[LocalApiServer, RoutingOps]) -> None:
    from metralectl.tui.cancel import CancelToken
    from metralectl.tui.core_services import CoreServices

    _, ops = recorded
    services = CoreServices(bench=object())  # type: ignore[arg-type]
    seen: list[Any] = []
    done = services.perform("run", RECIPE, seen.append, CancelToken())
    assert done.status == "done" and done.summary == (f"{RECIPE} serves on http://127.0.0.1:8888/v1 (model "
                                                      "Sehyo/Qwen3.5-35B-A3B-NVFP4); ready in 12.5 s")
    assert [type(e) for e in seen] == [ev.Step, ev.Phase, ev.Ready]  # typed events, as the direct path posts
    swapped = services.perform("swap", RECIPE, seen.append, CancelToken())
    assert swapped.summary == f"swapped old → {RECIPE}: downtime 3.0 s (drain 0.5 s, stop 1.0 s, boot 1.5 s)"
    stopped = services.perform("stop", RECIPE, seen.append, CancelToken())
    assert stopped.lines == (f"stopped metralectl-{RECIPE} ({RECIPE}): exited 0 in 1.2 s; removed: yes; "
                             "memory: returned",)
    assert [c[0] for c in ops.calls if c[0] != "check"] == ["run", "swap", "stop"]


def test_dashboard_cancel_cancels_the_agents_job(recorded: tuple[LocalApiServer, RoutingOps]) -> None:
    from metralectl.tui.cancel import Cancelled, CancelToken
    from metralectl.tui.core_services import CoreServices

    server, ops = recorded
    ops.mode = "silent"
    token = CancelToken(grace_s=0.2)  # the dashboard's own delayed interrupt must not cut the following short
    threading.Timer(0.5, token.cancel).start()

    def on_event(event: Any) -> None:
        token.check()

    started = time.monotonic()
    with pytest.raises(Cancelled), token.bound():
        CoreServices(bench=object()).perform("run", RECIPE, on_event, token)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    assert ops.interrupted.is_set() and server.jobs.list()[0].state == "cancelled"
