"""The Serving view's telemetry: `metralectl top`'s session (telemetry.watch.TopSession) behind the
small TelemetryFeed interface, so the view neither knows NVML nor HTTP and tests pass canned TopViews."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metralectl.seams.docker.shared import SharedRuntime
    from metralectl.telemetry.view import TopView
    from metralectl.telemetry.watch import TopSession


class TopFeed:
    interval_s = 1.0

    def __init__(self, catalog: Any, *, interval_s: float = 1.0, runtime: SharedRuntime | None = None) -> None:
        self.interval_s = interval_s
        self._runtime = runtime  # the dashboard's kept Docker connection for engine discovery (None: its own)
        self._catalog = catalog
        self._session: TopSession | None = None

    def start(self) -> None:
        from metralectl.gateway.watch import observe
        from metralectl.seams.gpu import NvmlProbe
        from metralectl.telemetry.view import thermal_lines_from
        from metralectl.telemetry.watch import EngineDiscovery, TopSession

        self._session = TopSession(NvmlProbe(), EngineDiscovery(runtime=self._runtime), thermal_lines_from(self._catalog.hardware),
                                   interval_s=self.interval_s, hz=4.0, energy_hz=1.0, gateways=observe).start()

    def view(self) -> TopView:
        assert self._session is not None, "start() first"
        return self._session.view()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
