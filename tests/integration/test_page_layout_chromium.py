"""The control-plane page's actions in a real browser (Debian's headless Chromium through Selenium, as in
test_page_chromium.py) against a real `metralectl agent` process, serving the engine test double on the
test Docker daemon through the agent's real API — nothing of the page's backend is faked:

* Stop and Swap only ask: the page's own dialog names what stops and what starts, and until its Confirm
  is pressed no request is sent (the agent's job list and what serves stay as they were; Cancel and
  Escape leave everything). Confirm sends it, and the change happens.
* At 1280×800, 1920×1080 and 800×800 the Stop button and the Run/Swap buttons are inside their card
  (element rects) with no horizontal overflow, even for a 64-character recipe name; a screenshot of the
  card is decoded (zlib, no imaging library needed) and the pixels at the button's rect are the button's
  colour, not the card's background: it is really painted there.
* The job log shows each event under its step ("check image", "start container", "wait ready") with a
  human label, never an internal event name; a reason the engine reports containing
  `<img src=x onerror=...>` is shown as that text: no element is made of it, no script runs.

Chromium, chromedriver or selenium missing: skipped, except under CI (CI=true), where it fails.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import REPO, Box
from tests.integration.pngread import near, png_pixels
from tests.integration.test_cli_beside_agent import RunningAgent, running_agent
from tests.integration.test_page_chromium import assert_no_page_errors, browser, wait_for  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.docker]

HOSTILE = '<img src=x onerror="window.__pwned=1">'
SIZES = [(1280, 800), (1920, 1080), (800, 800)]
CARD_BG = (0x18, 0x1B, 0x22)  # --card in app.css
STOP_BG = (0xE5, 0x48, 0x4D)  # --bad: button.danger
RUN_BG = (0x5B, 0x8D, 0xEF)  # --accent: button
INTERNAL_NAMES = {"Step", "Transfer", "ContainerStarted", "Phase", "LogLine", "Ready", "Failed", "Warning"}


# -- the page ---------------------------------------------------------------------------------------

# One script, one rendering: each action button with its rect, its card's rect, and whether the point at
# its centre is the button itself (nothing covers it).
GEOMETRY = """
const out = [];
for (const b of document.querySelectorAll("#serving tbody button, #recipes tbody button")) {
  const card = b.closest(".card"), r = b.getBoundingClientRect(), c = card.getBoundingClientRect();
  const table = b.closest("table");
  const cx = r.left + r.width / 2, cy = r.top + r.height / 2;
  out.push({text: b.innerText, row: b.closest("tr").cells[0].innerText, visible: b.checkVisibility(),
            onTop: document.elementFromPoint(cx, cy) === b,
            button: {left: r.left, right: r.right, top: r.top, bottom: r.bottom},
            card: {left: c.left, right: c.right, top: c.top, bottom: c.bottom,
                   clientWidth: card.clientWidth, scrollWidth: card.scrollWidth},
            tableWidth: table.scrollWidth, tableBox: table.getBoundingClientRect().width,
            page: document.documentElement.scrollWidth, viewport: window.innerWidth});
}
return out;
"""

JOB_LOG = """
return {state: document.getElementById("job-state").innerText,
        title: document.getElementById("job-title").innerText,
        rows: Array.from(document.querySelectorAll("#job-events li"),
                         (li) => Array.from(li.children, (s) => s.innerText)),
        images: document.querySelectorAll("body img").length, pwned: window.__pwned ?? null};
"""

DIALOG = """
const d = document.getElementById("confirm");
return {open: d.open, action: d.dataset.action || "", title: document.getElementById("confirm-title").innerText,
        stops: Array.from(document.querySelectorAll("#confirm-stops li"), (li) => li.innerText),
        starts: Array.from(document.querySelectorAll("#confirm-starts li"), (li) => li.innerText),
        confirm: document.getElementById("confirm-go").innerText, focused: document.activeElement.id};
"""


def button_in_row(driver: Any, table: str, recipe: str) -> Any:
    """The action button of the row whose first cell is recipe (looked up again each time: the tables are
    re-rendered every few seconds)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'))"
        ".find((tr) => tr.cells[0].innerText === arguments[1])?.querySelector('button') ?? null", table, recipe)


def scroll_to_button(driver: Any, table: str, recipe: str) -> None:
    """Found and scrolled in one script: an element handed back to Python can be re-rendered (stale) before
    the next call uses it."""
    found = driver.execute_script(
        "const b = Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'))"
        ".find((tr) => tr.cells[0].innerText === arguments[1])?.querySelector('button');"
        "if (b) b.scrollIntoView({block: 'center'}); return !!b;", table, recipe)
    assert found, f"no button in {table} for {recipe}"


def click_in_row(driver: Any, table: str, recipe: str) -> None:
    from selenium.common.exceptions import StaleElementReferenceException

    def enabled(d: Any) -> Any:
        b = button_in_row(d, table, recipe)
        try:
            return b is not None and b.is_enabled() and b
        except StaleElementReferenceException:  # re-rendered between the lookup and the question: look again
            return False

    for _ in range(20):
        button = wait_for(driver, 30, enabled, f"no enabled button in {table}'s row {recipe}")
        try:
            button.click()
            return
        except StaleElementReferenceException:  # re-rendered between finding and clicking: find it again
            continue
    raise AssertionError(f"the button of {table}'s row {recipe} kept being replaced")


def dialog(driver: Any) -> dict[str, Any]:
    return dict(driver.execute_script(DIALOG))


def job_log(driver: Any) -> dict[str, Any]:
    return dict(driver.execute_script(JOB_LOG))


def set_viewport(driver: Any, width: int, height: int) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    wait_for(driver, 5, lambda d: d.execute_script("return window.innerWidth") == width,
             f"the viewport did not become {width} wide")


# -- the agent and its box --------------------------------------------------------------------------

class Served:
    def __init__(self, box: Box, agent: RunningAgent) -> None:
        self.box, self.agent = box, agent
        self.origin = f"http://127.0.0.1:{agent.port}"
        self.token = (box.config / "agent" / "token").read_text().strip()

    def serving(self) -> list[tuple[str, str]]:
        answer = httpx.get(self.origin + "/api/serving", trust_env=False, timeout=10).json()
        return [(s["recipe"], s["state"]) for s in answer["serving"]]

    def jobs(self) -> list[tuple[str, str | None, str]]:
        return [(j["kind"], j["target"], j["state"]) for j in self.agent.jobs()]

    def job(self, index: int) -> dict[str, Any]:
        job_id = self.agent.jobs()[index]["id"]
        return dict(httpx.get(f"{self.origin}/api/jobs/{job_id}", trust_env=False, timeout=10).json())

    def post(self, kind: str, recipe: str) -> None:
        """A change through the agent's API, as another client (the CLI) sends it."""
        answer = httpx.post(f"{self.origin}/api/{kind}", json={"recipe": recipe}, trust_env=False, timeout=10,
                            headers={"Authorization": f"Bearer {self.token}"})
        assert answer.status_code == 202, answer.text

    def wait_jobs_finished(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = self.jobs()
            if len(jobs) == count and all(state in ("done", "failed", "cancelled") for _, _, state in jobs):
                return
            time.sleep(0.2)
        raise AssertionError(f"within {timeout} s the agent's jobs did not all end: {self.jobs()}")


@pytest.fixture()
def served(box: Box) -> Iterator[Served]:
    import sys

    sys.path.insert(0, str(REPO / "tests" / "docker_image"))
    import bundle

    # An engine that loads, then reports a GPU fault whose reason is markup (what an engine, or whatever
    # answers on its port, may say): the page must show it as text.
    tag = bundle.build_variant(bundle.variant_tag("hostile-fault"),
                               {"DOUBLE_FAULT": "gpu-fault", "DOUBLE_FAULT_REASON": HOSTILE})
    (box.config / "images" / "double-hostile.yaml").write_text(
        (box.config / "images" / "double-ok.yaml").read_text().replace("id: double-ok", "id: double-hostile")
        .replace(box.images["ok"], tag))
    box.weights_complete()
    wait_for_the_daemon_to_ourselves(box)
    with running_agent(box) as agent:
        yield Served(box, agent)


def wait_for_the_daemon_to_ourselves(box: Box, timeout: float = 180) -> None:
    """The page shows whatever metralectl serves on the daemon: another test's model (other checkouts share
    this daemon) would turn Run into Swap. Wait for them to end; CI runs one suite at a time."""
    import os
    import subprocess

    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(["docker", "ps", "-a", "--filter", "label=ai.metrale.metralectl.managed=true",
                              "--format", "{{.Names}}"], capture_output=True, text=True)
        others = [n for n in out.stdout.split() if not n.startswith(f"metralectl-{box.prefix}")]
        if not others:
            return
        if time.monotonic() > deadline:
            if os.environ.get("CI"):
                pytest.fail(f"CI: other metralectl containers on the test daemon: {others}")
            pytest.skip(f"other metralectl containers on this daemon for {timeout:g} s: {others}")
        time.sleep(1.0)


def open_page(driver: Any, served: Served, width: int = 1280, height: int = 800) -> None:
    set_viewport(driver, width, height)
    driver.get(f"{served.origin}/#token={served.token}")
    wait_for(driver, 30, lambda d: d.execute_script("return location.hash") == "" and
             d.execute_script("return document.querySelectorAll('#recipes tbody button:not([disabled])').length") > 0,
             "the page did not take the token and list the recipes")


# -- the tests --------------------------------------------------------------------------------------

def test_job_log_names_steps_and_shows_what_the_engine_says_as_text(browser: Any, served: Served) -> None:  # noqa: F811
    page = browser
    page.get("about:blank")  # the last test's page (its agent gone) stops polling before the log is drained
    page.get_log("browser")
    hostile = served.box.recipe("hostile", image="hostile")
    open_page(page, served)
    assert served.serving() == []
    click_in_row(page, "#recipes", hostile)  # nothing serves: Run replaces nothing, so it does not ask
    assert dialog(page)["open"] is False
    wait_for(page, 90, lambda d: job_log(d)["state"].startswith("failed"), "the run did not fail",
             lambda: (job_log(page), served.jobs(), page.get_log("browser")))
    served.wait_jobs_finished(1)
    assert served.jobs() == [("run", hostile, "failed")]

    shown = job_log(page)
    job = served.job(0)
    assert HOSTILE in job["error"]  # it came from the engine, through the agent's API, as it is
    assert shown["state"].startswith(f"failed: {job['error'][:40]}") and HOSTILE in shown["state"], shown
    assert shown["title"] == f"run {hostile}"
    steps = [row[0] for row in shown["rows"]]
    assert all(len(row) == 3 for row in shown["rows"]), shown["rows"]
    for step in ("check image", "check weights", "check port", "start container", "wait ready"):
        assert step in steps, (step, steps)
    assert steps.index("check image") < steps.index("start container") < steps.index("wait ready")
    assert not {w for row in shown["rows"] for w in row[:2]} & INTERNAL_NAMES, shown["rows"]
    failed = [row for row in shown["rows"] if row[1].startswith("failed")]
    assert failed and failed[-1][0] == "wait ready" and failed[-1][1] == "failed (gpu-fault)", shown["rows"]
    assert HOSTILE in failed[-1][2], failed  # the markup, shown as the text it is
    # ... and nothing was made of it: no element, no script run, no error logged.
    assert shown["images"] == 0 and shown["pwned"] is None, shown
    assert not page.find_elements("css selector", "#job-card img, #job-events img")
    assert served.box.containers() == []  # the failed start's container was removed
    assert_no_page_errors(page)


def test_stop_and_swap_ask_first_and_stay_inside_their_cards(browser: Any, served: Served,  # noqa: F811
                                                              tmp_path: Path) -> None:
    page = browser
    page.get("about:blank")  # the last test's page (its agent gone) stops polling before the log is drained
    page.get_log("browser")
    box = served.box
    long = box.recipe("served-under-a-long-recipe-name-that-pushed-stop-off-th")  # 64 characters
    other = box.recipe("other")
    assert len(long) == 64
    open_page(page, served)

    # Start serving through the page (nothing serves: Run, no question), as the operator would.
    click_in_row(page, "#recipes", long)
    assert dialog(page)["open"] is False
    served.wait_jobs_finished(1)
    assert served.jobs() == [("run", long, "done")], served.job(0)
    wait_for(page, 15, lambda d: button_in_row(d, "#serving", long) is not None, "no Stop for what serves")
    wait_for(page, 15, lambda d: d.execute_script(  # the text read in the page: no element handle to go stale
        "return Array.from(document.querySelectorAll('#recipes tbody tr')).find((tr) => tr.cells[0].innerText === "
        "arguments[0])?.querySelector('button')?.innerText ?? null", other) == "Swap to", "Run did not turn to Swap to")
    wait_for(page, 15, lambda d: d.execute_script("return document.getElementById('serving-busy').innerText") == "",
             "the finished run is still shown in progress")  # its line goes at a later poll, moving the card

    # -- layout: every action button inside its card, painted where its rect says ---------------------
    for width, height in SIZES:
        set_viewport(page, width, height)
        time.sleep(0.2)  # one layout pass after the resize (a render, not a time the test measures)
        for table, recipe, colour in (("#serving", long, STOP_BG), ("#recipes", other, RUN_BG)):
            scroll_to_button(page, table, recipe)
            geometry = page.execute_script(GEOMETRY)
            assert len(geometry) >= 2, geometry
            for g in geometry:
                b, c = g["button"], g["card"]
                where = f"at {width}x{height}, {g['text']!r} of {g['row']!r}: button {b}, card {c}"
                assert g["visible"], where
                assert c["left"] <= b["left"] and b["right"] <= c["right"], where
                assert c["top"] <= b["top"] and b["bottom"] <= c["bottom"], where
                assert c["scrollWidth"] <= c["clientWidth"] and g["tableWidth"] <= g["tableBox"] + 1, where
                assert g["page"] <= g["viewport"], f"at {width}x{height} the page scrolls sideways: {g}"
            page.save_screenshot(str(tmp_path / f"page-{table[1:]}-{width}x{height}.png"))  # for a person to look at
            mine = next(g for g in geometry if g["row"] == recipe)
            assert mine["onTop"], mine
            look_at_the_button(page, lambda: next(g for g in page.execute_script(GEOMETRY) if g["row"] == recipe),
                               colour, tmp_path / f"{table[1:]}-{width}x{height}.png")
    set_viewport(page, 1280, 800)

    # -- Stop asks; Cancel and Escape leave everything ---------------------------------------------------
    before = served.jobs()
    for leave in ("cancel", "escape"):
        click_in_row(page, "#serving", long)
        shown = wait_for(page, 5, lambda d: (s := dialog(d))["open"] and s, "Stop did not ask")
        assert shown["action"] == "stop" and shown["title"] == f"Stop {long}?", shown
        assert shown["stops"][0].startswith(f"{long} (container metralectl-{long}, http://127.0.0.1:"), shown
        assert shown["starts"] == ["nothing: no model will be served"], shown
        assert shown["confirm"] == "Confirm stop" and shown["focused"] == "confirm-cancel", shown
        page.save_screenshot(str(tmp_path / "confirm-stop.png"))  # for a person to look at
        time.sleep(1.5)  # a request the click might have sent has long arrived (the agent answers in ms)
        assert served.jobs() == before and served.serving() == [(long, "running")]
        if leave == "cancel":
            page.find_element("id", "confirm-cancel").click()
        else:
            from selenium.webdriver.common.action_chains import ActionChains
            from selenium.webdriver.common.keys import Keys

            ActionChains(page).send_keys(Keys.ESCAPE).perform()
        wait_for(page, 5, lambda d: not dialog(d)["open"], f"{leave} did not close the question")
        time.sleep(1.0)
        assert served.jobs() == before and served.serving() == [(long, "running")], leave

    # -- Confirmed while another metralectl holds the lifecycle lock: sent, refused, said on the page -----
    from metralectl.seams.store import lifecycle_lock

    with lifecycle_lock("swap by the operator's CLI", path=box.home / "metralectl-lifecycle.lock"):
        click_in_row(page, "#serving", long)
        wait_for(page, 5, lambda d: dialog(d)["open"], "Stop did not ask")
        page.find_element("id", "confirm-go").click()
        refusal = wait_for(page, 10, lambda d: d.find_element("id", "action-error").is_displayed() and
                           d.find_element("id", "action-error-text").text, "the refusal was not shown")
        assert refusal.startswith("stop refused: busy: swap by the operator's CLI (pid "), refusal
        assert served.jobs() == before and served.serving() == [(long, "running")]
    logged = [e["message"] for e in page.get_log("browser") if e.get("level") == "SEVERE"]
    assert all("/api/stop - Failed to load resource" in m and "409" in m for m in logged), logged  # that refusal

    # -- Swap asks, naming what stops and what starts; Confirm sends it -----------------------------------
    click_in_row(page, "#recipes", other)
    shown = wait_for(page, 5, lambda d: (s := dialog(d))["open"] and s, "Swap did not ask")
    assert shown["action"] == "swap" and shown["title"] == f"Swap to {other}?", shown
    assert shown["stops"] == [f"{long} (container metralectl-{long}), after its requests in flight finish"], shown
    assert shown["starts"][0].startswith(f"{other}: "), shown
    time.sleep(1.0)
    assert served.jobs() == before
    page.find_element("id", "confirm-go").click()
    wait_for(page, 5, lambda d: not dialog(d)["open"], "Confirm did not close the question")
    served.wait_jobs_finished(2)
    assert not page.find_element("id", "action-error").is_displayed()  # the next accepted change clears it
    assert served.jobs() == [("run", long, "done"), ("swap", other, "done")], served.job(1)
    assert served.serving() == [(other, "running")]

    # -- Stop, confirmed -----------------------------------------------------------------------------------
    wait_for(page, 15, lambda d: button_in_row(d, "#serving", other) is not None, "no Stop for the swapped-in model")
    click_in_row(page, "#serving", other)
    wait_for(page, 5, lambda d: dialog(d)["open"], "Stop did not ask")
    page.find_element("id", "confirm-go").click()
    served.wait_jobs_finished(3)
    assert served.jobs()[-1] == ("stop", other, "done"), served.job(2)
    assert served.serving() == [] and box.containers() == []
    wait_for(page, 15, lambda d: job_log(d)["state"] == "done" and job_log(d)["title"] == f"stop {other}",
             "the page did not follow the stop job", lambda: job_log(page))
    assert any(row[:2] == ["stop container", "stopping"] for row in job_log(page)["rows"]), job_log(page)

    # -- What serves changes while the dialog is open: Confirm shows the new state and asks again -------
    served.post("run", long)
    served.wait_jobs_finished(4)
    click_in_row(page, "#serving", long)
    wait_for(page, 5, lambda d: dialog(d)["open"], "Stop did not ask")
    served.post("stop", long)  # another client stops it meanwhile
    served.wait_jobs_finished(5)
    wait_for(page, 15, lambda d: button_in_row(d, "#serving", long) is None, "the page did not see the stop")
    page.find_element("id", "confirm-go").click()
    shown = dialog(page)
    assert shown["open"] and shown["stops"] == [f"nothing: {long} no longer serves"], shown
    assert page.find_element("id", "confirm-note").is_displayed()
    go = page.find_element("id", "confirm-go")
    assert not go.is_enabled() and go.text == "Nothing to stop", go.text  # a stop of nothing is not offered
    page.execute_script("document.getElementById('confirm-go').disabled = false")  # even forced: Confirm again
    go.click()
    time.sleep(1.0)
    assert len(served.jobs()) == 5  # nothing sent, either time
    assert dialog(page)["open"]  # still shown: the operator reads it and closes it
    page.find_element("id", "confirm-cancel").click()
    wait_for(page, 5, lambda d: not dialog(d)["open"], "Cancel did not close the question")
    assert served.jobs()[3:] == [("run", long, "done"), ("stop", long, "done")]
    assert_no_page_errors(page)


def look_at_the_button(page: Any, measure: Callable[[], dict[str, Any]], colour: tuple[int, int, int],
                       path: Path) -> None:
    """A screenshot of the button's card, decoded: the button's pixels are its colour, the card's corner
    is the card's background (so the coordinates really match). The rects are measured before and after the
    screenshot and the pair must agree: a page that re-renders between the two (its poll, a reflow after a
    resize) is shot again, since a rect is only worth comparing with the frame it was measured in."""
    for _ in range(10):
        page.execute_async_script(  # two frames: what is measured next has been painted
            "const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(() => done(true)));")
        g = measure()
        scroll = page.execute_script("return [window.scrollX, window.scrollY, window.innerHeight]")
        c, b = g["card"], g["button"]
        top = math.ceil(max(c["top"], 0))
        bottom = math.floor(min(c["bottom"], scroll[2]))
        left, right = math.ceil(c["left"]), math.floor(c["right"])  # whole pixels, inside the card
        clip = {"x": left, "y": top, "width": right - left, "height": bottom - top, "scale": 1}
        shot = page.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "clip": {  # page coordinates
            **clip, "x": clip["x"] + scroll[0], "y": clip["y"] + scroll[1]}})
        after = measure()
        if (after["card"], after["button"]) == (c, b) and \
                page.execute_script("return [window.scrollX, window.scrollY, window.innerHeight]") == scroll:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"{path.name}: the layout moved between every measurement and its screenshot")
    data = base64.b64decode(shot["data"])
    path.write_bytes(data)
    width, height, rows, bpp = png_pixels(data)
    assert (width, height) == (clip["width"], clip["height"]), (width, height, clip)

    def pixel(x: float, y: float) -> tuple[int, ...]:
        px, py = int(x - clip["x"]), int(y - clip["y"])
        return tuple(rows[py][px * bpp:px * bpp + 3])

    samples = [pixel(b["left"] + dx * (b["right"] - b["left"]), b["top"] + dy * (b["bottom"] - b["top"]))
               for dx in (0.1, 0.5, 0.9) for dy in (0.15, 0.85)]  # the corners of its box, clear of its label
    painted = [s for s in samples if near(s, colour)]
    assert len(painted) >= 4, f"{path.name}: at the button's rect {b} the screenshot shows {samples}, not {colour}"
    assert not any(near(s, CARD_BG, 8) for s in samples), f"{path.name}: card background where the button is"
    corner = pixel(c["right"] - 6, (top + bottom) / 2 if top > c["top"] else top + 6)
    assert near(corner, CARD_BG, 8), f"{path.name}: the card's edge is {corner}, not its background {CARD_BG}"
