"""Thermal status against a hardware class's lines, with hysteresis. Pure.

The hardware catalog gives each class a park line and a resume line (GB10: park at ≥ 80 °C or when
the driver flags thermal throttling, resume at ≤ 70 °C). Between the lines the previous state holds,
so a node hovering around 75 °C does not flap between parked and ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from metralectl.core.gpudata import is_throttled

ThermalState = Literal["ok", "parked", "unknown"]


@dataclass(frozen=True)
class ThermalLines:
    park_c: float
    resume_c: float

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ThermalLines | None:
        """From a catalog `thermal:` block ({park-c, resume-c}); None when it is incomplete."""
        park, resume = data.get("park-c"), data.get("resume-c")
        if park is None or resume is None:
            return None
        return cls(float(park), float(resume))


@dataclass(frozen=True)
class ThermalStatus:
    state: ThermalState
    temp_c: float | None
    throttled: bool | None  # a *thermal* clock reason is set (sw/hw thermal, hw slowdown)
    reason: str


def thermal_status(
    temp_c: float | None,
    clock_reasons: Iterable[str] | None,
    *,
    park_c: float,
    resume_c: float,
    previous: ThermalState = "ok",
) -> ThermalStatus:
    """Next state of one GPU. `previous` is the state this function returned last time."""
    throttled = is_throttled(clock_reasons, thermal_only=True)
    if temp_c is not None and temp_c >= park_c:
        return ThermalStatus("parked", temp_c, throttled, f"{temp_c:g} °C ≥ park line {park_c:g} °C")
    if throttled:
        return ThermalStatus("parked", temp_c, throttled, "the driver reports thermal throttling")
    if temp_c is None:
        # Without a temperature a parked node stays parked: resuming needs evidence that it cooled.
        state: ThermalState = "parked" if previous == "parked" else "unknown"
        return ThermalStatus(state, None, throttled, "temperature unknown")
    if previous == "parked" and temp_c > resume_c:
        return ThermalStatus("parked", temp_c, throttled, f"cooling: {temp_c:g} °C, resumes at ≤ {resume_c:g} °C")
    return ThermalStatus("ok", temp_c, throttled, f"{temp_c:g} °C")


def node_thermal(statuses: Iterable[ThermalStatus]) -> ThermalState:
    """A node is parked when any GPU is; unknown when none is parked and any is unknown."""
    states = [s.state for s in statuses]
    if "parked" in states:
        return "parked"
    if not states or "unknown" in states:
        return "unknown"
    return "ok"
