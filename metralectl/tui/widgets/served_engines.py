"""Every served engine (a row each: recipe, engine, model, port, tok/s, in flight, TTFT) and this box's gateways
(address, state, what they route and load, queue, loads, evictions, requests and errors), from the same TopView
`metralectl top` renders. A gateway whose process is gone is said to be gone, with no number."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from metralectl.tui.outside import line

if TYPE_CHECKING:
    from metralectl.telemetry.engine_view import EngineRow
    from metralectl.telemetry.gateway_view import GatewayRow
    from metralectl.telemetry.view import TopView

COLUMNS = ("RECIPE", "ENGINE", "MODEL", "PORT", "TOK/S", "ACTIVE", "TTFT p50")


def _num(value: float | None, digits: int = 0) -> str:
    return "?" if value is None else f"{value:.{digits}f}"


def engine_cells(e: EngineRow) -> list[Text]:
    s = e.snapshot
    ttft = "?" if e.ttft_p50_s is None else f"{e.ttft_p50_s * 1000:.0f} ms"
    recipe = line(e.target.recipe or e.target.name or e.target.url, style="bold")
    if e.state != "ok":
        recipe.append_text(line(f" ({e.state})", style="yellow"))
    return [recipe, line(e.engine or "?"), line(e.model or "?"),
            line(e.target.port if e.target.port is not None else "?"), line(_num(e.tokens_per_s, 1)),
            line(_num(s.requests_active if s else None)), line(ttft)]


def gateway_words(g: GatewayRow) -> Text:
    head = line(f"gateway {g.url} (pid {g.pid}) ", style="bold")
    if g.state == "gone":
        return head.append_text(line("gone: its process is not running (its record is stale)", style="dim"))
    if not g.serving:
        return head.append_text(line(f"{g.state}: {g.error or ''}", style="yellow"))
    loads = g.loads or {}
    words = [f"routes {', '.join(g.names('routed')) or 'nothing'}"]
    if g.names("loading"):
        words.append(f"loading {', '.join(g.names('loading'))}")
    words += [f"queue {g.total('queue_depth')}", f"loads {loads.get('loaded', 0)}"
              + "".join(f" ({loads[k]} {k})" for k in ("failed", "refused") if loads.get(k)),
              f"evictions {g.total('evictions')}", f"requests {g.total('requests')}", f"errors {g.total('errors')}"]
    return head.append_text(line("serving", style="bold green")).append_text(line(": " + "; ".join(words)))


class ServedEngines(Static):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self._shown: tuple[object, ...] | None = None

    def show(self, view: TopView) -> None:
        key = (tuple((e.target, e.state, e.model, _num(e.tokens_per_s, 1), e.ttft_p50_s,
                      e.snapshot.requests_active if e.snapshot else None) for e in view.engines), view.gateways)
        if key == self._shown:
            return  # the same numbers as a second ago: no layout, no repaint
        self._shown = key
        parts: list[Table | Text] = []
        if view.engines:
            table = Table.grid(padding=(0, 2))
            for name in COLUMNS:
                table.add_column(name, no_wrap=True, overflow="ellipsis")
            table.add_row(*(Text(h, style="bold") for h in COLUMNS))
            for e in view.engines:
                table.add_row(*engine_cells(e))
            parts.append(table)
        parts += [gateway_words(g) for g in view.gateways]
        self.update(Group(*parts))
        self.display = bool(parts)
