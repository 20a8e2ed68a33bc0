"""The control-plane page in a real browser (Debian's headless Chromium, driven by Selenium) against a
real agent and a real, private dockerd: with the daemon stopped the page says "This machine cannot run
models" with the doctor's remedy; once the daemon starts, the banner turns to "Ready" by itself — no
page reload, no agent restart — within a few check intervals, timed from the daemon's first answer.

The shared daemon (/var/run/docker.sock, used by the other tests) is never touched: the daemon here is
a second dockerd with its own socket, data root, exec root and pid file, stopped and started at will.

Chromium, chromedriver and selenium missing: skipped with the reason — except under CI (CI=true), where
that is a failure, as for the Docker daemon (tests/integration/conftest.py): a broken set-up must never
pass as "skipped". `scripts/bootstrap.sh` installs the packages.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.docker]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")  # Debian's; given explicitly so Selenium Manager never downloads
INTERVAL_S = 1.0  # the agent's re-check interval in this test
PAGE_POLL_S = 2.0  # app.js polls /api/status every 2 s
# Docker answers -> the page shows "ready": at most one check interval + one page poll, plus the round
# itself and a loaded 2-core machine's slack.
READY_WITHIN_S = INTERVAL_S + PAGE_POLL_S + 3.0


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


# -- a private dockerd ------------------------------------------------------------------------------

class DockerdFailed(Exception):
    pass


def group_members(pgid: int) -> list[int]:
    """The processes (zombies included) of process group pgid."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:  # after "(comm)": state, ppid, pgrp
                members.append(int(entry.name))
    return members


class PrivateDockerd:
    """A second dockerd of this test's own (as in test_doctor_real.py's private_dockerd), which can be
    started, stopped and started again on the same socket path. Its own session (process group); a
    stop returns once it and its containerd are gone; `close()` also undoes the bind mounts a killed
    one leaves."""

    def __init__(self) -> None:
        self.binary = shutil.which("dockerd") or "/usr/sbin/dockerd"
        self.base = Path(tempfile.mkdtemp(prefix="mpage-dockerd-", dir="/tmp"))
        self.socket = self.base / "d.sock"
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.containerd_pid: int | None = None
        self._log: IO[bytes] = open(self.base / "log", "ab")

    def log_tail(self, n: int = 800) -> str:
        self._log.flush()
        return (self.base / "log").read_text(errors="replace")[-n:]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> float:
        """Start the daemon; returns the monotonic time at which it first answered `GET /_ping`."""
        if self.running():
            raise DockerdFailed("the private dockerd is already running")
        (self.base / "pid").unlink(missing_ok=True)  # ours, and its process is gone: never "pid file found"
        self.proc = subprocess.Popen(
            [self.binary, "--host", self.url, "--data-root", str(self.base / "data"),
             "--exec-root", str(self.base / "exec"), "--pidfile", str(self.base / "pid"),
             "--bridge=none", "--iptables=false", "--ip-masq=false"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.answers():
                answered = time.monotonic()
                try:
                    pidfile = self.base / "exec" / "containerd" / "containerd.pid"
                    self.containerd_pid = int(pidfile.read_text())
                except (OSError, ValueError):
                    self.containerd_pid = None
                return answered
            time.sleep(0.02)
        raise DockerdFailed(f"the private dockerd did not come up (exit {self.proc.poll()}): "
                            f"{self.log_tail()}")

    def answers(self) -> bool:
        """The daemon's own health answer, straight over its socket (`GET /_ping` -> 200 OK)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(2.0)
                conn.connect(str(self.socket))
                conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                reply = b""
                while chunk := conn.recv(4096):
                    reply += chunk
        except OSError:
            return False
        return reply.split(b"\r\n", 1)[0].split(b" ")[1:2] == [b"200"]

    def stop(self, how: str = "term") -> None:
        """Stop it; returns once it and its containerd are gone. how="term": a clean stop, as `systemctl
        stop docker` does (SIGTERM; dockerd removes its socket). how="kill": a crash (SIGKILL to its
        group; the socket file stays, with nobody behind it)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            if how == "kill":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        # Wait until the containerd it started (its own session; it dies with dockerd by a parent-death
        # signal) and anything else of dockerd's group is gone, reaped. A killed dockerd's containerd is
        # reparented to PID 1, and until reaped that zombie counts as alive for the next dockerd
        # ("containerd is still running", then "timeout waiting for containerd to start"); systemd
        # reaps at once, this machine's init only every second or so.
        deadline = time.monotonic() + 20
        while (left := self._leftovers(proc.pid)) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        if left:
            raise DockerdFailed(f"processes of the private dockerd outlived it: {left}")

    def _leftovers(self, pgid: int) -> list[int]:
        left = group_members(pgid)
        pid = self.containerd_pid
        if pid is not None:
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "containerd":
                    left.append(pid)
            except OSError:
                pass
        return left

    def close(self) -> None:
        try:
            self.stop("term")  # a clean stop: dockerd takes its containerd down with it
        finally:
            self._log.close()
            for mounted in ("exec", "data"):  # dockerd bind-mounts these onto themselves; a kill leaves them
                subprocess.run(["umount", "-R", "-l", str(self.base / mounted)], capture_output=True)
            shutil.rmtree(self.base, ignore_errors=True)


# -- the browser ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        unavailable(f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver "
                    "(scripts/bootstrap.sh does)")
    try:
        from selenium import webdriver
    except ImportError:
        unavailable("selenium is not installed: pip install -e '.[test]'")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="mpage-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", "--no-proxy-server", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    from tests.ports import PortTaken, start_retrying

    def start(port: int) -> Any:
        # chromedriver binds the port it is given itself (selenium picks one the same way when not given one):
        # a busy box may take it first; chromedriver then says so in its log and exits, and we pick again
        log = Path(profile) / f"chromedriver-{port}.log"
        service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER), port=port, log_output=str(log))
        try:
            return webdriver.Chrome(options=options, service=service)
        except Exception:
            said = log.read_text(errors="replace") if log.exists() else ""
            if "Address already in use" in said or "bind() failed" in said:
                raise PortTaken(said[-300:]) from None
            raise

    try:
        driver = start_retrying(start)
    except Exception as exc:  # noqa: BLE001 - a browser that cannot start is the set-up's fault
        shutil.rmtree(profile, ignore_errors=True)
        unavailable(f"headless Chromium did not start: {type(exc).__name__}: {exc}")
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture()
def page(browser: Any) -> Any:
    """The browser, its console log drained: what a test finds there is its own page's."""
    browser.get_log("browser")
    return browser


def wait_for(driver: Any, timeout: float, condition: Callable[[Any], Any], what: str,
             state: Callable[[], Any] = lambda: None) -> Any:
    """Poll condition(driver) every 50 ms; on timeout fail with what did not happen and the page's state."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)
    except TimeoutException:
        raise AssertionError(f"within {timeout:g} s, {what}; the page shows {state()}") from None


# The capability card as rendered (innerText: the text as shown), read in one script so that the
# page's re-render every 2 s can never hand back half of one rendering and half of the next.
CARD_STATE = """
const card = document.getElementById("capability");
const shown = (sel) => card.querySelector(sel).innerText;
return {canRun: card.dataset.canRun, classes: Array.from(card.classList), title: shown("#cap-title"),
        summary: shown("#cap-summary"),
        problems: Array.from(card.querySelectorAll("#cap-problems li"), (li) => li.innerText),
        remedies: Array.from(card.querySelectorAll("#cap-problems .remedy"), (e) => e.innerText),
        remediesVisible: Array.from(card.querySelectorAll("#cap-problems .remedy"),
                                    (e) => e.checkVisibility())};
"""

# The action buttons (Stop in the serving table, Run/Swap in the recipes table), likewise.
BUTTONS = """
return Array.from(document.querySelectorAll("#serving tbody button, #recipes tbody button"),
                  (b) => ({text: b.innerText, enabled: !b.disabled, title: b.title}));
"""


def card(driver: Any) -> dict[str, Any]:
    return dict(driver.execute_script(CARD_STATE))


def buttons(driver: Any) -> list[dict[str, Any]]:
    return list(driver.execute_script(BUTTONS))


def loaded_from(driver: Any) -> list[str]:
    """Every URL this document loaded: itself and each resource (scripts, styles, every fetch)."""
    return list(driver.execute_script(
        "return performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))"
        ".map((e) => e.name)"))


def assert_loopback_only(driver: Any, origin: str) -> None:
    urls = loaded_from(driver)
    assert any(u.startswith(origin + "/api/status") for u in urls), urls
    elsewhere = [u for u in urls if not u.startswith(origin + "/")]
    assert not elsewhere, elsewhere


def assert_no_page_errors(driver: Any) -> None:
    """No script error and no Content-Security-Policy refusal in the console."""
    severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe


# -- the agent --------------------------------------------------------------------------------------

@pytest.fixture()
def agent_on(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """agent_on(docker_url) -> a real agent, started in-process, whose capability is the doctor's real
    docker.daemon check against that daemon (DOCKER_HOST). Stopped at the end of the test."""
    from metralectl.agent.capability import doctor_capability
    from metralectl.agent.service import Agent, AgentOptions

    started: list[Agent] = []

    def start(docker_url: str, checks: tuple[str, ...] = ("docker.daemon",)) -> Agent:
        monkeypatch.setenv("DOCKER_HOST", docker_url)
        # By default the doctor's real check, restricted to docker.daemon. This machine has no GPU and no
        # NVIDIA runtime, so the agent's other checks (docker.nvidia-runtime, gpu.driver, gpu.model) would
        # narrow the answer to the CPU recipes; Docker's state is what these tests change, so it decides.
        check = functools.partial(doctor_capability, checks)
        agent = Agent(AgentOptions(api_port=0, peer=False, interval_s=INTERVAL_S, regroup=False),
                      base=isolated_env / "config", check=check)
        agent.start()
        started.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in started:
            agent.stop()


def watch_for_ready(agent: Any) -> Any:
    """Watches the agent's own answer; the returned function gives when it first said can_run."""
    seen: list[float] = []

    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answer = agent.monitor.latest()
            if answer and answer.get("can_run") is True:
                seen.append(time.monotonic())
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, name="watch-agent", daemon=True)
    thread.start()

    def when() -> float:
        thread.join(30)
        assert seen, "the agent never said can_run"
        return seen[0]

    return when


def api_status(origin: str) -> dict[str, Any]:
    answer = httpx.get(origin + "/api/status", trust_env=False, timeout=10)
    assert answer.status_code == 200
    return dict(answer.json())


# -- the tests --------------------------------------------------------------------------------------

# How Docker is down: "term" as after `systemctl stop docker` (no socket; the remedy says to start the
# daemon DOCKER_HOST names), "kill" as after a crash (a dead socket: `systemctl start docker`).
EXPECTED_REMEDY = {"term": "start the daemon it names", "kill": "sudo systemctl start docker"}


@pytest.mark.parametrize("how", ["term", "kill"])
def test_banner_turns_ready_by_itself_when_docker_starts(page: Any, agent_on: Any, how: str,
                                                         record_property: Any) -> None:
    from selenium.webdriver.common.by import By

    browser = page
    if os.geteuid() != 0 or not Path(shutil.which("dockerd") or "/usr/sbin/dockerd").exists():
        unavailable("a private dockerd needs root and the dockerd binary")
    dockerd = PrivateDockerd()
    try:
        try:
            dockerd.start()  # it can come up here at all (else "ready" could never be shown)
        except DockerdFailed as exc:
            unavailable(str(exc))
        dockerd.stop(how)
        assert not dockerd.answers()
        assert dockerd.socket.exists() == (how == "kill"), "a clean stop removes its socket, a crash not"

        agent = agent_on(dockerd.url)
        origin = f"http://127.0.0.1:{agent.api.port}"
        browser.get(origin + "/")
        wait_for(browser, 15, lambda d: card(d)["canRun"] == "false" and card(d)["remedies"],
                 "the page did not say 'cannot run' with a remedy", lambda: card(browser))

        # What the page shows is the doctor's answer, as the API gives it.
        status = api_status(origin)
        assert status["can_run"] is False, status
        assert [p["id"] for p in status["problems"]] == ["docker.daemon"], status
        daemon = next(c for c in status["checks"] if c["id"] == "docker.daemon")
        assert daemon["data"]["cause"] == "not-running" and daemon["data"]["endpoint"] == dockerd.url, daemon
        shown = card(browser)
        assert shown["canRun"] == "false" and "cannot" in shown["classes"], shown
        assert browser.find_element(By.ID, "capability").get_attribute("data-can-run") == "false"
        assert shown["title"] == "This machine cannot run models"
        assert shown["remedies"] == [p["remedy"] for p in status["problems"]], (shown, status)
        assert shown["remediesVisible"] == [True]
        assert EXPECTED_REMEDY[how] in shown["remedies"][0], shown
        (problem,) = status["problems"]
        assert shown["problems"][0].startswith(f"{problem['title']}: {problem['detail']}"), shown
        assert problem["detail"] in shown["summary"]

        # Start Docker. The same document (no reload), the same agent (no restart).
        document = browser.execute_script("return window.__thisDocument = String(Math.random())")
        agent_saw = watch_for_ready(agent)
        answered = dockerd.start()
        wait_for(browser, 20, lambda d: card(d)["canRun"] == "true",
                 "the page did not turn to 'ready' after Docker started", lambda: card(browser))
        latency = time.monotonic() - answered
        agent_latency = agent_saw() - answered
        record_property("docker_answers_to_agent_ready_s", round(agent_latency, 3))
        record_property("docker_answers_to_page_ready_s", round(latency, 3))
        print(f"\n[{how}] docker answered -> agent says ready {agent_latency:.2f} s, "
              f"page shows ready {latency:.2f} s")

        assert browser.execute_script("return window.__thisDocument") == document, "the page was reloaded"
        assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1
        shown = card(browser)
        assert shown["title"] == "Ready: this machine can run models" and "ready" in shown["classes"], shown
        assert browser.find_element(By.ID, "capability").get_attribute("data-can-run") == "true"
        assert shown["problems"] == [] and shown["summary"] == "this machine can run models", shown
        assert api_status(origin)["can_run"] is True
        assert agent_latency <= INTERVAL_S + 1.0, f"{agent_latency:.2f} s from Docker answering to the agent"
        assert latency <= READY_WITHIN_S, f"{latency:.2f} s from Docker answering to the page saying ready"
        assert not agent.stopping.is_set()  # the same agent, never restarted
        assert_loopback_only(browser, origin)
        assert_no_page_errors(browser)
    finally:
        dockerd.close()


def test_a_box_without_a_gpu_is_ready_for_its_cpu_recipes(page: Any, agent_on: Any) -> None:
    """The agent's whole capability check (all four doctor checks) on this very machine, against the real
    daemon: no NVIDIA GPU here, so the GPU recipes cannot run but `demo-cpu` can. The page must say so
    (amber, the GPU's problems listed as limits), never "This machine cannot run models"."""
    from metralectl.agent.capability import CAPABILITY_CHECKS

    if Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA GPU: the answer is the GPU one")
    socket = Path("/var/run/docker.sock")
    if not socket.exists():
        unavailable("no Docker daemon at /var/run/docker.sock (tests/docker_image/start-dockerd.sh starts one)")
    agent = agent_on(f"unix://{socket}", CAPABILITY_CHECKS)
    origin = f"http://127.0.0.1:{agent.api.port}"
    page.get(origin + "/")
    wait_for(page, 30, lambda d: card(d)["canRun"] == "true", "the page did not say ready", lambda: card(page))

    status = api_status(origin)
    assert status["can_run"] is True and status["scope"] == "cpu" and status["problems"] == [], status
    assert "demo-cpu" in status["summary"] and status["summary"].startswith("this machine can run CPU recipes only")
    limits = [p["id"] for p in status["limits"]]
    assert "docker.nvidia-runtime" in limits and set(limits) <= {"docker.nvidia-runtime", "gpu.driver", "gpu.model"}
    daemon = next(c for c in status["checks"] if c["id"] == "docker.daemon")
    assert daemon["status"] == "ok", daemon  # a real daemon answered the real check

    shown = card(page)
    assert shown["title"] == "Ready for CPU recipes only (no usable GPU)", shown
    assert "limited" in shown["classes"] and "cannot" not in shown["classes"], shown
    assert shown["summary"] == status["summary"], shown
    assert len(shown["problems"]) == len(limits) and all(shown["problems"]), shown
    colour = page.execute_script(
        "return getComputedStyle(document.querySelector('#cap-title')).color")
    warn = page.execute_script("return getComputedStyle(document.documentElement).getPropertyValue('--warn')")
    assert warn.strip() == "#f5a524" and colour == "rgb(245, 165, 36)", (colour, warn)  # amber, not red
    assert_loopback_only(page, origin)
    assert_no_page_errors(page)


def test_token_leaves_the_address_bar_and_unlocks_actions(page: Any, agent_on: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser = page
    agent = agent_on(f"unix://{tmp_path}/no-daemon.sock")  # Docker's state does not matter here
    origin = f"http://127.0.0.1:{agent.api.port}"

    browser.get(origin + "/")
    wait_for(browser, 15, lambda d: len(buttons(d)) > 0, "the recipes table did not fill")
    read_only = buttons(browser)
    assert not any(b["enabled"] for b in read_only), f"read-only (no token), yet enabled: {read_only}"
    assert all("metralectl agent url" in b["title"] for b in read_only), read_only
    assert browser.find_element(By.ID, "token-form").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('metralectl-token')") is None

    # The address `metralectl agent url` prints, typed into the tab that already shows the page (a
    # same-document navigation: only the fragment changes) ...
    browser.get(f"{origin}/#token={agent.token}")
    wait_for(browser, 5, lambda d: d.execute_script("return location.hash") == "",
             "the token did not leave the address bar", lambda: browser.current_url)
    assert browser.current_url == origin + "/"
    assert browser.execute_script("return sessionStorage.getItem('metralectl-token')") == agent.token
    wait_for(browser, 5, lambda d: all(b["enabled"] for b in buttons(d)), "the actions were not enabled",
             lambda: buttons(browser))
    assert {b["text"] for b in buttons(browser)} == {"Run"}  # nothing serves: Run, not Swap
    assert not any(b["title"] for b in buttons(browser))
    assert not browser.find_element(By.ID, "token-form").is_displayed()
    assert not browser.find_element(By.ID, "token-card").is_displayed()  # the read-only notice goes with the token

    # ... and in a fresh tab, as a browser opens it: the same.
    browser.switch_to.new_window("tab")
    try:
        browser.get(f"{origin}/#token={agent.token}")
        wait_for(browser, 15, lambda d: d.execute_script("return location.hash") == "" and buttons(d),
                 "the token did not leave a new tab's address bar", lambda: browser.current_url)
        assert browser.execute_script("return sessionStorage.getItem('metralectl-token')") == agent.token
        assert browser.current_url == origin + "/"
        assert all(b["enabled"] for b in buttons(browser)), buttons(browser)
        assert_loopback_only(browser, origin)
        assert_no_page_errors(browser)
    finally:
        browser.close()
        browser.switch_to.window(browser.window_handles[0])
