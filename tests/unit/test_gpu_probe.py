"""NvmlProbe against a fake pynvml that raises the library's own exceptions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.seams.gpu import GpuLost, NvmlProbe
from metralectl.core.gpudata import (
    GpuSystem,
    GpuUnavailable,
    ProcessMemory,
    cuda_version_string,
    decode_clock_reasons,
    gpu_resident_bytes,
    is_unified,
    match_hw_class,
    parse_meminfo,
)
from tests.unit import fake_pynvml as fk

GiB = 1024**3
MEMINFO = """MemTotal:       124999999 kB
MemFree:          2000000 kB
MemAvailable:    90000000 kB
Buffers:            12345 kB
HugePages_Total:        0
"""


@pytest.fixture
def meminfo(tmp_path: Path) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    return path


def open_probe(devices: list[fk.FakeDevice], meminfo: Path | None = None, **kw: object) -> tuple[NvmlProbe, GpuSystem]:
    probe = NvmlProbe(nvml=fk.make_fake(devices, **kw), meminfo_path=meminfo or "/nonexistent/meminfo")
    system = probe.open()
    assert isinstance(system, GpuSystem), system
    return probe, system


def test_h200_like_device_reports_every_field(meminfo: Path) -> None:
    dev = fk.FakeDevice(compute_procs=[(4242, 80 * GiB)], util=(97, 60), clocks=(1980, 3201), reasons=0x4)
    probe, system = open_probe([dev], meminfo)
    assert system.driver_version == "580.95.05"
    assert system.cuda_driver_version == "13.0"
    info = system.gpus[0]
    assert (info.hw_class, info.memory_kind, info.power_source) == ("hopper", "discrete", "instant")
    assert info.pci_bus_id == "00000000:19:00.0"
    assert info.support["energy"] == "ok" and info.support["fan"] == "NotSupported"
    (s,) = probe.sample()
    assert s.power_w == pytest.approx(120.0) and s.power_source == "instant"
    assert s.power.average_w == pytest.approx(118.0)
    assert (s.util_gpu_pct, s.util_mem_pct, s.sm_clock_mhz, s.mem_clock_mhz) == (97, 60, 1980, 3201)
    assert (s.temp_gpu_c, s.temp_mem_c, s.power_limit_w) == (35, 40, 700.0)
    assert s.clock_reasons == ("sw_power_cap",) and s.throttled is True
    assert s.memory.kind == "discrete" and s.memory.total_bytes == 143771 * 1024**2
    assert s.processes == (ProcessMemory(4242, 80 * GiB, "compute"),)
    assert (s.pcie_gen, s.pcie_width, s.fan_pct) == (5, 16, None)  # fan: unknown, not 0
    out = s.to_json()
    assert out["fan_pct"] is None and "pcie_gen" in out
    json.dumps(out)
    (e,) = probe.energy()
    assert e.energy_mj == 1_000_000
    probe.close()


def test_gb10_unified_memory_from_meminfo(meminfo: Path) -> None:
    dev = fk.gb10(compute_procs=[(10, 40 * GiB), (11, None)], graphics_procs=[(10, 40 * GiB), (12, 1 * GiB)])
    probe, system = open_probe([dev], meminfo)
    info = system.gpus[0]
    assert (info.hw_class, info.memory_kind) == ("gb10", "unified")
    assert info.support["memory"] == "NotSupported"
    (s,) = probe.sample()
    mem = s.memory
    assert mem.kind == "unified"
    assert mem.total_bytes == 124999999 * 1024
    assert mem.available_bytes == 90000000 * 1024  # MemAvailable, not MemFree
    assert mem.used_bytes == (124999999 - 90000000) * 1024
    assert mem.gpu_resident_bytes == 41 * GiB  # pid 10 once, pid 11 unknown, pid 12
    out = s.to_json()
    for hidden in ("pcie_gen", "pcie_width", "fan_pct"):
        assert hidden not in out
    assert out["memory"]["kind"] == "unified"
    assert s.mem_clock_mhz is None and s.temp_mem_c is None and s.power_limit_w is None


def test_missing_instant_power_falls_back_to_average_and_says_so() -> None:
    probe, system = open_probe([fk.FakeDevice(instant_mw=fk.NotSupported)])
    assert system.gpus[0].power_source == "average"
    assert system.gpus[0].support["power.instant"] == "NotSupported"
    (p,) = probe.power()
    assert p.instant_w is None and p.watts == pytest.approx(118.0) and p.source == "average"


def test_no_power_at_all_is_unknown_not_zero() -> None:
    probe, system = open_probe([fk.FakeDevice(instant_mw=fk.NotSupported, average_mw=fk.NoPermission,
                                              energy_mj=fk.NotSupported)])
    assert system.gpus[0].power_source is None
    (s,) = probe.sample()
    assert s.power_w is None and s.power_source is None
    assert probe.energy()[0].energy_mj is None
    assert probe.support()[s.uuid]["power.average"] == "NoPermission"


@pytest.mark.parametrize("error,cause", [(fk.LibraryNotFound, "LibraryNotFound"),
                                         (fk.DriverNotLoaded, "DriverNotLoaded"),
                                         (fk.NoPermission, "NoPermission")])
def test_no_nvml_is_a_state_not_an_error(error: type[BaseException], cause: str) -> None:
    fake = fk.make_fake([fk.FakeDevice()], init_error=error)
    probe = NvmlProbe(nvml=fake)
    state = probe.open()
    assert isinstance(state, GpuUnavailable)
    assert state.cause == cause and state.reason and state.hint
    assert probe.sample() == () and probe.power() == () and probe.energy() == ()
    probe.close()
    assert fake.calls == ["init"]  # no shutdown of a library that never started, no storm of calls


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    state = NvmlProbe().open()
    assert isinstance(state, GpuUnavailable) and "nvidia-ml-py" in state.reason


def test_real_library_never_raises() -> None:
    """Contract with the installed nvidia-ml-py: no driver here → a state; a GPU → a system."""
    probe = NvmlProbe()
    state = probe.open()
    if isinstance(state, GpuUnavailable):
        assert state.cause in {"LibraryNotFound", "DriverNotLoaded", "NoPermission"}
    else:
        assert state.gpus and probe.sample()
    probe.close()


def test_zero_gpus() -> None:
    state = NvmlProbe(nvml=fk.make_fake([])).open()
    assert isinstance(state, GpuUnavailable) and "no GPU" in state.reason


def test_lost_gpu_raises_gpulost_once_opened() -> None:
    dev = fk.FakeDevice()
    probe, _ = open_probe([dev])
    dev.energy_mj = fk.GpuIsLost
    with pytest.raises(GpuLost, match="GpuIsLost"):
        probe.energy()


def test_lost_gpu_during_open_is_unavailable() -> None:
    state = NvmlProbe(nvml=fk.make_fake([fk.FakeDevice(temp_gpu=fk.GpuIsLost)])).open()
    assert isinstance(state, GpuUnavailable) and state.cause == "GpuLost"


def test_event_reasons_missing_in_driver_falls_back_to_throttle_reasons() -> None:
    fake = fk.make_fake([fk.FakeDevice(reasons=0x40)])
    fake.nvmlDeviceGetCurrentClocksEventReasons = lambda h: (_ for _ in ()).throw(fk.FunctionNotFound())
    probe = NvmlProbe(nvml=fake)
    assert isinstance(probe.open(), GpuSystem)
    (s,) = probe.sample()
    assert s.clock_reasons == ("hw_thermal",)


def test_process_lists_unsupported_means_unknown_resident() -> None:
    probe, _ = open_probe([fk.gb10(compute_procs=fk.NotSupported, graphics_procs=fk.NotSupported)])
    (s,) = probe.sample()
    assert s.processes is None and s.memory.gpu_resident_bytes is None


def test_unknown_gpu_with_total_near_host_memory_is_unified(meminfo: Path) -> None:
    near = int(124999999 * 1024 * 0.95)
    _, system = open_probe([fk.FakeDevice(name="NVIDIA Future APU", memory=(near, 0))], meminfo)
    assert system.gpus[0].memory_kind == "unified" and system.gpus[0].hw_class is None


def test_known_discrete_class_is_not_reclassified_by_size(meminfo: Path) -> None:
    near = int(124999999 * 1024 * 1.05)
    _, system = open_probe([fk.FakeDevice(memory=(near, 0))], meminfo)
    assert system.gpus[0].memory_kind == "discrete"


def test_multi_gpu_keyed_by_uuid() -> None:
    a = fk.FakeDevice(uuid="GPU-a", bus_id="00000000:19:00.0")
    b = fk.FakeDevice(uuid="GPU-b", bus_id="00000000:3B:00.0", instant_mw=300_000)
    probe, system = open_probe([a, b])
    assert [g.uuid for g in system.gpus] == ["GPU-a", "GPU-b"]
    assert {p.uuid: p.watts for p in probe.power()} == {"GPU-a": 120.0, "GPU-b": 300.0}


def test_import_does_not_load_pynvml() -> None:
    code = ("import sys, metralectl.seams.gpu, metralectl.telemetry.sampler, metralectl.telemetry.energy, "
            "metralectl.telemetry.engine_metrics, metralectl.telemetry.thermal; "
            "print('pynvml' in sys.modules, 'prometheus_client' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["False", "False"]


# -- pure rules -----------------------------------------------------------------------------------

def test_unified_rules() -> None:
    assert is_unified(None, 128 * GiB, memory_info_supported=False, class_unified=False)
    assert is_unified(0, 128 * GiB, memory_info_supported=True, class_unified=None)
    assert is_unified(120 * GiB, 128 * GiB, memory_info_supported=True, class_unified=None)
    assert not is_unified(80 * GiB, 128 * GiB, memory_info_supported=True, class_unified=None)
    assert not is_unified(139 * GiB, 128 * GiB, memory_info_supported=True, class_unified=False)
    assert is_unified(80 * GiB, 128 * GiB, memory_info_supported=True, class_unified=True)
    assert not is_unified(80 * GiB, None, memory_info_supported=True, class_unified=None)


def test_hw_class_matching() -> None:
    assert match_hw_class("NVIDIA GB10") == "gb10"
    assert match_hw_class("NVIDIA H100 80GB HBM3") == "hopper"
    assert match_hw_class("NVIDIA H200 NVL") == "hopper"
    assert match_hw_class("NVIDIA B200") == "b200"
    assert match_hw_class("NVIDIA GB200") is None  # not a B200 by substring accident
    assert match_hw_class("NVIDIA GeForce RTX 4090") is None
    assert match_hw_class(None) is None
    catalog = [("NVIDIA GB10", "gb10")]
    assert match_hw_class("nvidia gb10", catalog) == "gb10"
    assert match_hw_class("NVIDIA H200", catalog) is None


def test_clock_reasons_decoding() -> None:
    assert decode_clock_reasons(None) is None
    assert decode_clock_reasons(0) == ()
    assert decode_clock_reasons(0x4 | 0x40) == ("sw_power_cap", "hw_thermal")
    assert decode_clock_reasons(0x1 | 0x10000) == ("gpu_idle", "0x10000")


def test_small_parsers() -> None:
    assert parse_meminfo(MEMINFO)["MemAvailable"] == 90000000 * 1024
    assert parse_meminfo(MEMINFO)["HugePages_Total"] == 0
    assert cuda_version_string(13000) == "13.0" and cuda_version_string(12080) == "12.8"
    assert cuda_version_string(None) is None
    assert gpu_resident_bytes([]) == 0 and gpu_resident_bytes(None) is None


def test_unsupported_fields_are_not_asked_again() -> None:
    calls: list[str] = []
    fake = fk.make_fake([fk.FakeDevice(instant_mw=fk.NotSupported)])
    fan, fields = fake.nvmlDeviceGetFanSpeed, fake.nvmlDeviceGetFieldValues
    fake.nvmlDeviceGetFanSpeed = lambda h: (calls.append("fan"), fan(h))[1]
    fake.nvmlDeviceGetFieldValues = lambda h, ids: (calls.append(f"fields{sorted(ids)}"), fields(h, ids))[1]
    probe = NvmlProbe(nvml=fake)
    assert isinstance(probe.open(), GpuSystem)
    calls.clear()
    for _ in range(3):
        probe.sample()
    assert "fan" not in calls  # NotSupported once is NotSupported for good
    assert all("186" not in c for c in calls)  # nor the instant-power field inside the batched call
    assert probe.sample()[0].fan_pct is None and probe.support()[probe.sample()[0].uuid]["fan"] == "NotSupported"
