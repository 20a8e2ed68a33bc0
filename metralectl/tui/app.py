"""The dashboard: four views in tabs (Serving, Library, Benchmarks, Doctor), a footer of bindings and
the command palette (ctrl+p). Services are injected (tests pass fakes); workers call them on threads.

Keys: 1-4 switch views, ctrl+p palette, ctrl+t light/dark, q quits (cancelling a running action
first). Library: / filter, p pull, r run, w swap, x stop. Serving: f follow/pause log, x stop.
Benchmarks: ctrl+g run, ctrl+x cancel. Doctor: ctrl+r re-run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from metralectl.errors import MetralError
from metralectl.safetext import clean, printable
from metralectl.tui.first_frame import FIRST_FRAME_CSS
from metralectl.tui.outside import markup
from metralectl.tui.messages import PlanReady, ServedChanged, WorkerFailed
from metralectl.tui.screens.main import VIEWS, MainScreen
from metralectl.tui.views.serving import ServingView

if TYPE_CHECKING:  # the other views, the dialogs and services.py's values come after the first frame
    from textual.notifications import SeverityLevel

    from metralectl.tui.services import Action, Outcome, Services
    from metralectl.tui.views.library import LibraryView

WORKER_THREADS = 16  # long-lived feeds (status, telemetry, logs) must never starve an action


class MetralectlApp(App[int]):
    TITLE = "metralectl"
    CSS_PATH = FIRST_FRAME_CSS  # the other views' and the dialogs' styles come with them (first_frame.py)
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (40, "-tall")]
    # 1-4 stay out of the footer: the tabs already say "1 Serving" ... "4 Doctor"; ctrl+t too (the palette has
    # it). The footer lists the focused view's keys first and would otherwise push `q Quit` off 80 columns.
    BINDINGS = [
        Binding("1", "show_view('serving')", "Serving", show=False),
        Binding("2", "show_view('library')", "Library", show=False),
        Binding("3", "show_view('bench')", "Bench", show=False),
        Binding("4", "show_view('doctor')", "Doctor", show=False),
        Binding("ctrl+t", "toggle_theme", "Theme", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, services: Services, *, theme: str = "textual-dark", status_every_s: float = 2.0) -> None:
        super().__init__()
        self.services = services
        self.theme = theme
        self._status_every_s = status_every_s
        self.outcomes: list[Outcome] = []  # every finished action, newest last (tests read it)

    def on_load(self) -> None:
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="metralectl-tui"))

    def get_default_screen(self) -> MainScreen:
        # Textual sets the breakpoint classes on the first Resize, which comes after the first frame: that
        # frame had the layout of no breakpoint (4 short charts a row at 80 columns) and everything was
        # styled and laid out again for the next. Given now, from the size the first frame is laid out at.
        return MainScreen(status_every_s=self._status_every_s, classes=" ".join(self.breakpoint_classes()))

    def breakpoint_classes(self) -> list[str]:
        """The classes a Textual Screen gives itself on each Resize for the app's breakpoints at the terminal's
        size: per dimension, the one with the highest threshold the size reaches."""
        found = []
        for size, breakpoints in ((self.size.width, self.HORIZONTAL_BREAKPOINTS),
                                  (self.size.height, self.VERTICAL_BREAKPOINTS)):
            reached = [(at, name) for at, name in breakpoints or () if size >= at]
            if reached:
                found.append(max(reached)[1])
        return found

    # -- views ----------------------------------------------------------------------------------
    @property
    def main(self) -> MainScreen:
        """The screen holding the views (queries on `self` would search a dialog on top instead)."""
        screen = self.screen_stack[0]
        assert isinstance(screen, MainScreen)
        return screen

    def action_show_view(self, view: str) -> None:
        self.main.show(view)

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for view, title in VIEWS:
            yield SystemCommand(f"View: {title}", f"show the {title} view", partial(self.action_show_view, view))
        yield SystemCommand("Theme: toggle light/dark", "switch between the light and dark theme", self.action_toggle_theme)
        yield SystemCommand("Stop the served model", "stop what metralectl serves (with confirmation)",
                            partial(self.request_action, "stop", None))
        yield SystemCommand("Doctor: re-run checks", "run every doctor check again", self._rerun_doctor)
        yield SystemCommand("Library: reload", "read the catalog, the HF cache and Docker again",
                            lambda: self._library().reload())
        views = self.main.query("#library-view")  # empty until mounted, just after the first paint
        library = self._library().snapshot if views else None
        for item in library.items if library else ():
            name = item.row.name
            # the palette reads its entries as markup: a recipe's fields are a user's or a synced set's text
            shown, about = markup(name), markup(f"{item.row.model} {item.row.quant} on {item.row.hardware}")
            verbs: tuple[tuple[Action, str], ...] = (("run", "Run"), ("swap", "Swap to"), ("pull", "Pull"))
            for action, verb in verbs:
                yield SystemCommand(f"{verb} {shown}", about, partial(self.request_action, action, name))

    def _library(self) -> LibraryView:
        from metralectl.tui.views.library import LibraryView

        return self.main.query_one("#library-view", LibraryView)

    def _rerun_doctor(self) -> None:
        from metralectl.tui.views.doctor import DoctorView

        self.action_show_view("doctor")
        self.main.query_one("#doctor-view", DoctorView).action_rerun()

    # -- actions: plan → confirm → progress ----------------------------------------------------
    def on_library_view_action_requested(self, message: LibraryView.ActionRequested) -> None:
        self.request_action(message.action, message.recipe)

    def on_serving_view_stop_requested(self, message: ServingView.StopRequested) -> None:
        self.request_action("stop", message.recipe)

    def request_action(self, action: Action, recipe: str | None) -> None:
        self.make_plan(action, recipe)

    @work(thread=True, exclusive=True, group="plan", exit_on_error=False)
    def make_plan(self, action: Action, recipe: str | None) -> None:
        try:
            self.post_message(PlanReady(self.services.plan(action, recipe)))
        except Exception as exc:  # noqa: BLE001
            self.post_message(WorkerFailed(f"{action} {recipe or ''}".strip(), exc))

    def on_plan_ready(self, message: PlanReady) -> None:
        from metralectl.tui.screens.confirm import ConfirmScreen
        from metralectl.tui.screens.progress import ProgressScreen

        plan = message.plan

        def confirmed(ok: bool | None) -> None:
            if ok:
                self.push_screen(ProgressScreen(self.services, plan), self._finished)

        self.push_screen(ConfirmScreen(plan), confirmed)

    def _finished(self, outcome: Outcome | None) -> None:
        if outcome is None:
            return
        self.outcomes.append(outcome)
        severity = {"done": "information", "failed": "error", "cancelled": "warning"}[outcome.status]
        self.notify(outcome.summary, title=f"{outcome.action} {outcome.status}", severity=severity)  # type: ignore[arg-type]
        if outcome.action in ("run", "swap") and outcome.status == "done":
            # Drop the Library's focus first: TabbedContent shows whichever pane holds the focus, and the
            # main screen would hand it back to the recipe table when the dialog goes.
            self.main.set_focus(None)
            self.action_show_view("serving")  # MainScreen.on_screen_resume focuses the log

    def on_served_changed(self, _: ServedChanged) -> None:
        if self.main.query("#library-view"):  # none before it is mounted: it loads on mount then
            self._library().reload()
        self.main.query_one("#serving-view", ServingView).action_refresh_status()

    # -- errors ---------------------------------------------------------------------------------
    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Every notification (widgets' too: Widget.notify calls this) as plain text, never markup: most
        quote an error, and an error quotes a server, a label or a file (`markup` is ignored)."""
        super().notify(printable(message), title=clean(title), severity=severity, timeout=timeout, markup=False)

    def on_worker_failed(self, message: WorkerFailed) -> None:
        err = message.error
        if isinstance(err, MetralError):
            text = err.message + (f"\n→ {err.hint}" if err.hint else "")
        else:
            text = f"internal error: {type(err).__name__}: {err}"
        self.notify(text, title=message.where, severity="error", timeout=12)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:  # a worker that did not catch
            self.post_message(WorkerFailed(event.worker.name or "worker", event.worker.error))

    # -- quitting -------------------------------------------------------------------------------
    async def action_quit(self) -> None:
        from metralectl.tui.screens.progress import ProgressScreen

        running = [s for s in self.screen_stack if isinstance(s, ProgressScreen) and s.outcome is None]
        for screen in running:
            if screen.plan.cancellable:
                screen.cancel()  # the core cleans up (removes a half-started container) before we exit
        if running:
            self.notify("cancelling the running action, then quitting…", severity="warning")
        self.exit(0)
