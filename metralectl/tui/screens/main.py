"""The screen under every dialog: the four views in tabs and the footer of bindings.

Only Serving (the first tab) is composed before the first paint; the hidden views are imported and
mounted right after it: their modules, widgets and styles — the bench form above all — would
otherwise cost the first paint most of its time (benchmarks/tui.py). Until then their panes are empty
and queries for them find nothing."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import MountError, Widget
from textual.widgets import Footer, TabbedContent, TabPane

from metralectl.tui.first_frame import add_views_css, resume_gc
from metralectl.tui.views.serving import ServingView

VIEWS = (("serving", "Serving"), ("library", "Library"), ("bench", "Benchmarks"), ("doctor", "Doctor"))


class MainScreen(Screen[None]):
    def __init__(self, *, status_every_s: float = 2.0, classes: str | None = None) -> None:
        super().__init__(id="main", classes=classes)  # the breakpoint classes (MetralectlApp.get_default_screen)
        self._status_every_s = status_every_s

    def compose(self) -> ComposeResult:
        with TabbedContent(id="views"):  # the first pane (Serving) is the one shown first
            with TabPane("1 Serving", id="serving"):
                yield ServingView(id="serving-view", status_every_s=self._status_every_s)
            for number, (view, title) in enumerate(VIEWS[1:], start=2):
                yield TabPane(f"{number} {title}", id=view)  # filled after the first paint
        yield Footer(compact=True)

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
            return  # mounted right after the first paint: not yet
        if self.focused is not None and widget in self.focused.ancestors_with_self:
            return
        focus = getattr(widget, "focus_main", None)
        if focus is not None:
            focus()

    def on_mount(self) -> None:
        self.call_after_refresh(self._mount_hidden_views)
        self.call_after_refresh(self.focus_active)

    async def _mount_hidden_views(self) -> None:
        resume_gc()  # paused by tui.run() until the first frame, which is on screen now
        add_views_css(self.app)
        from metralectl.tui.views.bench import BenchView
        from metralectl.tui.views.doctor import DoctorView
        from metralectl.tui.views.library import LibraryView

        for view in (LibraryView(id="library-view"), BenchView(id="bench-view"), DoctorView(id="doctor-view")):
            pane_id = (view.id or "").removesuffix("-view")
            try:
                await self.query_one(f"#{pane_id}", TabPane).mount(view)
            except (MountError, NoMatches):  # quit as the first frame came: the panes are going, and so are we
                return
        self.focus_active()  # a key pressed before they were there switched to an empty pane

    def on_screen_resume(self) -> None:
        # directly: call_after_refresh would be queued on whichever screen is current, maybe the
        # dialog being dismissed, and then never run
        self.focus_active()

    def _tell_views_shown(self) -> None:
        """Every view with periodic work (`set_shown`: Serving) learns whether its tab is the one shown, so a
        hidden tab polls nothing. Library, Benchmarks and Doctor have none: they load when mounted or
        asked; a benchmark that runs keeps running hidden (its progress is the job's, not the view's)."""
        active = self.active
        for view, _ in VIEWS:
            for widget in self.query(f"#{view}-view"):
                set_shown = getattr(widget, "set_shown", None)
                if set_shown is not None:
                    set_shown(view == active)

    def active_view(self) -> Widget | None:
        try:
            return self.query_one(f"#{self.active}-view")
        except NoMatches:
            return None

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._tell_views_shown()
        focus = getattr(self.active_view(), "focus_main", None)
        if focus is not None and self.app.screen is self:
            focus()
