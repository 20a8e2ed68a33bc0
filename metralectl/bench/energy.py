"""Energy per output token and thermal state over benchmark stages, through the telemetry sampler.

Without a usable GPU (no driver, no NVML: CI, laptops, this project's test machines) nothing is
sampled and records say "unavailable: <reason>" instead of a number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError

if TYPE_CHECKING:
    from metralectl.telemetry.sampler import EnergyWindow


class StageEnergy:
    def __init__(self, probe: Any | None = None, park_c: float = 80.0, resume_c: float = 70.0) -> None:
        self.sampler: Any | None = None
        self.reason: str | None = None
        self.system: dict[str, Any] | None = None
        self.park_c, self.resume_c = park_c, resume_c
        try:
            if probe is None:
                from metralectl.seams.gpu import NvmlProbe

                probe = NvmlProbe()
            opened = probe.open()
            self.system = opened.to_json()
            if not self.system.get("available"):
                self.reason = str(self.system.get("reason") or "no GPU")
                return
            from metralectl.telemetry.sampler import Sampler

            self.sampler = Sampler(probe, hz=10.0).start()
        except MetralError as exc:
            self.reason = exc.message

    @property
    def available(self) -> bool:
        return self.sampler is not None

    def open(self) -> EnergyWindow | None:
        if self.sampler is None:
            return None
        try:
            window = self.sampler.open_window()
            window.started.result(5.0)
            return window
        except MetralError as exc:
            self.reason = exc.message
            return None

    def close(self, window: EnergyWindow | None, output_tokens: int) -> dict[str, Any] | str:
        if window is None or self.sampler is None:
            return f"unavailable: {self.reason or 'no GPU telemetry'}"
        from metralectl.telemetry.energy import energy_report

        try:
            data = self.sampler.close_window(window).result(5.0)
        except MetralError as exc:
            return f"unavailable: {exc.message}"
        report = energy_report(data, output_tokens=output_tokens).to_json()
        return {"j_per_output_token": report["j_per_token"], "method": report["method"], "scope": report["scope"],
                **report}

    def thermal(self) -> dict[str, Any]:
        if self.sampler is None:
            return {"state": "unknown", "reason": f"unavailable: {self.reason or 'no GPU telemetry'}"}
        from metralectl.telemetry.thermal import node_thermal, thermal_status

        sample = self.sampler.latest()
        if sample is None:
            return {"state": "unknown", "reason": "no sample yet"}
        statuses = [thermal_status(g.temp_gpu_c, g.clock_reasons, park_c=self.park_c, resume_c=self.resume_c)
                    for g in sample.gpus]
        return {"state": node_thermal(statuses), "gpus": [{"uuid": g.uuid, "temp_c": s.temp_c, "throttled": s.throttled,
                                                            "reason": s.reason} for g, s in zip(sample.gpus, statuses)]}

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
