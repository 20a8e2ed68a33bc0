"""An action (pull, run, swap, stop) running: its steps, boot phases, a byte/layer bar and the engine
log, live; cancel (c) stops it the way Ctrl-C stops the CLI (a half-started container is removed).

The core call runs in a thread worker; core events come back as ActionEvent messages, log lines
through a Coalescer (one message per burst), and the end as ActionFinished. Cancel is Textual's own
worker.cancel() plus the token of the core call the worker runs (metralectl/cancel.py): the core stops at
its next event or phase boundary and cleans up, and the worker's thread then reports the outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.worker import Worker
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, ProgressBar, Static

from metralectl.errors import MetralError
from metralectl.cancel import Cancelled, CancelToken
from metralectl.tui.coalesce import Coalescer, Throttle
from metralectl.tui.first_frame import DIALOGS_CSS
from metralectl.tui.messages import ActionEvent, ActionFinished, LinesReady, ServedChanged
from metralectl.tui.outside import line, log, prose
from metralectl.tui.progress_model import ProgressModel
from metralectl.tui.services import Outcome, Plan
from metralectl.tui.widgets.log_tail import LogTail
from metralectl.tui.alarm import alarm, caution

if TYPE_CHECKING:
    from metralectl.tui.services import Services

VERBS = {"pull": "Pulling", "run": "Starting", "swap": "Swapping to", "stop": "Stopping"}


class ProgressScreen(ModalScreen[Outcome]):
    CSS_PATH = DIALOGS_CSS  # read when the first dialog opens, not before the first frame
    BINDINGS = [
        Binding("c,escape", "cancel_or_close", "Cancel / close"),
        Binding("enter", "close", "Close", show=False),
    ]

    def __init__(self, services: Services, plan: Plan) -> None:
        super().__init__(classes="dialog-screen")
        self.services = services
        self.plan = plan
        self.model = ProgressModel()
        self.token = CancelToken()
        self.worker: Worker[None] | None = None
        self.outcome: Outcome | None = None
        self.lines: Coalescer[str] = Coalescer(lambda: self.post_message(LinesReady()), maxlen=2000)
        self._log_throttle = Throttle(self, 0.05, self._drain_lines)

    def compose(self) -> ComposeResult:
        with Vertical(id="progress-dialog", classes="dialog dialog--wide"):
            yield Label(line(f"{VERBS[self.plan.action]} {self.plan.recipe or 'the served model'}"),
                        classes="dialog--title")
            yield Static("", id="progress-steps")
            with Horizontal(id="progress-bar-row"):
                yield ProgressBar(id="progress-bar", show_eta=False)
                yield Label("", id="progress-bar-detail")
            yield LogTail(id="progress-log", max_lines=2000)
            yield Static("", id="progress-outcome")
            with Horizontal(classes="dialog--buttons"):
                yield Button("Cancel (c)", id="cancel", variant="error", disabled=not self.plan.cancellable, compact=True)
                yield Button("Close", id="close", variant="primary", classes="hidden", compact=True)

    def on_mount(self) -> None:
        self.query_one("#progress-bar-row").display = False
        self.worker = self.perform()

    # -- the worker -----------------------------------------------------------------------------
    def _on_event(self, event: Any) -> None:
        self.token.check()  # every core event is a cancellation point (and the core checks at its phase boundaries)
        if type(event).__name__ == "LogLine":
            self.lines.push(event.line)
        else:
            self.post_message(ActionEvent(event))

    @work(thread=True, exclusive=True, group="action", exit_on_error=False)
    def perform(self) -> None:
        plan = self.plan
        try:
            outcome = self.services.perform(plan.action, plan.recipe, self._on_event, self.token)
        except Cancelled:
            hint = None
            if plan.action == "swap":  # as after Ctrl-C in the CLI: the journal says what to restore
                hint = ("if the previous model was already stopped, the next run or swap restores it "
                        "(or `metralectl ps --repair` now); Serving shows the interrupted swap")
            outcome = Outcome(plan.action, plan.recipe, "cancelled",
                              f"{plan.action} cancelled; what it had started was cleaned up", hint)
        except MetralError as exc:
            outcome = Outcome(plan.action, plan.recipe, "failed", exc.message, exc.hint,
                              tuple(getattr(exc, "last_lines", ()) or ())[-15:])
        except Exception as exc:  # noqa: BLE001 - shown, never a crash of the dashboard
            outcome = Outcome(plan.action, plan.recipe, "failed", f"internal error: {type(exc).__name__}: {exc}",
                              "run the same action with the CLI and --debug for the traceback, and report it")
        self.post_message(ActionFinished(outcome))

    # -- messages from it -----------------------------------------------------------------------
    def on_action_event(self, message: ActionEvent) -> None:
        if self.model.apply(message.event):
            self._render_model()

    def on_lines_ready(self, _: LinesReady) -> None:
        self._log_throttle.request()

    def _drain_lines(self) -> None:
        self.query_one(LogTail).append(self.lines.drain())

    def on_action_finished(self, message: ActionFinished) -> None:
        self._drain_lines()
        self.outcome = outcome = message.outcome
        style = {"done": "bold green", "failed": alarm(), "cancelled": caution()}[outcome.status]
        # an outcome quotes the engine, the daemon, a Hub: never markup, controls escaped (tui/outside.py)
        text = prose(outcome.summary, style=style)
        if outcome.hint:
            text.append_text(prose(f"\n→ {outcome.hint}"))
        for last in outcome.lines:  # the engine's last log lines, or one line per stopped container
            text.append(f"\n  │ {log(last)}", style="dim")
        self.query_one("#progress-outcome", Static).update(text)
        self.query_one("#cancel", Button).display = False
        close = self.query_one("#close", Button)
        close.remove_class("hidden")
        close.focus()
        self.app.post_message(ServedChanged())

    def _render_model(self) -> None:
        self.query_one("#progress-steps", Static).update(  # a step quotes events: a boot phase's log line, a repo
            Text("\n").join(line(f"{step.mark} {step.text}") for step in self.model.lines[-12:]))
        bar = self.model.bar
        row = self.query_one("#progress-bar-row")
        row.display = bar is not None
        if bar is not None:
            self.query_one("#progress-bar", ProgressBar).update(total=bar.total, progress=bar.done)
            self.query_one("#progress-bar-detail", Label).update(line(f"{bar.label}: {bar.detail}"))

    # -- keys -----------------------------------------------------------------------------------
    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "cancel":
            self.action_cancel_or_close()
        else:
            self.action_close()

    def action_cancel_or_close(self) -> None:
        if self.outcome is not None:
            self.dismiss(self.outcome)
            return
        if not self.plan.cancellable:
            self.notify("a stop cannot be cancelled; it ends within its timeout", severity="warning")
            return
        if self.cancel():
            self.query_one("#progress-outcome", Static).update(
                Text("cancelling… (removing whatever was started)", style="bold yellow"))
            self.query_one("#cancel", Button).disabled = True

    def cancel(self) -> bool:
        """Cancel the running action (False: it was cancelled already): the worker, and the core call in it."""
        if self.token.cancelled:
            return False
        self.token.cancel("cancelled from the dashboard")
        if self.worker is not None:
            self.worker.cancel()
        return True

    def action_close(self) -> None:
        if self.outcome is not None:
            self.dismiss(self.outcome)
