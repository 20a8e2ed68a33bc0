"""Serving (the main view): what runs, live charts, the engine's log, the last swap's downtime.

Three long-lived thread workers feed it: the status poll (every 2 s), the telemetry feed (TopViews,
coalesced) and the log follower (lines, coalesced); each stops on its own Event when the view goes.

While another tab is shown (`set_shown(False)`, from MainScreen) the poll's timer is paused and the
telemetry feed is closed (its GPU sampler, engine poller and their threads end); shown again, the status
is fetched at once, the timer restarts and a new feed starts. The log follower alone keeps reading while
hidden (see `on_lines_ready`); its lines wait unpainted and are drawn in one batch on return.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.message import Message
from textual.widgets import Label, Static

from metralectl.tui.coalesce import Coalescer, Throttle
from metralectl.tui.outside import line
from metralectl.tui.messages import LinesReady, StatusLoaded, TelemetryReady, WorkerFailed
from metralectl.tui.telemetry_history import CHARTS, TelemetryHistory
from metralectl.tui.views import services_of
from metralectl.tui.widgets.chart import Chart
from metralectl.tui.widgets.log_tail import LogTail
from metralectl.tui.widgets.served_engines import ServedEngines
from metralectl.tui.widgets.serving_card import ServingCard
from metralectl.wording import count

if TYPE_CHECKING:
    from textual.timer import Timer

    from metralectl.lifecycle.status import StatusReport
    from metralectl.telemetry.view import TopView

STATUS_EVERY_S = 2.0
LOG_FRAME_S = 0.05  # log repaints at most 20 times a second, whatever the line rate


class ServingView(Vertical):
    BINDINGS = [
        Binding("f", "toggle_follow", "Follow log"),
        Binding("ctrl+l", "clear_log", "Clear log"),
        Binding("x", "stop", "Stop model"),
        Binding("ctrl+r", "refresh_status", "Refresh"),
    ]

    class StopRequested(Message):
        def __init__(self, recipe: str | None) -> None:
            super().__init__()
            self.recipe = recipe

    def __init__(self, *, id: str | None = None, status_every_s: float = STATUS_EVERY_S) -> None:
        super().__init__(id=id)
        self.status_every_s = status_every_s
        self.report: StatusReport | None = None
        self.history = TelemetryHistory()
        self.following: str | None = None
        self._log_stop: threading.Event | None = None
        self._telemetry_stop = threading.Event()
        self.shown = True  # Serving is the first tab; MainScreen says when it is hidden or shown
        self._feeds_started = False
        self._status_timer: Timer | None = None
        self.telemetry: Coalescer[TopView] = Coalescer(lambda: self.post_message(TelemetryReady()), maxlen=120)
        self.lines: Coalescer[str] = Coalescer(lambda: self.post_message(LinesReady()), maxlen=20000)
        self._status_failed = False
        self._notes = Text()
        self._log_throttle = Throttle(self, LOG_FRAME_S, self._drain_lines)

    def compose(self) -> ComposeResult:
        yield ServingCard(id="serving-card")
        yield ServedEngines(id="served-engines")  # every engine's numbers and the gateways (telemetry)
        with Grid(id="charts"):
            for key, title in CHARTS:
                yield Chart(title, id=f"chart-{key}", classes="chart")
            yield Static("", id="telemetry-note", classes="chart")
        with Horizontal(id="log-bar"):
            yield Label("engine log", id="log-title")
            yield Label("", id="log-rate")
        yield LogTail(id="serving-log")

    def on_mount(self) -> None:
        # after the first paint: the feeds' threads import Docker/NVML/httpx and would hold the GIL the
        # paint needs (benchmarks/tui.py)
        self.call_after_refresh(self._start_feeds)

    def _start_feeds(self) -> None:
        self._feeds_started = True
        self._status_timer = self.set_interval(self.status_every_s, self.action_refresh_status,
                                               pause=not self.shown)
        if self.shown:
            self.action_refresh_status()
            self._start_telemetry()

    def on_unmount(self) -> None:
        self._telemetry_stop.set()
        if self._log_stop is not None:
            self._log_stop.set()

    # -- shown / hidden -------------------------------------------------------------------------
    def set_shown(self, shown: bool) -> None:
        """MainScreen, on every tab change: hidden, nothing here polls or repaints; shown, it catches up."""
        if shown == self.shown:
            return
        self.shown = shown
        if not self._feeds_started:
            return  # _start_feeds honours `shown` when it runs
        assert self._status_timer is not None
        if not shown:
            self._status_timer.pause()
            self._telemetry_stop.set()  # the watcher wakes, closes the feed and ends
            return
        self.action_refresh_status()  # at once: the card must not show what was true minutes ago
        self._status_timer.reset()  # resumes it; the next poll one interval from now, not a burst
        self.history.gap()
        self._start_telemetry()
        self._log_throttle.request()  # draw the lines that arrived while hidden

    def _start_telemetry(self) -> None:
        self._telemetry_stop = threading.Event()  # one per feed: a closing feed keeps its own
        self.watch_telemetry(self._telemetry_stop)

    def focus_main(self) -> None:
        self.query_one(LogTail).focus()

    # -- status ---------------------------------------------------------------------------------
    def action_refresh_status(self) -> None:
        self.poll_status()

    @work(thread=True, exclusive=True, group="status", exit_on_error=False)
    def poll_status(self) -> None:
        try:
            report = services_of(self).status()
        except Exception as exc:  # noqa: BLE001
            if not self._status_failed:  # say it once, not every 2 s
                self._status_failed = True
                self.post_message(WorkerFailed("serving status", exc))
            why = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            self.app.call_from_thread(self.query_one(ServingCard).show_unreachable, why)
            return
        self._status_failed = False
        self.post_message(StatusLoaded(report))

    def on_status_loaded(self, message: StatusLoaded) -> None:
        message.stop()
        self.report = message.report
        self.query_one(ServingCard).show(message.report)
        running = [s for s in message.report.serving if s.state.startswith("running")]
        target = running[0].name if running else None
        if target != self.following:
            self._follow(target)

    # -- log ------------------------------------------------------------------------------------
    def _follow(self, container: str | None) -> None:
        if self._log_stop is not None:
            self._log_stop.set()
        self.following = container
        title = self.query_one("#log-title", Label)
        if container is None:
            self._log_stop = None
            title.update(Text("engine log — nothing served", style="dim"))
            return
        self._log_stop = threading.Event()
        self.query_one(LogTail).write_line(f"── following {container} ──")
        self._update_log_title()
        self.follow_logs(container, self._log_stop)

    def _update_log_title(self) -> None:
        if self.following is None:
            return
        state = "following" if self.query_one(LogTail).following else "paused (f resumes)"
        self.query_one("#log-title", Label).update(line(f"engine log — {self.following} — {state}"))

    @work(thread=True, group="logs", exit_on_error=False)
    def follow_logs(self, container: str, stop: threading.Event) -> None:
        try:
            for line in services_of(self).follow_logs(container, stop):
                if stop.is_set():
                    break
                self.lines.push(line)
        except Exception as exc:  # noqa: BLE001
            if not stop.is_set():
                self.post_message(WorkerFailed(f"logs of {container}", exc))

    def on_lines_ready(self, message: LinesReady) -> None:
        """Drains at most LOG_FRAME_S apart: one write and one repaint, however many lines came. Until
        then the Coalescer stays pending, so the producer posts nothing more.

        Hidden, nothing is drained (set_shown drains on return): the Coalescer stays pending, so the
        follower only appends to its buffer (newest 20,000 kept, the rest counted). The follower itself
        keeps reading while hidden: restarting `docker logs --follow` on return would lose the lines
        written meanwhile or repeat them (its `since` has one-second steps), and the engine's log is what
        an operator comes back to read (a crash's trace); a blocked read costs nothing when the engine is
        quiet."""
        message.stop()
        if self.shown:
            self._log_throttle.request()

    def _drain_lines(self) -> None:
        if not self.shown:
            return  # a drain scheduled just before the tab was hidden: set_shown asks again on return
        batch = self.lines.drain()
        if not batch:
            return
        self.query_one(LogTail).append(batch)
        if self.lines.dropped:
            self.query_one("#log-rate", Label).update(f"{count(self.lines.dropped, 'line')} skipped to keep up")

    def action_toggle_follow(self) -> None:
        self.query_one(LogTail).toggle_follow()
        self._update_log_title()

    def action_clear_log(self) -> None:
        self.query_one(LogTail).clear()

    def action_stop(self) -> None:
        running = [s for s in (self.report.serving if self.report else []) if s.state.startswith("running")]
        # several served side by side: no guess; the plan asks for the recipe (chosen in the Library)
        self.post_message(self.StopRequested(running[0].recipe if len(running) == 1 else None))

    # -- telemetry ------------------------------------------------------------------------------
    @work(thread=True, group="telemetry", exit_on_error=False)
    def watch_telemetry(self, stop: threading.Event) -> None:
        """Until `stop`: set when the view goes or is hidden. Nothing here must outlive a hidden tab: the
        dashboard records nothing (`metralectl top --record` does), so a closed feed leaves only a gap
        in the charts, marked there (TelemetryHistory.gap)."""
        try:
            feed = services_of(self).telemetry()
            feed.start()
        except Exception as exc:  # noqa: BLE001
            self.post_message(WorkerFailed("telemetry", exc))
            return
        try:
            while not stop.is_set():
                self.telemetry.push(feed.view())
                stop.wait(feed.interval_s)
        except Exception as exc:  # noqa: BLE001
            self.post_message(WorkerFailed("telemetry", exc))
        finally:
            feed.close()

    def on_telemetry_ready(self, message: TelemetryReady) -> None:
        message.stop()
        views = self.telemetry.drain()
        for view in views:
            self.history.add(view)
        if views:
            self._draw_charts()

    def _draw_charts(self) -> None:
        for key, _ in CHARTS:
            s = self.history.chart(key)
            self.query_one(f"#chart-{key}", Chart).set_data(s.values, s.current, lines=s.lines, y_max=s.y_max,
                                                             note=s.note)
        view = self.history.latest
        if view is None:
            return
        self.query_one(ServedEngines).show(view)
        notes = Text()
        from metralectl.core.gpudata import GpuUnavailable

        # NVML's names and reasons, labels' URLs and engines' errors: one escaped line each (tui/outside.py)
        if isinstance(view.gpu, GpuUnavailable):
            notes.append_text(line(f"no GPU: {view.gpu.reason}", style="yellow")).append("\n")
        elif view.gpus:
            names = {g.name for g in view.gpus if g.name}
            notes.append_text(line(f"{len(view.gpus)}× {', '.join(sorted(names)) or 'GPU'}", style="bold"))
            notes.append("\n")
            notes.append(f"thermal {view.thermal}\n", style="red" if view.thermal == "parked" else "green")
        if view.engine_note:
            notes.append_text(line(view.engine_note, style="dim")).append("\n")
        for e in view.engines:
            if e.error:
                notes.append_text(line(f"{e.target.url}: {e.error}", style="yellow")).append("\n")
        if notes != self._notes:  # the same words every second when idle: no layout, no repaint
            self._notes = notes
            self.query_one("#telemetry-note", Static).update(notes)
