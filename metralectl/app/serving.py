"""Changing what is served, once: `run`, `swap`, `stop`, `ps`, `logs` for every front end.

The CLI, the dashboard and the agent each build a `Change` (app/serving_change.py: frozen, with
to_json()/from_json(), which is the agent's job body) and hand it, with an event listener, to a
`Serving`. `DirectServing` (app/serving_direct.py) does the whole sequence in this process;
`RoutedServing` (app/serving_routed.py) has the same methods and sends the change to the running agent
as its job, whose events come back as the same typed events. `serving_for()` is the one place that
decides which; `routable()` the one rule for what the agent takes.

Events are the lifecycle's (lifecycle/events.py); results are the lifecycle's values (`Launched`,
`LaunchedMulti`, `SwapResult`) and `Stopped`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from metralectl.app.serving_change import Change, MultiRank
from metralectl.app.serving_direct import (DirectServing, RankStopped, StopIncomplete, Stopped, result_json,
                                           select_stop)
from metralectl.app.serving_routed import RoutedServing, routable
from metralectl.lifecycle.events import Listener, ignore

if TYPE_CHECKING:
    import threading

    from metralectl.core.recipe import Recipe
    from metralectl.lifecycle.launch import Launched
    from metralectl.lifecycle.multinode import LaunchedMulti
    from metralectl.lifecycle.status import StatusReport
    from metralectl.lifecycle.swap import SwapResult
    from metralectl.app.serving_direct import ChangeResult

__all__ = ["Change", "MultiRank", "Serving", "DirectServing", "RoutedServing", "Stopped", "RankStopped",
           "StopIncomplete", "routable", "serving_for", "result_json", "select_stop"]


class Serving(Protocol):
    """What every front end may ask; direct and routed implement it alike."""

    def resolve(self, change: Change) -> Recipe:
        """The change's recipe with its --set overrides applied (refused here: an unknown name, a bad --set)."""

    def apply(self, change: Change, on_event: Listener) -> ChangeResult:
        """run, swap or stop, by the change's kind."""

    def run(self, change: Change, on_event: Listener) -> Launched | LaunchedMulti: ...

    def swap(self, change: Change, on_event: Listener) -> SwapResult: ...

    def stop(self, change: Change, on_event: Listener) -> Stopped: ...

    def ps(self, *, repair: bool = False, on_event: Listener = ignore) -> StatusReport: ...

    def logs(self, recipe: str | None = None, *, rank: int | None = None, follow: bool = False, tail: int = 200,
             container: str | None = None, stop: threading.Event | None = None) -> Iterator[str]: ...


# agent or direct: decided here, once (and what the agent takes: serving_routed.routable)
def serving_for(*, direct: bool = False, say: Callable[[str], None] | None = None,
                cancelled: Callable[[], bool] | None = None, **direct_options: Any) -> Serving:
    """The Serving a front end uses: the running agent's (routed) unless `direct`, METRALECTL_DIRECT=1, or no
    agent runs. `say`: a line for the operator ("via the agent ..."); `cancelled`: the dashboard's cancel
    (None: Ctrl-C, from the main thread). `direct_options`: DirectServing's (also the routed path's fallback)."""
    here = DirectServing(**direct_options)
    if direct:
        return here
    from metralectl.app.agent_client import running_agent

    agent = running_agent()
    if agent is None:
        return here
    return RoutedServing(agent, here, say=say, cancelled=cancelled)
