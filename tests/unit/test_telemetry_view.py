"""The `top` view model: NvmlProbe over the fake pynvml (H200-like, GB10-like) + engine /metrics text →
rows and strict-JSON dicts. The samples are built by hand with a fake clock, so rates are exact."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from metralectl.seams.gpu import NvmlProbe
from metralectl.core.gpudata import GpuSystem, GpuUnavailable
from metralectl.telemetry.engine_metrics import parse_metrics
from metralectl.telemetry.sampler import Sample
from metralectl.telemetry.thermal import ThermalLines
from metralectl.telemetry.engine_view import EngineObservation, EngineTarget, engine_row
from metralectl.telemetry.view import UNIFIED_LABEL, TopModel, energy_rates, finite, thermal_lines_from
from tests.unit import fake_pynvml as fk
from tests.unit.test_engine_metrics import METRICS, later

GiB = 1024**3
LINES = {"gb10": ThermalLines(80.0, 70.0), "hopper": ThermalLines(80.0, 70.0)}
MEMINFO = "MemTotal:       124999999 kB\nMemFree:          2000000 kB\nMemAvailable:    90000000 kB\n"


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Rig:
    """A probe over fake devices whose every reading is stamped by a clock the test moves."""

    def __init__(self, devices: list[fk.FakeDevice], tmp_path: Path | None = None) -> None:
        self.clock = Clock()
        meminfo = "/nonexistent/meminfo"
        if tmp_path is not None:
            (tmp_path / "meminfo").write_text(MEMINFO)
            meminfo = str(tmp_path / "meminfo")
        self.probe = NvmlProbe(nvml=fk.make_fake(devices), meminfo_path=meminfo, clock=self.clock)
        system = self.probe.open()
        assert isinstance(system, GpuSystem)
        self.system = system
        self.samples: list[Sample] = []

    def tick(self, dt: float = 1.0, *, energy: bool = True) -> Sample:
        self.clock.t += dt
        s = Sample(len(self.samples), self.clock.t, 1.7e9 + self.clock.t, 0.0, 0.0, self.probe.sample(),
                   self.probe.energy() if energy else None)
        self.samples.append(s)
        return s


def strict_json(data: object) -> object:
    return json.loads(json.dumps(data, allow_nan=False))


def test_h200_like_row_with_counter_energy_rate() -> None:
    dev = fk.FakeDevice(energy_mj=fk.Counter(step_mj=500_000), util=(97, 60), clocks=(1980, 3201),
                        reasons=0x4,
                        compute_procs=[(4242, 80 * GiB)], temp_gpu=64, temp_mem=70)
    rig = Rig([dev])
    for _ in range(8):
        rig.tick(1.0)
    view = TopModel(LINES).view(gpu=rig.system, samples=rig.samples, wall=1.7e9, interval_s=1.0)
    (row,) = view.gpus
    assert row.name == "NVIDIA H200" and row.hw_class == "hopper"
    assert row.energy.method == "counter" and row.energy.watts == pytest.approx(500.0)
    assert row.energy.span_s == pytest.approx(5.0)  # the trailing window, not all eight seconds
    assert row.power_w == pytest.approx(120.0) and row.power_source == "instant"
    assert row.power_limit_w == 700.0
    assert row.thermal is not None and row.thermal.state == "ok"
    assert row.clock_reasons == ("sw_power_cap",) and row.throttled is True
    assert row.memory.kind == "discrete" and row.processes == 1
    data = strict_json(view.to_json())
    assert isinstance(data, dict)
    g = data["gpus"][0]
    assert g["energy_rate_method"] == "counter" and g["energy_scope"] == "gpu"
    assert g["thermal"] == {"state": "ok", "reason": "64 °C", "thermal_throttle": False, "park_c": 80.0,
                            "resume_c": 70.0}
    assert (g["util_gpu_pct"], g["sm_clock_mhz"], g["mem_clock_mhz"], g["temp_mem_c"]) == (97, 1980, 3201, 70)
    assert g["memory"]["total_bytes"] == 143771 * 1024**2 and g["memory"]["label"].startswith("discrete")
    assert data["gpu"]["available"] is True and data["thermal"] == "ok"


def test_gb10_like_unified_memory_and_average_power_last_resort(tmp_path: Path) -> None:
    dev = fk.gb10(energy_mj=fk.NotSupported, compute_procs=[(10, 40 * GiB)], graphics_procs=[(10, 40 * GiB)])
    rig = Rig([dev], tmp_path)
    for _ in range(4):
        rig.tick(0.5, energy=False)
    (row,) = TopModel(LINES).view(gpu=rig.system, samples=rig.samples, wall=0.0, interval_s=1.0).gpus
    assert row.memory.kind == "unified" and row.memory_label == UNIFIED_LABEL
    assert row.memory.total_bytes == 124999999 * 1024 and row.memory.available_bytes == 90000000 * 1024
    assert row.memory.gpu_resident_bytes == 40 * GiB
    assert row.power_source == "average"  # GB10: no instant power field
    assert row.energy.method == "average-integral" and row.energy.watts == pytest.approx(11.0)
    assert row.energy_scope == "gpu-only"
    g = row.to_json()
    assert g["memory"]["kind"] == "unified" and "pcie_gen" not in g and "fan_pct" not in g
    assert g["temp_mem_c"] is None and g["mem_clock_mhz"] is None  # unknown, never a fake 0


def test_instant_integral_when_the_counter_is_missing() -> None:
    rig = Rig([fk.FakeDevice(energy_mj=fk.NotSupported, instant_mw=250_000)])
    for _ in range(3):
        rig.tick(0.1, energy=False)
    rate = energy_rates(rig.samples)[rig.system.gpus[0].uuid]
    assert rate.method == "instant-integral" and rate.watts == pytest.approx(250.0)


def test_counter_until_two_readings_then_counter() -> None:
    dev = fk.FakeDevice(energy_mj=fk.Counter(step_mj=300_000))
    rig = Rig([dev])
    rig.tick(0.1)  # one counter reading: not a rate yet, the power integral stands in
    rig.tick(0.1, energy=False)
    uuid = rig.system.gpus[0].uuid
    assert energy_rates(rig.samples)[uuid].method == "instant-integral"
    rig.tick(0.8)
    rate = energy_rates(rig.samples)[uuid]
    assert rate.method == "counter" and rate.watts == pytest.approx(300.0 / 0.9)


def test_counter_reset_inside_the_window_uses_only_readings_after_it() -> None:
    counter = fk.Counter(start=9_000_000, step_mj=100_000)
    rig = Rig([fk.FakeDevice(energy_mj=counter)])
    rig.tick()
    rig.tick()
    counter.reset(0)  # driver reload
    rig.tick()
    rig.tick()
    rig.tick()
    rate = energy_rates(rig.samples)[rig.system.gpus[0].uuid]
    assert rate.method == "counter" and rate.watts == pytest.approx(100.0)
    assert rate.span_s == pytest.approx(2.0)


def test_thermal_hysteresis_across_views_and_the_throttle_flag() -> None:
    dev = fk.FakeDevice(temp_gpu=60)
    rig = Rig([dev])
    model = TopModel(LINES)
    states = []
    for temp, reasons in [(60, 0), (85, 0), (75, 0), (71, 0), (69, 0), (65, 0x40), (65, 0)]:
        dev.temp_gpu, dev.reasons = temp, reasons
        rig.tick()
        view = model.view(gpu=rig.system, samples=rig.samples[-3:], wall=0.0, interval_s=1.0)
        states.append(view.gpus[0].thermal.state)  # type: ignore[union-attr]
    assert states == ["ok", "parked", "parked", "parked", "ok", "parked", "ok"]
    assert view.thermal == "ok"


def test_hysteresis_sees_every_sample_between_views() -> None:
    dev = fk.FakeDevice(temp_gpu=60)
    rig = Rig([dev])
    model = TopModel(LINES)
    for temp in (60, 90, 75):  # the 90 °C spike lands between two views
        dev.temp_gpu = temp
        rig.tick()
    view = model.view(gpu=rig.system, samples=rig.samples, wall=0.0, interval_s=1.0)
    assert view.gpus[0].thermal is not None and view.gpus[0].thermal.state == "parked"
    assert "resumes at ≤ 70" in view.gpus[0].thermal.reason


def test_unknown_hardware_class_has_no_thermal_lines() -> None:
    rig = Rig([fk.FakeDevice(name="NVIDIA Future GPU")])
    rig.tick()
    view = TopModel(LINES).view(gpu=rig.system, samples=rig.samples, wall=0.0, interval_s=1.0)
    assert view.gpus[0].thermal is None and view.to_json()["gpus"][0]["thermal"] is None
    assert view.thermal == "unknown"


def test_no_gpu_is_a_state_with_the_engine_part_still_there() -> None:
    reason = "no NVIDIA driver: libnvidia-ml.so.1 was not found"
    gone = GpuUnavailable(reason, "install the driver", "LibraryNotFound")
    obs = EngineObservation(EngineTarget("http://127.0.0.1:8888", "metralectl-x", "x", "container"),
                            (parse_metrics(METRICS, t=1.0),))
    view = TopModel(LINES).view(gpu=gone, samples=[], engines=[obs], wall=5.0, interval_s=1.0)
    data = strict_json(view.to_json())
    assert isinstance(data, dict)
    assert data["gpu"] == {"available": False, "reason": f"no GPU: {reason}",
                           "hint": "install the driver", "cause": "LibraryNotFound"}
    assert data["gpus"] == [] and data["thermal"] is None
    (e,) = data["engines"]
    assert e["state"] == "ok" and e["requests_active"] == 3
    assert e["tokens_per_s"] is None  # one snapshot: no rate yet
    assert e["totals"]["generation_tokens"] == 12800 and e["ttft_scope"] == "lifetime"
    assert e["ttft_p50_s"] == pytest.approx(0.06) and e["spec_acceptance"] == pytest.approx(1450 / 1850)


def test_engine_rates_over_the_window() -> None:
    text2 = later(METRICS, metrale_generation_tokens_total=12800 + 500, metrale_requests_active=5,
                  metrale_prefix_cache_hits_total=75 + 9, metrale_prefix_cache_misses_total=25 + 1)
    snaps = (parse_metrics(METRICS, t=10.0), parse_metrics(METRICS, t=11.0), parse_metrics(text2, t=15.0))
    row = engine_row(EngineObservation(EngineTarget("http://e"), snaps))
    assert row.tokens_per_s == pytest.approx(100.0)  # 500 tokens over the 5 s window
    assert row.snapshot is not None and row.snapshot.requests_active == 5
    assert row.prefix_cache_hit_rate == pytest.approx(0.9)  # the window's, not the lifetime 0.75
    assert row.ttft_scope == "lifetime"  # no new TTFT observations in the window
    d = row.to_json()
    assert d["window"]["span_s"] == 5.0 and d["window"]["generation_tokens_per_s"] == pytest.approx(100.0)
    assert d["lifetime"]["prefix_cache_hit_rate"] == pytest.approx(84 / 110)  # since the engine started


def test_engine_restart_in_the_window_rates_from_after_it() -> None:
    restarted = later(METRICS, metrale_generation_tokens_total=40)
    newer = later(METRICS, metrale_generation_tokens_total=240)
    snaps = (parse_metrics(METRICS, t=0.0), parse_metrics(restarted, t=2.0), parse_metrics(newer, t=4.0))
    row = engine_row(EngineObservation(EngineTarget("http://e"), snaps))
    assert row.rates is not None and not row.rates.reset and row.tokens_per_s == pytest.approx(100.0)


def test_unreachable_engine_is_one_line_not_numbers() -> None:
    row = engine_row(EngineObservation(EngineTarget("http://e"), (), "cannot read http://e/metrics: refused",
                                       "unreachable"))
    d = row.to_json()
    assert d["state"] == "unreachable" and d["error"].startswith("cannot read")
    assert d["tokens_per_s"] is None and d["totals"] is None


def test_finite_and_thermal_lines_from_catalog_shapes() -> None:
    assert finite({"a": [math.nan, 1.0, math.inf], "b": (2, -math.inf)}) == \
        {"a": [None, 1.0, None], "b": [2, None]}

    class Hw:
        def __init__(self, park: float | None, resume: float | None) -> None:
            self.park_c, self.resume_c = park, resume

    assert thermal_lines_from({"gb10": Hw(80, 70), "odd": Hw(None, 70)}) == {"gb10": ThermalLines(80.0, 70.0)}


def test_shipped_catalog_lines() -> None:
    from metralectl.core.catalog import load_catalog

    lines = thermal_lines_from(load_catalog().hardware)
    assert lines["gb10"] == ThermalLines(80.0, 70.0)
    assert lines["hopper"] == lines["b200"] == ThermalLines(80.0, 70.0)  # inherited from gb10


def test_gpu_processes_name_our_container(tmp_path) -> None:  # noqa: ANN001
    """Per-process GPU memory, with the metralectl container a PID runs in (from /proc/PID/cgroup)."""
    from metralectl.seams.gpu import NvmlProbe
    from metralectl.telemetry import watch
    from metralectl.telemetry.view import gpu_row
    from tests.unit import fake_pynvml as fk

    ours = "a" * 64
    for pid, cgroup in ((4242, f"0::/system.slice/docker-{ours}.scope\n"), (999, "0::/user.slice\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)
    watch._OURS.clear()
    watch._OURS[ours] = "metralectl-qwen3.5-35b-a3b"
    probe = NvmlProbe(nvml=fk.make_fake([fk.gb10(compute_procs=[(4242, 30 * fk.GiB), (999, fk.GiB)])]),
                      meminfo_path="/nonexistent")
    probe.open()
    [sample] = probe.sample()
    row = gpu_row(sample, None, None, None, None, None, lambda pid: watch.our_container_of(pid, tmp_path))
    by_pid = {p["pid"]: p for p in row.to_json()["process_list"]}
    assert by_pid[4242]["container"] == "metralectl-qwen3.5-35b-a3b" and by_pid[4242]["used_bytes"] == 30 * fk.GiB
    assert by_pid[999]["container"] is None
    watch._OURS.clear()
