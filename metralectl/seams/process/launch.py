"""create_and_start for a host process: the state claimed under the name, the supervisor started detached, its
answer awaited. A start that fails, or is interrupted (Ctrl-C, a cancel), leaves no process and no state
behind (the launch's log is kept), as DockerRuntime's create_and_start leaves no container.

Order, and why: the state is written first (under the lock, refused when the name is taken), so anything
started afterwards can be found by name; the supervisor is our child until it is reaped, so its pid is safe to
signal while we wait for its answer. Interrupted, we SIGTERM it (it kills the engine's group if it started one,
and records the exit), wait for it, then remove the state; an engine it recorded and that still runs is killed
as well (verified, never a recycled pid).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from metralectl.safetext import clean
from metralectl.seams.docker.errors import RuntimeCause, RuntimeFailure
from metralectl.seams.process import group, logs, state
from metralectl.seams import affinity
from metralectl.seams.process.images import executable_problem, install_hint

if TYPE_CHECKING:
    from metralectl.core.render import ContainerSpec

ANSWER_TIMEOUT_S = 60.0  # the supervisor's start: an interpreter, then one posix_spawn
ABORT_WAIT_S = 10.0


def _request(spec: ContainerSpec, name: str, launch: str, log: str, log_limit: int) -> dict[str, Any]:
    return {"name": name, "launch": launch, "argv": list(spec.command), "env": state.engine_environment(spec.engine_env),
            "ulimits": [list(u) for u in spec.ulimits], "log": log, "log_limit": log_limit,
            "states_root": str(state.states_dir().root), "logs_root": str(logs.logs_dir().root), "cwd": "/"}


def _initial(spec: ContainerSpec, name: str, launch: str, labels: dict[str, str], log: str) -> dict[str, Any]:
    env = state.engine_environment(spec.engine_env)
    return {"schema": state.SCHEMA, "name": name, "launch": launch, "image": spec.image, "argv": list(spec.command),
            "env_names": sorted(env), "port": spec.port, "bind": spec.bind, "labels": labels,
            "spec_hash": spec.spec_hash(), "owner_uid": os.geteuid(), "created_at": state.now_iso(), "log": log,
            "engine": None, "supervisor": None, "started_at": None, "exit": None}


def check(spec: ContainerSpec) -> str:
    """The spec's name, once the spec is one a host process can be started from; RuntimeFailure otherwise."""
    from metralectl.seams.process import IMAGE_PREFIX

    name = spec.name
    if not state.valid_name(name):
        raise RuntimeFailure(RuntimeCause.REFUSED, f"{name!r} is not a name a process launch can have",
                             "letters, digits, '_', '.' and '-', starting with a letter or digit")
    exe = spec.command[0] if spec.command else ""
    if spec.image != IMAGE_PREFIX + exe:
        raise RuntimeFailure(RuntimeCause.REFUSED, f"{name}: a host process's image must be {IMAGE_PREFIX}<its "
                             f"executable> (here {spec.image!r}, and the command starts with {exe!r})")
    problem = executable_problem(exe)
    if problem is not None:
        raise RuntimeFailure(RuntimeCause.IMAGE_MISSING, f"{name}: cannot start {exe}: {problem}", install_hint(exe))
    return name


def create_and_start(spec: ContainerSpec, labels: dict[str, str], log_limit: int, keep_logs: int) -> None:
    """Start spec's engine under its supervisor; returns once the engine runs (its state says so)."""
    name = check(spec)
    launch = state.new_launch_id()
    with state.locked() as owned:
        taken = state.claim(_initial(spec, name, launch, labels, logs.launch_log(name, launch)), owned)
        if taken is not None:
            raise RuntimeFailure(RuntimeCause.CONFLICT,
                                 f'conflict: the name "{name}" is already in use by a process launch'
                                 + (" (a file metralectl did not write)" if taken.get("foreign") else ""),
                                 f"`metralectl ps` shows it; remove it first ({state.state_path(name)})")
        try:
            log = logs.prepare(name, launch, keep_logs)
        except BaseException:
            state.delete(name, launch, owned)
            raise
    supervisor: subprocess.Popen[bytes] | None = None
    try:
        supervisor = subprocess.Popen([sys.executable, "-m", "metralectl.seams.process.supervise", name],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      cwd=str(state.states_dir().root), start_new_session=True, close_fds=True,
                                      env=_supervisor_environment())
        affinity.apply(supervisor.pid, spec.cpu_ids)  # before it starts the engine, which inherits it
        answer = _converse(supervisor, _request(spec, name, launch, log, log_limit))
    except BaseException:
        _abort(supervisor, name, launch)
        raise
    if not answer.startswith("started"):
        said = _last_words(supervisor)
        _abort(supervisor, name, launch)
        why = answer[len("failed: "):] if answer.startswith("failed: ") else (
            answer or "the supervisor ended without an answer" + (f": {said}" if said else ""))
        raise RuntimeFailure(RuntimeCause.REFUSED, f"starting {name} failed: {why}",
                             f"its log: {logs.logs_dir().path(log)}")
    # The supervisor lives on, detached; reap it when it ends, so a long-lived caller (the agent) keeps no zombie.
    if supervisor.stderr is not None:
        supervisor.stderr.close()
    threading.Thread(target=supervisor.wait, name=f"reap-{name}", daemon=True).start()


def _supervisor_environment() -> dict[str, str]:
    """The caller's environment, with this very metralectl first on the import path: the supervisor must import
    the code that started it, whatever PYTHONPATH the caller has."""
    import metralectl

    here = os.path.dirname(os.path.dirname(os.path.abspath(metralectl.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _last_words(supervisor: subprocess.Popen[bytes]) -> str:
    """What a supervisor that failed wrote on stderr (its last line), once it has ended (briefly waited for)."""
    try:
        supervisor.wait(2.0)
    except subprocess.TimeoutExpired:
        return ""
    raw = supervisor.stderr.read(1 << 16) if supervisor.stderr is not None else b""
    lines = [line for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]
    return clean(lines[-1], 300) if lines else ""


def _converse(supervisor: subprocess.Popen[bytes], request: dict[str, Any]) -> str:
    """Hand the supervisor its launch; its one-line answer."""
    assert supervisor.stdin is not None and supervisor.stdout is not None
    try:
        supervisor.stdin.write(json.dumps(request).encode())
        supervisor.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: its (empty) answer says so
    fd = supervisor.stdout.fileno()
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return "failed: the supervisor did not answer within %g s" % ANSWER_TIMEOUT_S
        ready, _, _ = select.select([fd], [], [], min(left, 0.1))
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    supervisor.stdout.close()
    return data.decode("utf-8", "replace").split("\n", 1)[0].strip()


def _abort(supervisor: subprocess.Popen[bytes] | None, name: str, launch: str) -> None:
    """Undo a start: the supervisor told to kill the engine and end (it is our child: its pid is safe), the
    engine killed if it still runs, the state removed. Runs to the end even if Ctrl-C is pressed again."""
    deadline = time.monotonic() + ABORT_WAIT_S
    while True:
        try:
            _undo(supervisor, name, launch, deadline)
            return
        except KeyboardInterrupt:
            if time.monotonic() > deadline + ABORT_WAIT_S:
                raise


def _undo(supervisor: subprocess.Popen[bytes] | None, name: str, launch: str, deadline: float) -> None:
    if supervisor is not None and supervisor.poll() is None:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            supervisor.kill()
            supervisor.wait()
    found = state.read(name)
    if found is not None and found.get("launch") == launch:
        engine = found.get("engine")
        group.signal_group(engine, signal.SIGKILL)
        while group.is_running(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
    with state.locked() as owned:
        state.delete(name, launch, owned)
    if supervisor is not None:
        for pipe in (supervisor.stdin, supervisor.stdout, supervisor.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
