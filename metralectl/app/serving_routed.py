"""The same Serving, through the running agent: the change goes as its job (Change.to_json()), the job's
events come back as the lifecycle's typed events, its result as the lifecycle's values, its error as
the direct path would raise it (exit code included).

What the agent does not take (routable below) and an agent found gone at the start are done here by
the DirectServing this wraps; reads (`ps`, `logs`) are always direct. stdlib only on this path: neither
docker nor httpx is imported unless the work falls back to direct.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from metralectl.app.agent_client import rebuild
from metralectl.app.serving_direct import DirectServing, Stopped
from metralectl.app.serving_change import Change
from metralectl.errors import MetralError
from metralectl.lifecycle.events import Failed, Listener, ignore

if TYPE_CHECKING:
    import threading

    from metralectl.app.agent_client import AgentClient
    from metralectl.core.recipe import Recipe
    from metralectl.lifecycle.launch import Launched
    from metralectl.lifecycle.multinode import LaunchedMulti
    from metralectl.lifecycle.status import StatusReport
    from metralectl.lifecycle.swap import SwapResult
    from metralectl.app.serving_direct import ChangeResult

_GONE = object()


def routable(change: Change) -> bool:
    """Whether the running agent takes this change (it owns run/swap/stop on the box while it runs).

    Not a multi-rank run, nor a stop while a multi-rank deployment is recorded: their other nodes are
    reached through the operator's own Docker contexts and ssh credentials, which the agent's process
    may not have. Either way the stop is the same: every rank, on its node (DirectServing.stop)."""
    if change.multi is not None:
        return False
    if change.kind == "stop":
        from metralectl.lifecycle import deployment

        return not deployment.load_all()
    return True


class RoutedServing:
    """`cancelled` None: a front end on the main thread, where Ctrl-C/SIGTERM cancel the job (the start is
    shielded from them; a second one leaves at once, the agent still cleans up). Otherwise the dashboard's
    cancel, polled while following; the job's end is always followed."""

    def __init__(self, agent: AgentClient, direct: DirectServing, *, say: Callable[[str], None] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> None:
        self.agent = agent
        self.direct = direct
        self._say = say or (lambda _text: None)
        self._cancelled = cancelled

    def resolve(self, change: Change) -> Recipe:
        return self.direct.resolve(change)

    def apply(self, change: Change, on_event: Listener) -> ChangeResult:
        return {"run": self.run, "swap": self.swap, "stop": self.stop}[change.kind](change, on_event)

    def run(self, change: Change, on_event: Listener) -> Launched | LaunchedMulti:
        from metralectl.lifecycle.launch import Launched

        result = self._job(change, on_event) if routable(change) else _GONE
        return self.direct.run(change, on_event) if result is _GONE else rebuild(Launched, cast(Mapping[str, Any], result))

    def swap(self, change: Change, on_event: Listener) -> SwapResult:
        from metralectl.lifecycle.swap import SwapResult

        result = self._job(change, on_event) if routable(change) else _GONE
        return self.direct.swap(change, on_event) if result is _GONE else rebuild(SwapResult, cast(Mapping[str, Any], result))

    def stop(self, change: Change, on_event: Listener) -> Stopped:
        result = self._job(change, on_event) if routable(change) else _GONE
        return self.direct.stop(change, on_event) if result is _GONE else Stopped.from_json(result)

    def ps(self, *, repair: bool = False, on_event: Listener = ignore) -> StatusReport:
        return self.direct.ps(repair=repair, on_event=on_event)

    def logs(self, recipe: str | None = None, *, rank: int | None = None, follow: bool = False, tail: int = 200,
             container: str | None = None, stop: threading.Event | None = None) -> Iterator[str]:
        return self.direct.logs(recipe, rank=rank, follow=follow, tail=tail, container=container, stop=stop)

    def _job(self, change: Change, on_event: Listener) -> object:
        """The change as the agent's job, followed to its end: its result, or _GONE (the agent was gone)."""
        from metralectl.app.agent_client import AgentGone, outcome

        agent, kind = self.agent, change.kind
        try:
            if self._cancelled is None:
                job, early = agent.start_shielded(kind, change.to_json())
            else:
                job, early = agent.start(kind, change.to_json()), False
        except AgentGone:
            return _GONE
        self._say(agent.describe())
        failed: list[Failed] = []

        def listen(event: Any) -> None:
            if isinstance(event, Failed):
                failed.append(event)
            on_event(event)  # may raise (Ctrl-C while rendering, the dashboard's cancel): follow() cancels the job

        job, interrupted = agent.follow(job, listen, cancelled=self._cancelled, interrupted=early,
                                        leave_on_second_interrupt=self._cancelled is None)
        if interrupted and job.get("state") == "done":
            self._say(f"the {kind} had finished before the cancel reached the agent")
        cancelled_here = interrupted or (self._cancelled is not None and self._cancelled())
        if job.get("state") == "cancelled" and cancelled_here:
            raise KeyboardInterrupt
        try:
            return outcome(job, interrupted and self._cancelled is None)
        except MetralError as exc:
            if failed:  # as a LaunchFailed raised here would carry them
                exc.last_lines = list(failed[-1].last_lines)  # type: ignore[attr-defined]
            raise
