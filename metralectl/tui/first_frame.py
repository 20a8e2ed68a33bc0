"""What waits for the dashboard's first frame (profiled against the bare Textual app: docs/tui.md, Cost).

- Python's cyclic garbage collector. Start-up builds ~60,000 objects that all live on (modules, classes,
  widgets, styles); the collector's passes over them before the first frame found ~2,700 of garbage and
  cost ~30 ms, an eighth of the first paint and twice what the bare app pays. `tui.run()` pauses it
  before Textual is imported; the main screen resumes it right after the first frame.
- The styles of what the first frame does not show. App.CSS_PATH is app.tcss and serving.tcss only;
  views.tcss (Library, Benchmarks, Doctor) is read right before those views mount, and dialogs.tcss is
  the dialog screens' CSS_PATH, which Textual reads when the first one opens. Every rule parsed before
  the first frame is matched against every node styled for it, twice.

Nothing here imports Textual: `tui.run()` imports this module before it.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import PurePath

    from textual.app import App

STYLES = Path(__file__).parent / "styles"  # absolute: subclasses elsewhere (tests, benchmarks) find it too
FIRST_FRAME_CSS: list[str | PurePath] = [STYLES / "app.tcss", STYLES / "serving.tcss"]  # App.CSS_PATH
VIEWS_CSS = STYLES / "views.tcss"
DIALOGS_CSS = STYLES / "dialogs.tcss"

_paused = False


def pause_gc() -> None:
    """Pause the collector until `resume_gc()`, unless something else already has (then leave it be)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_gc() -> None:
    """Undo `pause_gc()`; nothing if it did not pause the collector (tests, a second call)."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()


def add_views_css(app: App[Any]) -> None:
    """Add views.tcss to the app's stylesheet (once), before the views it styles are mounted: they are
    styled as they mount, and it matches nothing mounted before (the file says so)."""
    where = str(VIEWS_CSS)
    if not app.stylesheet.has_source(where):
        app.stylesheet.add_source(VIEWS_CSS.read_text(encoding="utf-8"), read_from=(where, ""))
