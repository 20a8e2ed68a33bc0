"""`metralectl agent start | stop | status | logs` on a machine without user systemd (this one), through the
real entry point: real agent processes (detached, in their own session), their pidfile, their log; a second
agent refused naming the first; a port held by another program named; a stale pidfile whose pid is now
another process, never signalled; Ctrl-C and SIGTERM during `start`; the peer listener off until a peer is
paired. Every agent binds port 0 (`--port 0`), or a port this test holds listening itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metralectl.seams import agent_files
from metralectl.seams.process import identity, same_process
from tests.unit.recipe_helpers import REPO

QUIET = ["--interval", "60", "--no-regroup"]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1] != "Z"
    except OSError:
        return False


@pytest.fixture(autouse=True)
def no_agent_left(isolated_env: Path) -> Iterator[None]:
    """Whatever a test started is stopped by its own pid (the records say which; a recycled pid is left)."""
    yield
    record = agent_files.read_pidfile()
    if record is not None and same_process(record):
        os.kill(int(record["pid"]), signal.SIGKILL)


def status(env: dict[str, str] | None = None) -> dict[str, Any]:
    out = cli("agent", "status", "--json", env=env)
    answer: dict[str, Any] = json.loads(out.stdout)
    answer["rc"] = out.returncode
    return answer


def test_start_status_second_start_logs_stop(isolated_env: Path) -> None:
    started = cli("agent", "start", "--port", "0", *QUIET)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/") and ":0/" not in url
    assert "starting the agent (pid " in started.stderr and "agent started (pid " in started.stderr
    record = agent_files.read_pidfile()
    assert record is not None
    pid = int(record["pid"])
    assert record["how"] == "detached" and record["exe"] and record["start_ticks"] == identity(pid)["start_ticks"]  # type: ignore[index]
    assert os.getsid(pid) == pid  # its own session: the terminal's Ctrl-C and hang-up do not reach it
    assert httpx.get(url + "api/agent", timeout=5, trust_env=False).status_code == 200  # it answers

    shown = cli("agent", "status")
    assert shown.returncode == 0, shown.stderr
    assert "running" in shown.stdout and f"pid         {pid}" in shown.stdout and url in shown.stdout
    assert "`metralectl agent start`" in shown.stdout and "off (no peer paired, bench not enabled" in shown.stdout
    doc = status()
    assert doc["rc"] == 0 and doc["state"] == "running" and doc["agent"]["pid"] == pid and doc["agent"]["url"] == url
    assert doc["agent"]["how"] == "detached" and doc["agent"]["peer_port"] is None

    again = cli("agent", "start", "--port", "0", *QUIET)  # another --port 0 would be another port: not a second agent
    assert again.returncode == 0 and again.stdout.strip() == url
    assert f"already running: pid {pid}" in again.stderr
    as_json = json.loads(cli("agent", "start", "--port", "0", "--json", *QUIET).stdout)
    assert as_json["already_running"] is True and as_json["pid"] == pid and as_json["url"] == url
    second = cli("agent", "--port", "0", *QUIET)  # a second one in the foreground: refused, naming the first
    assert second.returncode == 75, second.stderr
    assert f"an agent already runs for this configuration (pid {pid}, {url})" in second.stderr
    assert "internal error" not in second.stderr and "Traceback" not in second.stderr
    assert agent_files.read_pidfile() == record  # the refused one changed nothing

    logs = cli("agent", "logs", "-n", "50")
    assert logs.returncode == 0 and f"page + local API: {url}" in logs.stdout
    assert "agent log: " in logs.stderr and "agent.log" in logs.stderr

    stopped = cli("agent", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith(f"stopped: pid {pid} (SIGTERM")
    assert not alive(pid)
    assert agent_files.read_pidfile() is None and not agent_files.state_path().exists()
    after = cli("agent", "status")
    assert after.returncode == 1 and after.stdout.strip() == "not running" and "metralectl agent start" in after.stderr
    assert status()["state"] == "not-running"
    nothing = cli("agent", "stop")
    assert nothing.returncode == 0 and nothing.stdout.strip() == "not running"


def test_a_stale_pidfile_whose_pid_is_another_process_is_never_signalled(isolated_env: Path) -> None:
    other = subprocess.Popen(["sleep", "300"])  # ours, alive: as a recycled pid would be
    try:
        fake = {"pid": other.pid, "start_ticks": identity(other.pid)["start_ticks"] - 1,  # type: ignore[index]
                "boot_id": identity(os.getpid())["boot_id"], "exe": os.readlink("/proc/self/exe"),  # type: ignore[index]
                "how": "detached", "log": None, "started": time.time() - 3600,
                "config_dir": str(agent_files.agent_dir().parent)}
        agent_files.pidfile_path().write_text(json.dumps(fake))
        agent_files.state_path().parent.mkdir(parents=True, exist_ok=True)
        agent_files.state_path().write_text(json.dumps({**fake, "api_port": 9}))  # agent.json as stale: never used

        shown = cli("agent", "status")
        assert shown.returncode == 1 and shown.stdout.strip() == "not running"
        assert f"stale pidfile: pid {other.pid} is now another process (sleep), not the agent" in shown.stderr
        doc = status()
        assert doc["state"] == "not-running" and doc["stale_pidfile"]["pid"] == other.pid

        stopped = cli("agent", "stop")
        assert stopped.returncode == 0 and stopped.stdout.strip() == "not running"
        assert "removed a stale pidfile" in stopped.stderr
        assert other.poll() is None  # never signalled
        assert agent_files.read_pidfile() is None

        agent_files.pidfile_path().write_text(json.dumps(fake))
        started = cli("agent", "start", "--port", "0", *QUIET)  # a stale record does not stand in the way
        assert started.returncode == 0 and "removed a stale pidfile" in started.stderr, started.stderr
        assert other.poll() is None
        assert cli("agent", "stop").returncode == 0
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_pidfile_whose_process_is_gone(isolated_env: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    agent_files.pidfile_path().write_text(json.dumps({"pid": gone.pid, "start_ticks": 1, "boot_id": None,
                                                      "exe": "/usr/bin/python3", "how": "detached"}))
    shown = cli("agent", "status")
    assert shown.returncode == 1 and f"pid {gone.pid} is gone" in shown.stderr


def test_a_port_held_by_another_program_is_named(isolated_env: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = str(held.getsockname()[1])
        fore = cli("agent", "--port", port, *QUIET)
        assert fore.returncode == 75, fore.stderr
        assert f"cannot listen on 127.0.0.1:{port} for the local API: the port is already in use by PID {os.getpid()}" \
            in fore.stderr
        assert "--port N" in fore.stderr and "internal error" not in fore.stderr
        background = cli("agent", "start", "--port", port, *QUIET)
        assert background.returncode == 75, background.stderr
        assert "the agent exited 75 while starting" in background.stderr
        assert f"  | metralectl: cannot listen on 127.0.0.1:{port}" in background.stderr  # the log's own lines
        assert agent_files.read_pidfile() is None and status()["state"] == "not-running"


SLOW_START = """import os, time
if os.environ.get("METRALECTL_AGENT_HOW") == "detached":
    time.sleep(30)  # the agent `start` started: still starting when the test interrupts `start`
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_start_stops_the_half_started_agent(isolated_env: Path, tmp_path: Path, sig: int) -> None:
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW_START)  # imported at the agent's interpreter start, before anything
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(slow), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "metralectl", "agent", "start", "--port", "0", *QUIET], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("starting the agent (pid "), line
    child = int(line.split("(pid ")[1].split(",")[0])
    assert alive(child)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"stopped the agent being started (pid {child}): nothing is left running" in err
    assert out == "" and "Traceback" not in err
    assert not alive(child)
    assert agent_files.read_pidfile() is None and not agent_files.state_path().exists()


def test_logs_are_escaped_and_followed(isolated_env: Path) -> None:
    log = agent_files.log_path()
    log.write_text("2026-01-01 agent: a peer named \x1b[2J\x1b]52;c;cHduZWQ=\x07 said hi\nsecond line\n")
    shown = cli("agent", "logs")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\\x1b[2J\\x1b]52;c;cHduZWQ=\\x07 said hi" in shown.stdout
    assert cli("agent", "logs", "-n", "1").stdout == "second line\n"

    follower = subprocess.Popen([sys.executable, "-m", "metralectl", "agent", "logs", "-f", "-n", "1"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "second line\n"
        with open(log, "a") as handle:
            handle.write("third \x1b[31mline\n")
        assert follower.stdout.readline() == "third \\x1b[31mline\n"
        log.rename(log.with_name("agent.log.1"))  # the next `agent start` rotates it: followed into the new file
        log.write_text("fourth line\n")
        assert follower.stdout.readline() == "fourth line\n"
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=30)
    assert follower.returncode == 130


def test_no_log_yet_says_where_it_would_be(isolated_env: Path) -> None:
    out = cli("agent", "logs")
    assert out.returncode == 1 and "no agent log yet" in out.stderr and "metralectl agent start" in out.stderr


def test_an_installed_unit_without_user_systemd_starts_detached(isolated_env: Path, tmp_path: Path) -> None:
    config = tmp_path / "xdg"
    (config / "systemd" / "user").mkdir(parents=True)
    (config / "systemd" / "user" / "metralectl-agent.service").write_text("[Service]\nExecStart=metralectl agent\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(config)}
    started = cli("agent", "start", "--port", "0", *QUIET, env=env)
    try:
        assert started.returncode == 0, started.stderr
        assert "the metralectl-agent.service unit is installed, but `systemctl --user` does not answer here" \
            in started.stderr
        assert status(env)["agent"]["how"] == "detached"
    finally:
        assert cli("agent", "stop", env=env).returncode == 0


def test_the_peer_listener_is_off_until_a_peer_is_paired(isolated_env: Path, tmp_path: Path) -> None:
    """Box one starts without --peers: no listener. Box two starts with --peers (on loopback). Once one has
    paired with two, one's running agent turns its listener on by itself; a fresh start has it on at once."""
    peer = ["--peer-port", "0", "--peer-bind", "127.0.0.1"]
    two = {**os.environ, "METRALECTL_CONFIG_DIR": str(tmp_path / "two" / "config"),
           "METRALE_HOME": str(tmp_path / "two" / "home")}
    assert cli("agent", "start", "--port", "0", *peer, *QUIET).returncode == 0
    on = cli("agent", "start", "--port", "0", "--peers", *peer, *QUIET, env=two)
    try:
        assert on.returncode == 0, on.stderr
        assert status()["agent"]["peer_port"] is None
        listening = status(two)["agent"]
        assert listening["peer_port"] and listening["peer_host"] == "127.0.0.1"
        fp_two = cli("id", env=two).stdout.strip()
        paired = cli("peer", "pair", f"127.0.0.1:{listening['peer_port']}", "--expect", fp_two)
        assert paired.returncode == 0, paired.stderr
        deadline = time.monotonic() + 15
        while status()["agent"]["peer_port"] is None:
            assert time.monotonic() < deadline, "the paired box's listener did not turn on"
            time.sleep(0.2)
        assert "a peer is paired: peer listener on 127.0.0.1:" in cli("agent", "logs").stdout
        assert cli("agent", "stop").returncode == 0
        assert cli("agent", "start", "--port", "0", *peer, *QUIET).returncode == 0
        assert status()["agent"]["peer_port"]  # paired: on from the start
        assert cli("agent", "stop").returncode == 0
        assert cli("agent", "start", "--port", "0", "--no-peer", *peer, *QUIET).returncode == 0
        assert status()["agent"]["peer_port"] is None  # asked off: stays off
    finally:
        cli("agent", "stop")
        cli("agent", "stop", env=two)


def test_enabling_bench_for_peers_turns_the_listener_on(isolated_env: Path) -> None:
    """A node is paired *with* (its listener must answer first): `peer bench-config --enable`, the step a
    campaign's node takes anyway, turns the listener on in a running agent."""
    assert cli("agent", "start", "--port", "0", "--peer-port", "0", "--peer-bind", "127.0.0.1", *QUIET).returncode == 0
    try:
        assert status()["agent"]["peer_port"] is None
        assert cli("peer", "bench-config", "--enable").returncode == 0
        deadline = time.monotonic() + 15
        while status()["agent"]["peer_port"] is None:
            assert time.monotonic() < deadline, "enabling bench did not turn the listener on"
            time.sleep(0.2)
        assert "peers may run benchmarks here (bench.yaml): peer listener on 127.0.0.1:" in cli("agent", "logs").stdout
    finally:
        cli("agent", "stop")


def test_an_option_before_the_subcommand_is_refused_not_ignored(isolated_env: Path) -> None:
    out = cli("agent", "--port", "0", "start")  # it would have started on 8897, the --port dropped
    assert out.returncode == 64 and "--port before `start` belongs to `metralectl agent` itself" in out.stderr
    assert "metralectl agent start --port" in out.stderr and agent_files.read_pidfile() is None


def test_a_foreground_agent_is_found_named_and_stopped(isolated_env: Path) -> None:
    agent_files.log_path().write_text("an older detached agent's line\n")  # not this agent's log
    fore = subprocess.Popen([sys.executable, "-m", "metralectl", "agent", "--port", "0", *QUIET], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while status()["state"] != "running":
            assert fore.poll() is None and time.monotonic() < deadline, fore.stderr.read() if fore.stderr else ""
            time.sleep(0.2)
        doc = status()["agent"]
        assert doc["pid"] == fore.pid and doc["how"] == "foreground"
        again = cli("agent", "start", "--port", "0", *QUIET)
        assert again.returncode == 0 and f"already running: pid {fore.pid}, started by a terminal" in again.stderr
        logs = cli("agent", "logs")
        assert logs.returncode == 1 and f"the agent (pid {fore.pid}) runs in a terminal and logs there" in logs.stderr
        stopped = cli("agent", "stop")
        assert stopped.returncode == 0 and stopped.stdout.startswith(f"stopped: pid {fore.pid} (SIGTERM")
        assert fore.wait(timeout=10) == 0  # a clean stop
    finally:
        if fore.poll() is None:
            fore.kill()
            fore.wait()


FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl as a user systemd with the agent's unit loaded would answer (this machine has none)
echo "$*" >> "$FAKE_SYSTEMD_CALLS"
case "$*" in
  *"show --property=LoadState"*) echo loaded ;;
  *"show --property=ActiveState"*) echo active ;;
  "--user start metralectl-agent.service")
    setsid "$FAKE_PYTHON" -m metralectl agent --port 0 --interval 60 --no-regroup >>"$FAKE_SYSTEMD_LOG" 2>&1 </dev/null &
    ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"""


def test_start_goes_through_a_loaded_user_unit(isolated_env: Path, tmp_path: Path) -> None:
    """Where `systemctl --user` answers and knows the unit, `start` without options asks systemd to start it and
    waits for it to answer (a stand-in systemctl: this machine has no user systemd)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SYSTEMD_CALLS": str(calls),
           "FAKE_SYSTEMD_LOG": str(tmp_path / "unit.log"), "FAKE_PYTHON": sys.executable}
    started = cli("agent", "start", "--json", env=env)
    assert started.returncode == 0, started.stderr + (tmp_path / "unit.log").read_text()
    assert "starting metralectl-agent.service (systemctl --user)" in started.stderr
    doc = json.loads(started.stdout)
    assert doc["already_running"] is False and doc["url"].startswith("http://127.0.0.1:")
    assert "--user start metralectl-agent.service" in calls.read_text().splitlines()
    stopped = json.loads(cli("agent", "stop", "--json", env=env).stdout)
    assert stopped["stopped"]["pid"] == doc["pid"] and stopped["how"] == "SIGTERM"  # not the unit's own: signalled
    assert not alive(doc["pid"])
