"""Doctor: every check's verdict, detail and remedy; re-run with ctrl+r (checks run at once, ≤ ~3 s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Label

from metralectl.tui.outside import prose
from metralectl.tui.messages import DoctorDone, WorkerFailed
from metralectl.tui.views import services_of
from metralectl.tui.widgets.check_table import CheckTable
from metralectl.tui.widgets.text_pane import TextPane
from metralectl.tui.alarm import alarm
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.doctor.model import CheckResult


def summary(results: list[CheckResult], elapsed_s: float) -> Text:
    n = {s: sum(1 for r in results if r.status == s) for s in ("problem", "warn", "ok", "skipped")}
    text = Text()
    text.append(count(n['problem'], 'problem'), style=alarm() if n["problem"] else "")
    text.append(", ")
    text.append(count(n['warn'], 'warning'), style="yellow" if n["warn"] else "")
    text.append(f", {n['ok']} ok, {n['skipped']} skipped in {elapsed_s:.2f} s — ")
    text.append("problems found" if n["problem"] else "no problems", style=alarm() if n["problem"] else "bold green")
    return text


class DoctorView(Vertical):
    BINDINGS = [Binding("ctrl+r", "rerun", "Re-run checks")]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.results: list[CheckResult] = []
        self.running = False
        self.started = False

    def compose(self) -> ComposeResult:
        yield Label("checks not run yet", id="doctor-summary")
        with Horizontal(id="doctor-body"):
            yield CheckTable(id="checks")
            yield TextPane("", id="check-detail")

    def focus_main(self) -> None:
        self.query_one(CheckTable).focus()
        if not self.started:
            self.action_rerun()

    def action_rerun(self) -> None:
        if self.running:
            return
        self.started = self.running = True
        self.query_one("#doctor-summary", Label).update(Text("running the checks…", style="dim"))
        self.run_checks()

    @work(thread=True, exclusive=True, group="doctor", exit_on_error=False)
    def run_checks(self) -> None:
        services = services_of(self)
        started = services.now()  # the services' clock: fixed in snapshot tests
        try:
            results = services.doctor()
        except Exception as exc:  # noqa: BLE001
            self.post_message(WorkerFailed("doctor", exc))
            self.post_message(DoctorDone([], services.now() - started))
            return
        self.post_message(DoctorDone(results, services.now() - started))

    def on_doctor_done(self, message: DoctorDone) -> None:
        message.stop()
        self.running = False
        self.results = message.results
        self.query_one("#doctor-summary", Label).update(summary(message.results, message.elapsed_s))
        self.query_one(CheckTable).set_results(message.results)

    def on_check_table_chosen(self, message: CheckTable.Chosen) -> None:
        message.stop()
        result = next((r for r in self.results if r.id == message.check_id), None)
        if result is None:
            return
        # a finding quotes processes, GPU names, Docker's answers: escaped before Rich's Text sees it (which
        # would drop a BEL or a CR silently and keep ESC), never markup (tui/outside.py)
        text = prose(f"{result.title}\n", style="bold")
        text.append_text(prose(f"status  {result.status}\n\n"))
        text.append_text(prose(result.detail + "\n"))
        if result.remedy:
            text.append("\nremedy\n", style="bold")
            text.append_text(prose(result.remedy + "\n", style="green"))
        self.query_one("#check-detail", TextPane).show(text)
