"""App-wide behaviour: views at 80×24, themes, command palette, quitting mid-action, the CLI entry."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

from metralectl.tui.app import MetralectlApp
from metralectl.tui.screens.progress import ProgressScreen
from metralectl.errors import ExitCode
from tests.unit.tui.conftest import until
from tests.unit.tui.fakes import FakeServices

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_every_view_renders_at_80x24_and_200x50(services: FakeServices) -> None:
    async def scenario(size: tuple[int, int]) -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=size) as pilot:
            for key, view in (("2", "library"), ("3", "bench"), ("4", "doctor"), ("1", "serving")):
                await pilot.press(key)
                await until(pilot, lambda view=view: app.main.active == view)  # type: ignore[misc]
                await pilot.pause(0.1)
                assert app.export_screenshot()  # the compositor renders the whole screen
            assert app.main.has_class("-narrow" if size[0] < 120 else "-wide")

    asyncio.run(scenario((80, 24)))
    asyncio.run(scenario((200, 50)))


def test_theme_toggle_and_palette_commands(services: FakeServices) -> None:
    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(100, 30)) as pilot:
            assert app.theme == "textual-dark"
            await pilot.press("ctrl+t")
            assert app.theme == "textual-light"
            await until(pilot, lambda: app.main.query_one("#library-view").snapshot is not None)  # type: ignore[attr-defined]
            titles = [c.title for c in app.get_system_commands(app.screen)]
            for expected in ("View: Library", "Theme: toggle light/dark", "Stop the served model",
                             "Doctor: re-run checks", "Run qwen3.5-35b-a3b", "Swap to gemma-4-31b", "Pull gemma-4-31b"):
                assert expected in titles
            await pilot.press("ctrl+p")
            await pilot.pause(0.2)
            await pilot.press(*"View: Doctor")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await until(pilot, lambda: app.main.active == "doctor", what="palette switched view")

    asyncio.run(scenario())


def test_quit_during_an_action_cancels_it_first(services: FakeServices) -> None:
    services.hold = threading.Event()

    async def scenario() -> None:
        app = MetralectlApp(services)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("2")
            await until(pilot, lambda: app.main.query_one("#recipes").row_count == 4 and app.focused is not None
                        and app.focused.id == "recipes")
            await pilot.press("r")
            await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen")
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ProgressScreen) and app.screen.model.phase == "loading")
            await app.action_quit()
        deadline = time.monotonic() + 5  # the worker thread finishes its cleanup (the process waits for it)
        while not services.cleaned_up and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert services.cleaned_up == ["run qwen3.5-35b-a3b"]

    asyncio.run(scenario())


def _cli(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                          check=False)


@pytest.mark.parametrize("argv", [["tui", "--help"], []])
def test_cli_entry_imports_no_textual_until_the_dashboard_opens(argv: list[str]) -> None:
    out = _cli("import sys, runpy\n"
               f"sys.argv = ['metralectl', *{argv!r}]\n"
               "try:\n    runpy.run_module('metralectl', run_name='__main__')\nexcept SystemExit:\n    pass\n"
               "print('TEXTUAL=' + str('textual' in sys.modules), file=sys.stderr)\n")
    assert "TEXTUAL=False" in out.stderr, out.stderr
    if not argv:
        assert "Usage: metralectl" in out.stdout  # no terminal: the help, as before


def test_no_arguments_on_a_terminal_opens_the_dashboard(monkeypatch: pytest.MonkeyPatch) -> None:
    import metralectl.tui as dashboard
    from metralectl.cli.main import main

    opened: list[str | None] = []
    monkeypatch.setattr(dashboard, "run", lambda services=None, *, hardware=None: opened.append(hardware) or 0)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 0 and opened == [None]
    with pytest.raises(SystemExit):
        main(["tui", "--hardware", "gb10"])
    assert opened == [None, "gb10"]


def test_every_spelling_of_tui_opens_the_dashboard(monkeypatch: pytest.MonkeyPatch) -> None:
    import metralectl.tui as dashboard
    from metralectl.cli.main import main

    opened: list[str | None] = []
    monkeypatch.setattr(dashboard, "run", lambda services=None, *, hardware=None: opened.append(hardware) or 0)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    for argv, hardware in (([], None), (["tui"], None), (["tui", "--hardware", "gb10"], "gb10"),
                           (["tui", "--hardware=hopper"], "hopper")):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0 and opened[-1] == hardware, argv
    assert len(opened) == 4


def test_tui_without_a_terminal_is_a_usage_error() -> None:
    out = subprocess.run([sys.executable, "-m", "metralectl", "tui"], capture_output=True, text=True, cwd=REPO,
                         timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert out.returncode == ExitCode.USAGE and "needs a terminal" in out.stderr and "Traceback" not in out.stderr
