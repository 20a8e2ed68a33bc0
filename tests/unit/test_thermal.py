"""Thermal status with hysteresis against a hardware class's lines."""

from __future__ import annotations

from metralectl.telemetry.thermal import ThermalLines, ThermalStatus, node_thermal, thermal_status

GB10 = {"park_c": 80.0, "resume_c": 70.0}


def run(temps: list[float | None], reasons: list[tuple[str, ...] | None] | None = None) -> list[str]:
    state = "ok"
    out = []
    for i, t in enumerate(temps):
        status = thermal_status(t, reasons[i] if reasons else (), previous=state, **GB10)  # type: ignore[arg-type]
        state = status.state
        out.append(state)
    return out


def test_hysteresis_between_the_lines() -> None:
    assert run([60, 79, 80, 75, 71, 70, 75, 79.9]) == \
        ["ok", "ok", "parked", "parked", "parked", "ok", "ok", "ok"]


def test_thermal_throttle_flag_parks_even_when_cool() -> None:
    assert run([65, 65, 65], [(), ("hw_thermal",), ()]) == ["ok", "parked", "ok"]
    assert run([72, 72], [("sw_thermal",), ()]) == ["parked", "parked"]  # still above resume


def test_power_cap_is_not_a_thermal_reason() -> None:
    assert run([65], [("sw_power_cap", "gpu_idle")]) == ["ok"]


def test_unknown_temperature_keeps_a_parked_node_parked() -> None:
    assert run([None]) == ["unknown"]
    assert run([85, None, 65]) == ["parked", "parked", "ok"]


def test_lines_from_catalog_block_and_node_state() -> None:
    assert ThermalLines.from_mapping({"park-c": 80, "resume-c": 70}) == ThermalLines(80.0, 70.0)
    assert ThermalLines.from_mapping({"park-c": 80}) is None
    ok = ThermalStatus("ok", 50, False, "")
    parked = ThermalStatus("parked", 85, False, "")
    unknown = ThermalStatus("unknown", None, None, "")
    assert node_thermal([ok, parked, unknown]) == "parked"
    assert node_thermal([ok, unknown]) == "unknown"
    assert node_thermal([ok, ok]) == "ok"
    assert node_thermal([]) == "unknown"
