"""bench/startup.py: the phases of a cold start from the lifecycle's events (pure); a missing event is a missing
phase, never a zero; the headline is p50/min/max over the starts."""

from __future__ import annotations

import pytest

from metralectl.bench import startup as S


def _timeline(*events: tuple[float, dict[str, object]]) -> S.Timeline:
    timeline = S.Timeline()
    for t, event in events:
        timeline.add(t, event)
    return timeline


FULL = (
    (0.05, {"kind": "Step", "name": "program"}), (0.06, {"kind": "Step", "name": "weights"}),
    (0.30, {"kind": "Step", "name": "port"}), (0.31, {"kind": "Step", "name": "starting"}),
    (0.40, {"kind": "ContainerStarted", "name": "c"}), (0.55, {"kind": "Phase", "phase": "loading", "rank": None}),
    (0.90, {"kind": "Phase", "phase": "ready", "rank": None}), (0.91, {"kind": "Ready"}),
)


def test_every_phase_in_order_adds_up_to_the_first_token() -> None:
    split = S.phases(_timeline(*FULL), 1.2)
    assert split["phases"] == {"preflight": 0.05, "pull": 0.25, "create": 0.1, "load": pytest.approx(0.51),
                               "warm-up": pytest.approx(0.29)}
    assert split["missing"] == [] and split["ordered"]
    assert sum(split["phases"].values()) == pytest.approx(1.2)
    assert split["engine_phases"] == {"loading": 0.55, "ready": 0.9}
    assert split["time_to_ready_s"] == 0.91 and split["time_to_first_token_s"] == 1.2


def test_a_missing_event_is_a_missing_phase() -> None:
    split = S.phases(_timeline(*[e for e in FULL if e[1]["kind"] != "ContainerStarted"]), None)
    assert split["missing"] == ["create", "load", "warm-up"] and not split["ordered"]
    assert split["phases"]["create"] is None and split["time_to_first_token_s"] is None


def test_headline_over_the_starts() -> None:
    starts = [S.phases(_timeline(*FULL), t) for t in (1.0, 1.2, 2.0)]
    head = S.headline(starts)
    assert head["time_to_first_token_s.p50"] == 1.2 and head["time_to_first_token_s.max"] == 2.0
    assert head["pull_s.p50"] == 0.25 and head["warm-up_s.min"] == pytest.approx(0.09)
