"""The screen under every dialog: the four views in tabs and the footer of bindings.

Only Serving (the first tab) is composed before the first paint; the hidden views are mounted right
after it (textual.lazy.Lazy): their widgets — the bench form above all — would otherwise cost the
first paint most of its time (benchmarks/tui.py)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.lazy import Lazy
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, TabbedContent, TabPane

from metralectl.tui.views.bench import BenchView
from metralectl.tui.views.doctor import DoctorView
from metralectl.tui.views.library import LibraryView
from metralectl.tui.views.serving import ServingView

VIEWS = (("serving", "Serving"), ("library", "Library"), ("bench", "Benchmarks"), ("doctor", "Doctor"))


class MainScreen(Screen[None]):
    def __init__(self, *, status_every_s: float = 2.0) -> None:
        super().__init__(id="main")
        self._status_every_s = status_every_s

    def compose(self) -> ComposeResult:
        with TabbedContent(id="views"):  # the first pane (Serving) is the one shown first
            with TabPane("1 Serving", id="serving"):
                yield ServingView(id="serving-view", status_every_s=self._status_every_s)
            with TabPane("2 Library", id="library"):
                yield Lazy(LibraryView(id="library-view"))
            with TabPane("3 Benchmarks", id="bench"):
                yield Lazy(BenchView(id="bench-view"))
            with TabPane("4 Doctor", id="doctor"):
                yield Lazy(DoctorView(id="doctor-view"))
        yield Footer()

    @property
    def active(self) -> str:
        return self.query_one(TabbedContent).active

    def show(self, view: str) -> None:
        self.query_one(TabbedContent).active = view

    def focus_active(self) -> None:
        """Focus the active view's main widget (unless focus is already inside that view)."""
        if self.app.screen is not self:
            return  # a dialog is on top; on_screen_resume comes back here
        widget = self.active_view()
        if widget is None:
            return  # mounted right after the first paint (Lazy): not yet
        if self.focused is not None and widget in self.focused.ancestors_with_self:
            return
        focus = getattr(widget, "focus_main", None)
        if focus is not None:
            focus()

    def on_mount(self) -> None:
        self.call_after_refresh(self.focus_active)

    def on_screen_resume(self) -> None:
        # directly: call_after_refresh would be queued on whichever screen is current, maybe the
        # dialog being dismissed, and then never run
        self.focus_active()

    def active_view(self) -> Widget | None:
        try:
            return self.query_one(f"#{self.active}-view")
        except NoMatches:
            return None

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        focus = getattr(self.active_view(), "focus_main", None)
        if focus is not None and self.app.screen is self:
            focus()
