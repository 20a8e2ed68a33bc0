"""Energy math: counter deltas, integrals, flags, per-token numbers."""

from __future__ import annotations

import pytest

from metralectl.core.gpudata import EnergyReading, PowerReading
from metralectl.telemetry.energy import (
    WindowAccumulator,
    counter_delta_j,
    energy_report,
    relative_difference,
    trapezoid,
    window_from_points,
)


def powers(uuid: str, hz: float, seconds: float, watts: float, *, instant: bool = True) -> list[PowerReading]:
    n = int(hz * seconds)
    return [PowerReading(uuid, i / hz, watts if instant else None, watts) for i in range(n + 1)]


def counters(uuid: str, *values_at: tuple[float, int | None]) -> list[EnergyReading]:
    return [EnergyReading(uuid, t, v) for t, v in values_at]


def test_trapezoid() -> None:
    assert trapezoid([(0.0, 100.0), (1.0, 200.0), (3.0, 200.0)]) == pytest.approx(550.0)
    assert trapezoid([(0.0, 100.0), (1.0, None), (2.0, 100.0)]) == pytest.approx(200.0)  # bridged, not zeroed
    assert trapezoid([(0.0, 100.0)]) is None
    assert trapezoid([]) is None


def test_counter_delta() -> None:
    assert counter_delta_j(1_000_000, 4_000_000) == 3000.0
    assert counter_delta_j(4_000_000, 1_000) is None  # reset
    assert counter_delta_j(None, 5) is None


def test_counter_window_report() -> None:
    w = window_from_points(0.0, 30.0, counters("g", (0.0, 1_000_000)), counters("g", (30.0, 4_000_000)),
                           powers("g", 20, 30, 101.0))
    r = energy_report(w, output_tokens=1000)
    assert r.valid and r.method == "counter" and r.scope == "gpu"
    assert r.joules == pytest.approx(3000.0) and r.average_w == pytest.approx(100.0)
    assert r.j_per_token == pytest.approx(3.0) and r.tokens_per_j == pytest.approx(1 / 3)
    assert r.flags == ()
    g = r.per_gpu[0]
    assert g.instant_j == pytest.approx(3030.0)
    assert relative_difference(g.instant_j, g.counter_j) == pytest.approx(0.01)
    assert r.to_json()["per_gpu"][0]["uuid"] == "g"


def test_short_window_is_flagged() -> None:
    w = window_from_points(0.0, 5.0, counters("g", (0.0, 0)), counters("g", (5.0, 500_000)), powers("g", 20, 5, 100))
    r = energy_report(w)
    assert r.valid and "short-window" in r.flags


def test_counter_reset_invalidates_the_window() -> None:
    # reset mid-window and climbed past the start again: only the intermediate reading shows it
    w = window_from_points(0.0, 30.0, counters("g", (0.0, 1_000_000)), counters("g", (30.0, 1_500_000)),
                           powers("g", 20, 30, 100), counters_between=counters("g", (10.0, 2_000_000), (11.0, 5_000)))
    r = energy_report(w, output_tokens=100)
    assert not r.valid and r.joules is None and r.j_per_token is None
    assert "counter-reset:g" in r.flags
    # and a plain backwards delta between the edges
    w2 = window_from_points(0.0, 30.0, counters("g", (0.0, 9_000_000)), counters("g", (30.0, 100)), ())
    assert not energy_report(w2).valid


def test_instant_integral_when_counter_unsupported() -> None:
    w = window_from_points(0.0, 30.0, counters("g", (0.0, None)), counters("g", (30.0, None)), powers("g", 20, 30, 200))
    r = energy_report(w, output_tokens=600)
    assert r.valid and r.method == "instant-integral" and r.flags == ()
    assert r.joules == pytest.approx(6000.0) and r.j_per_token == pytest.approx(10.0)


def test_instant_integral_below_20hz_is_flagged() -> None:
    w = window_from_points(0.0, 30.0, (), (), powers("g", 10, 30, 200))
    r = energy_report(w)
    assert r.method == "instant-integral" and "undersampled:g" in r.flags


def test_average_power_is_a_flagged_last_resort() -> None:
    w = window_from_points(0.0, 30.0, (), (), powers("g", 20, 30, 50, instant=False))
    r = energy_report(w)
    assert r.valid and r.method == "average-integral" and "average-power:g" in r.flags
    assert r.joules == pytest.approx(1500.0)


def test_no_data_is_invalid() -> None:
    w = window_from_points(0.0, 30.0, counters("g", (0.0, None)), counters("g", (30.0, None)), ())
    r = energy_report(w)
    assert not r.valid and r.method is None and "no-energy-data:g" in r.flags


def test_two_gpus_sum_and_weakest_method_wins() -> None:
    w = window_from_points(
        0.0, 20.0,
        counters("a", (0.0, 0)) + counters("b", (0.0, None)),
        counters("a", (20.0, 2_000_000)) + counters("b", (20.0, None)),
        powers("a", 20, 20, 100) + powers("b", 20, 20, 300),
    )
    r = energy_report(w)
    assert r.method == "instant-integral" and r.joules == pytest.approx(2000 + 6000)
    assert [g.method for g in r.per_gpu] == ["counter", "instant-integral"]


def test_idle_baseline_subtraction() -> None:
    w = window_from_points(0.0, 100.0, counters("g", (0.0, 0)), counters("g", (100.0, 30_000_000)), ())
    r = energy_report(w, output_tokens=2000, baseline_w=100.0)
    assert r.joules == pytest.approx(30000.0) and r.net_joules == pytest.approx(20000.0)
    assert r.j_per_token == pytest.approx(10.0) and r.tokens_per_j == pytest.approx(0.1)
    assert r.average_w == pytest.approx(300.0)  # gross
    below = energy_report(w, output_tokens=10, baseline_w=400.0)
    assert "below-baseline" in below.flags and below.tokens_per_j is None


def test_unified_scope_is_reported() -> None:
    acc = WindowAccumulator(0.0, counters("g", (0.0, 0)), [], scope="gpu-only")
    r = energy_report(acc.finish(12.0, counters("g", (12.0, 240_000)), []))
    assert r.scope == "gpu-only" and r.average_w == pytest.approx(20.0)


def test_accumulator_matches_batch_trapezoid() -> None:
    pts = [PowerReading("g", t / 7.0, 100 + (t % 5) * 10.0, None) for t in range(200)]
    acc = WindowAccumulator(0.0, [], pts[:1])
    for p in pts[1:]:
        acc.add_power([p])
    data = acc.finish(pts[-1].t, [], [])
    assert data.gpus[0].instant_j == pytest.approx(trapezoid((p.t, p.instant_w) for p in pts))
    assert data.gpus[0].instant_rate_hz == pytest.approx(7.0)
