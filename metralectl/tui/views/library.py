"""Library: the recipes as a filterable table, the chosen one's detail, and the actions on it."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Label

from metralectl.app.library_words import fit_cell, fit_words
from metralectl.tui import library_filter
from metralectl.tui.outside import line
from metralectl.tui.messages import DetailLoaded, LibraryLoaded, WorkerFailed
from metralectl.tui.services import Action, LibraryItem, LibrarySnapshot
from metralectl.tui.views import services_of
from metralectl.tui.widgets.recipe_table import RecipeTable
from metralectl.tui.widgets.text_pane import TextPane

FILTER_HELP = "filter: words · fits cached image mtp serving · hw:gb10 quant:fp8 engine:x tag:x · !word"


class LibraryView(Vertical):
    BINDINGS = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("p", "act('pull')", "Pull"),
        Binding("r", "act('run')", "Run"),
        Binding("w", "act('swap')", "Swap"),
        Binding("x", "act('stop')", "Stop"),
        Binding("ctrl+r", "reload", "Reload"),
    ]

    class ActionRequested(Message):
        def __init__(self, action: Action, recipe: str | None) -> None:
            super().__init__()
            self.action = action
            self.recipe = recipe

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.snapshot: LibrarySnapshot | None = None
        self.chosen: str | None = None
        self._details: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Input(placeholder=FILTER_HELP, id="library-filter", compact=True)
        with Horizontal(id="library-body"):
            yield RecipeTable(id="recipes")
            yield TextPane("loading the catalog…", wrap=False, id="recipe-detail")
        why = Label("", id="library-why")  # the chosen recipe: why FITS is not yes, why r/w are disabled
        why.display = False
        yield why
        yield Label("", id="library-note")

    def on_mount(self) -> None:
        self.reload()

    def focus_main(self) -> None:
        self.query_one(RecipeTable).focus()

    # -- workers --------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="library", exit_on_error=False)
    def reload(self) -> None:
        try:
            self.post_message(LibraryLoaded(services_of(self).library()))
        except Exception as exc:  # noqa: BLE001 - becomes a notification
            self.post_message(WorkerFailed("library", exc))

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False)
    def load_detail(self, name: str) -> None:
        try:
            self.post_message(DetailLoaded(name, services_of(self).detail(name)))
        except Exception as exc:  # noqa: BLE001
            self.post_message(WorkerFailed(f"show {name}", exc))

    # -- results --------------------------------------------------------------------------------
    def on_library_loaded(self, message: LibraryLoaded) -> None:
        message.stop()
        self.snapshot = message.snapshot
        self._details.clear()
        self._refilter()
        note = line(message.snapshot.judged_on, style="dim")  # a GPU's name as NVML gives it
        for extra in message.snapshot.notes:  # a user's file name, the daemon's error
            note.append_text(line(f"  ! {extra}", style="yellow"))
        self.query_one("#library-note", Label).update(note)

    def _refilter(self) -> None:
        if self.snapshot is None:
            return
        query = self.query_one("#library-filter", Input).value
        items = library_filter.apply(self.snapshot.items, query)
        self.query_one(RecipeTable).set_items(items, keep=self.chosen)
        if not items:
            self.query_one(TextPane).show(f"no recipe matches {query!r}")
        self._show_why()

    # -- why not ------------------------------------------------------------------------------------
    def _item_named(self, name: str | None) -> LibraryItem | None:
        if self.snapshot is None or name is None:
            return None
        return next((i for i in self.snapshot.items if i.row.name == name), None)

    def _show_why(self) -> None:
        """Under the table, for the chosen recipe: FITS's reason (app/library_words: `list`'s footnote, the
        page's Fits cell) and, when r and w are disabled, why (the launch's words, as the page says them)."""
        item = self._item_named(self.query_one(RecipeTable).chosen)
        text = Text()
        fit = fit_words(item.row.fits, item.row.fits_reason) if item is not None else None
        if fit is not None and item is not None:
            text.append_text(line(f"FITS {fit_cell(item.row.fits)}: {fit}", style="dim"))
        if item is not None and item.blocked:
            if text:
                text.append("\n")
            text.append_text(line(f"✘ run, swap: {item.blocked}", style="red"))
            if item.blocked_hint:
                text.append_text(line(f" → {item.blocked_hint}", style="yellow"))
        why = self.query_one("#library-why", Label)
        why.update(text)
        why.display = bool(text)  # no empty row when there is nothing to say (80×24 has none to spare)
        self.refresh_bindings()  # r and w follow the chosen recipe

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """r and w shown disabled (and doing nothing) for a recipe that cannot run here whatever serves."""
        if action == "act" and parameters and parameters[0] in ("run", "swap"):
            item = self._item_named(self.query_one(RecipeTable).chosen) if self.is_mounted else None
            if item is not None and item.blocked:
                return None
        return True

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "library-filter":
            event.stop()
            self._refilter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "library-filter":
            event.stop()
            self.focus_main()

    def on_recipe_table_chosen(self, message: RecipeTable.Chosen) -> None:
        message.stop()
        if message.name == self.chosen and message.name in self._details:
            return
        self.chosen = message.name
        self._show_why()
        if message.name in self._details:
            self.query_one(TextPane).show(self._details[message.name])
        else:
            self.load_detail(message.name)

    def on_detail_loaded(self, message: DetailLoaded) -> None:
        message.stop()
        self._details[message.name] = message.text
        if message.name == self.chosen:
            self.query_one(TextPane).show(message.text)

    # -- keys -----------------------------------------------------------------------------------
    def action_focus_filter(self) -> None:
        self.query_one("#library-filter", Input).focus()

    def action_act(self, action: Action) -> None:
        name = self.query_one(RecipeTable).chosen
        if name is None and action != "stop":
            self.notify("no recipe selected", severity="warning")
            return
        self.post_message(self.ActionRequested(action, name))

