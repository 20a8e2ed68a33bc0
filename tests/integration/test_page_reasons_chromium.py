"""The control-plane page says why before anything is asked (issue 28, item 6), in headless Chromium against a
real `metralectl agent` on the test Docker daemon (as test_page_layout_chromium.py):

* a recipe that cannot run on this box whatever serves (two ranks; an image for another platform) has its
  Run disabled, the reason written under it — the words `metralectl run` itself ends with — and visible
  without scrolling (element rects inside the viewport at 1280×800 and 1920×1080); clicking it asks nothing
  and sends nothing;
* FITS `no` shows its reason in the cell (the words of `list`'s footnotes and the dashboard's line);
* a change the CLI makes itself (not one of the agent's jobs) is said on the Serving card, from the
  lifecycle lock's holder, while it runs;
* without the token, the read-only notice is the first card of the page, on its first screen; with it,
  the notice is gone and the runnable recipe's Run is enabled.

Chromium, chromedriver or selenium missing: skipped, except under CI (CI=true), where it fails.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Box
from tests.integration.test_cli_beside_agent import RunningAgent, running_agent
from tests.integration.test_page_chromium import assert_no_page_errors, browser, wait_for  # noqa: F401
from tests.integration.test_page_layout_chromium import set_viewport, wait_for_the_daemon_to_ourselves

pytestmark = [pytest.mark.integration, pytest.mark.docker]

TWO_RANKS = "deepseek-v4-flash-ep2"  # the first row: needs a worker node, never started from the page

# One rendering, read in one script: a row's cells, its button and reason with their rects, the viewport.
ROW = """
const tr = Array.from(document.querySelectorAll('#recipes tbody tr')).find((r) => r.cells[0].innerText === arguments[0]);
if (!tr) return null;
const rect = (e) => { if (!e) return null; const r = e.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, visible: e.checkVisibility()}; };
const button = tr.querySelector('button');
const under = tr.nextElementSibling && tr.nextElementSibling.classList.contains('why') ? tr.nextElementSibling : null;
const blocked = under && under.querySelector('.blocked'), fit = under && under.querySelector('.fit');
return {button: button && {text: button.innerText, disabled: button.disabled, rect: rect(button),
                           describedBy: button.getAttribute('aria-describedby')},
        why: blocked && {text: blocked.innerText, rect: rect(blocked), id: blocked.parentElement.id},
        fit: fit && fit.innerText, fits: tr.cells[4].innerText, card: rect(tr.closest('.card')),
        viewport: {width: window.innerWidth, height: window.innerHeight}, scrollY: window.scrollY};
"""

NOTICE = """
const n = document.getElementById('token-card'), main = document.querySelector('main');
const r = n.getBoundingClientRect(), cap = document.getElementById('capability').getBoundingClientRect();
return {shown: n.checkVisibility(), first: main.firstElementChild === n, text: n.innerText,
        top: r.top, bottom: r.bottom, capabilityTop: cap.top, height: window.innerHeight, scrollY: window.scrollY};
"""


class Page:
    def __init__(self, box: Box, agent: RunningAgent) -> None:
        self.box, self.agent = box, agent
        self.origin = f"http://127.0.0.1:{agent.port}"
        self.token = (box.config / "agent" / "token").read_text().strip()

    def api_recipes(self) -> dict[str, dict[str, Any]]:
        answer = httpx.get(self.origin + "/api/recipes", trust_env=False, timeout=30).json()
        return {r["name"]: r for r in answer["recipes"]}


@pytest.fixture()
def page(box: Box) -> Iterator[Page]:
    box.weights_complete()
    wait_for_the_daemon_to_ourselves(box)
    with running_agent(box) as agent:
        yield Page(box, agent)


def inside(rect: dict[str, Any], viewport: dict[str, int]) -> bool:
    return rect["visible"] and rect["top"] >= 0 and rect["bottom"] <= viewport["height"] and \
        rect["left"] >= 0 and rect["right"] <= viewport["width"]


def test_what_cannot_run_here_is_disabled_with_the_reason_in_view(browser: Any, page: Page,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    driver, box = browser, page.box
    runnable = box.recipe("runs")
    # an image this box cannot run: its platform is another CPU's (the launch refuses it before anything)
    (box.config / "images" / "double-arm.yaml").write_text(
        (box.config / "images" / "double-ok.yaml").read_text().replace("id: double-ok", "id: double-arm")
        .replace("platform: linux/amd64", "platform: linux/arm64"))
    elsewhere = box.recipe("elsewhere", image="arm")
    refused = box.cli("run", elsewhere)  # what the launch itself says
    assert refused.returncode == 1 and refused.stderr.startswith("metralectl: image "), refused.stderr
    launch_says = refused.stderr.split("\n")[0].removeprefix("metralectl: ")
    api = page.api_recipes()
    assert api[elsewhere]["blocked"]["error"] == launch_says and api[runnable]["blocked"] is None
    assert api[TWO_RANKS]["blocked"]["error"].startswith(f"{TWO_RANKS} needs 2 ranks on 2 nodes")

    driver.get("about:blank")
    driver.get_log("browser")
    for width, height in ((1280, 800), (1920, 1080)):
        set_viewport(driver, width, height)
        driver.get(f"{page.origin}/#token={page.token}")
        wait_for(driver, 30, lambda d: d.execute_script(ROW, runnable) is not None
                 and not d.execute_script(ROW, runnable)["button"]["disabled"], "the recipes with the token")
        wait_for(driver, 30, lambda d: d.execute_script("return document.getElementById('capability').dataset.canRun")
                 in ("true", "false"), "the agent's capability shown (the card above the recipes at its height)")
        first = driver.execute_script(ROW, TWO_RANKS)
        where = f"at {width}x{height}: {first}"
        verb = first["button"]["text"]  # Run; Swap to while another checkout's model serves on the shared daemon
        assert first["scrollY"] == 0 and first["button"]["disabled"] and verb in ("Run", "Swap to"), where
        blocked = api[TWO_RANKS]["blocked"]
        assert first["why"]["text"] == f"{verb}: {blocked['error']} — {blocked['hint']}", where
        assert first["button"]["describedBy"] == first["why"]["id"], where
        assert inside(first["button"]["rect"], first["viewport"]) and inside(first["why"]["rect"], first["viewport"]), \
            f"the disabled Run or its reason is not on the first screen {where}"
        assert first["why"]["rect"]["top"] >= first["button"]["rect"]["bottom"] - 1, where  # under its row
        assert first["fits"] == "no" and first["fit"] == f"Fits no: {api[TWO_RANKS]['fit_note']}", where
        driver.save_screenshot(str(tmp_path / f"reasons-{width}x{height}.png"))  # for a person to look at

    driver.execute_script(
        "Array.from(document.querySelectorAll('#recipes tbody tr')).find((r) => r.cells[0].innerText === arguments[0])"
        ".scrollIntoView({block: 'center'})", elsewhere)
    shown = driver.execute_script(ROW, elsewhere)
    assert shown["button"]["disabled"] and shown["why"]["text"].startswith(f"{shown['button']['text']}: {launch_says}"), shown
    assert inside(shown["why"]["rect"], shown["viewport"]), shown
    ours = driver.execute_script(ROW, runnable)
    assert not ours["button"]["disabled"] and ours["why"] is None, ours  # (the others' model aside: Run or Swap)
    # A click on the disabled Run asks nothing and sends nothing.
    driver.execute_script(
        "Array.from(document.querySelectorAll('#recipes tbody tr')).find((r) => r.cells[0].innerText === arguments[0])"
        ".querySelector('button').click()", elsewhere)
    time.sleep(1.0)
    assert not driver.execute_script("return document.getElementById('confirm').open")
    assert page.agent.jobs() == [] and box.containers() == []
    assert_no_page_errors(driver)


def test_the_read_only_notice_is_the_first_thing_on_the_page(browser: Any, page: Page,  # noqa: F811
                                                             tmp_path: Path) -> None:
    driver = browser
    driver.get("about:blank")
    driver.get_log("browser")
    for width, height in ((1280, 800), (800, 800)):
        set_viewport(driver, width, height)
        driver.execute_script("sessionStorage.clear()") if driver.current_url.startswith(page.origin) else None
        driver.get(f"{page.origin}/")
        wait_for(driver, 30, lambda d: d.execute_script(ROW, TWO_RANKS) is not None, "the recipes")
        notice = driver.execute_script(NOTICE)
        where = f"at {width}x{height}: {notice}"
        assert notice["shown"] and notice["first"] and notice["scrollY"] == 0, where
        assert 0 <= notice["top"] and notice["bottom"] <= notice["height"] and notice["bottom"] <= notice["capabilityTop"], where
        assert notice["text"].startswith("Read-only\n") and "metralectl agent url" in notice["text"], where
        driver.save_screenshot(str(tmp_path / f"read-only-{width}x{height}.png"))  # for a person to look at
        runs = driver.execute_script(
            "return Array.from(document.querySelectorAll('#recipes tbody button')).every((b) => b.disabled)")
        assert runs, "without the token every action is disabled"
    driver.get(f"{page.origin}/#token={page.token}")
    wait_for(driver, 30, lambda d: not d.execute_script(NOTICE)["shown"], "the notice did not go with the token")
    assert_no_page_errors(driver)


def test_a_change_the_cli_makes_is_said_on_the_page(browser: Any, page: Page) -> None:  # noqa: F811
    """The CLI does its change itself, not as one of the agent's jobs: the page still says what is happening on
    this machine (the lifecycle lock's holder, from GET /api/serving), and stops saying it once it has ended."""
    driver, box = browser, page.box
    slow = box.recipe("slow", image="slow")  # loads for 30 s without a word
    driver.get("about:blank")
    driver.get_log("browser")
    driver.get(f"{page.origin}/#token={page.token}")
    wait_for(driver, 30, lambda d: d.execute_script(ROW, TWO_RANKS) is not None, "the recipes")
    assert not driver.find_element("id", "serving-busy").is_displayed()
    run = box.popen("run", slow)
    try:
        box.wait_for_container()
        said = wait_for(driver, 10, lambda d: d.find_element("id", "serving-busy").is_displayed()
                        and d.find_element("id", "serving-busy").text, "the CLI's run shown as in progress")
        assert said == f"In progress on this machine: run {slow} (pid {run.pid})", said
    finally:
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    wait_for(driver, 10, lambda d: not d.find_element("id", "serving-busy").is_displayed(), "the line gone once it ended")
    assert page.agent.jobs() == [] and box.containers() == []
    assert_no_page_errors(driver)
