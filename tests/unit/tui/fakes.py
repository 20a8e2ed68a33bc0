"""Fake core services for the dashboard's Pilot tests, snapshots and benchmark.

They emit the core's real value types (LibraryRow, StatusReport, CheckResult, TopView, lifecycle
events) on the worker threads the App starts, so the tests exercise the same messages and widgets
as production — only Docker, NVML, HTTP and the disk are replaced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from metralectl.doctor.model import CheckResult
from metralectl.errors import MetralError
from metralectl.core.gpudata import GpuSystem, GpuUnavailable, MemoryState
from metralectl.app.library import LibraryRow
from metralectl.lifecycle import events as ev
from metralectl.lifecycle.status import Serving, StatusReport
from metralectl.telemetry.engine_metrics import EngineSnapshot
from metralectl.telemetry.thermal import ThermalLines, ThermalStatus
from metralectl.telemetry.engine_view import EngineRow, EngineTarget
from metralectl.telemetry.view import EnergyRate, GpuRow, TopView
from metralectl.cancel import CancelToken
from metralectl.tui.services import (
    Action,
    BenchProgress,
    LibraryItem,
    LibrarySnapshot,
    Outcome,
    ParamSpec,
    Plan,
    RunDetail,
    RunSummary,
    SuiteInfo,
)

FIXED_NOW = 1_764_435_600.0  # 2025-11-29 17:00 UTC: snapshots never see the real clock


def library_row(name: str, *, model: str = "Qwen3.5-35B-A3B", quant: str = "nvfp4", hardware: str = "gb10",
                mtp: bool = True, tok_s: float | None = 131.0, fits: bool | None = True, weights: str = "complete",
                tags: tuple[str, ...] = (), engine: str = "metrale") -> LibraryRow:
    return LibraryRow(name=name, engine=engine, model=model, repo=f"Org/{model}-{quant.upper()}", quant=quant, hardware=hardware,
                      mtp=mtp, validated_tok_s=tok_s, memory_gb=24.1, budget_gb=105.3, fits=fits,
                      fits_reason="24.1 of 105.3 GB", weights=weights, source="shipped",
                      source_path=f"recipes/{name}.yaml", overrides=None, tags=tags, description=f"{model} demo")


DEFAULT_ITEMS = (
    LibraryItem(library_row("qwen3.5-35b-a3b", tags=("flagship",)), "metrale/metrale-inference-gb10:latest", True),
    LibraryItem(library_row("qwen3.6-35b-a3b-fp8", model="Qwen3.6-35B-A3B", quant="fp8", mtp=False, tok_s=90.0,
                            weights="absent"), "metrale/metrale-inference-gb10:latest", True),
    LibraryItem(library_row("gemma-4-31b", model="Gemma-4-31B", mtp=False, tok_s=9.0, fits=None, weights="partial"),
                "metrale/metrale-inference-gb10:latest", True),
    LibraryItem(library_row("qwen3.5-35b-a3b-hopper", hardware="hopper", tok_s=None, fits=False,
                            weights="absent"), "metrale/metrale-inference-hopper:latest", False),
)


def gpu_row(index: int = 0, *, util: int | None = 40, power: float | None = 61.0, temp: int | None = 62,
            used_gb: float = 30.0, unified: bool = True) -> GpuRow:
    lines = ThermalLines(80.0, 70.0)
    memory = (MemoryState("unified", int(119.7e9), int(used_gb * 1e9), int((119.7 - used_gb) * 1e9), int(24e9))
              if unified else MemoryState("discrete", int(141e9), int(used_gb * 1e9), int((141 - used_gb) * 1e9), None))
    return GpuRow(index=index, uuid=f"GPU-{index}", name="NVIDIA GB10" if unified else "NVIDIA H200",
                  hw_class="gb10" if unified else "hopper", util_gpu_pct=util, util_mem_pct=None, power_w=power,
                  power_source="instant", power_limit_w=100.0, energy_mj=1_000_000,
                  energy=EnergyRate(power, "counter", 5.0), energy_scope="gpu-only" if unified else "gpu",
                  temp_gpu_c=temp, temp_mem_c=None,
                  thermal=ThermalStatus("ok", float(temp) if temp is not None else None, False, "ok"),
                  lines=lines, clock_reasons=(), throttled=False, sm_clock_mhz=2400, mem_clock_mhz=None,
                  memory=memory, processes=1)


def engine_row(tok_s: float = 118.0, active: float = 3.0, ttft_s: float = 0.042) -> EngineRow:
    from metralectl.telemetry.engine_metrics import EngineRates

    snap = EngineSnapshot(t=1.0, requests_active=active, requests_total=100.0, prompt_tokens_total=1e4,
                          generation_tokens_total=2e4, decoded_tokens_total=None, ttft=None,
                          prefix_cache_hits_total=None, prefix_cache_misses_total=None, prefix_cache_hit_rate_gauge=None)
    rates = EngineRates(dt_s=5.0, requests_per_s=1.0, prompt_tokens_per_s=100.0, generation_tokens_per_s=tok_s,
                        decoded_tokens_per_s=None, tool_calls_per_s=None, ttft_p50_s=ttft_s, ttft_p95_s=ttft_s * 2,
                        prefix_cache_hit_rate=None, spec_acceptance=None, reset=False)
    return EngineRow(EngineTarget("http://127.0.0.1:8888", "metralectl-qwen3.5-35b-a3b", "qwen3.5-35b-a3b",
                                  "container"), "ok", None, snap, rates)


def top_view(i: int = 0, *, gpu: bool = True) -> TopView:
    wave = [20, 45, 70, 90, 85, 60, 35, 25]
    if not gpu:
        return TopView(FIXED_NOW, None, 1.0, GpuUnavailable("no NVIDIA driver (test)"), (), (), "no engine")
    g = gpu_row(util=wave[i % 8], power=30.0 + wave[i % 8] * 0.6, temp=55 + wave[i % 8] // 5, used_gb=30.0 + i % 3)
    return TopView(FIXED_NOW + i, float(i), 1.0, GpuSystem("580.65", "13.0", ()), (g,),
                   (engine_row(tok_s=100.0 + wave[i % 8], active=float(i % 5)),), None)


class FakeFeed:
    def __init__(self, views: list[TopView], interval_s: float = 0.05) -> None:
        self.views = views
        self.interval_s = interval_s
        self.i = 0
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def view(self) -> TopView:
        v = self.views[min(self.i, len(self.views) - 1)]
        self.i += 1
        return v

    def close(self) -> None:
        self.closed = True


SUITES = [
    SuiteInfo("decode", "Single-request decode", "the tok/s headline", (
        ParamSpec("max_tokens", "int", 128, "tokens to generate", minimum=1, maximum=4096),
        ParamSpec("prompt", "str", "What is the capital of France?", "the prompt"))),
    SuiteInfo("sweep", "Concurrency sweep", "p50 tok/s and p95 TTFT per rung", (
        ParamSpec("concurrencies", "int-list", [1, 2, 4], "parallel streams per rung"),
        ParamSpec("osl", "int", 64, "output tokens", minimum=1))),
]


def _run(run_id: str, suite: str, source: str, headline: str, started: float) -> RunSummary:
    return RunSummary(run_id, suite, started, source, "qwen3.5-35b-a3b", "ok", headline, f"/runs/{suite}/{run_id}")


@dataclass
class FakeBench:
    runs: list[RunSummary] = field(default_factory=lambda: [
        _run("r2", "sweep", "cli", "820 tok/s @ c=16", FIXED_NOW - 3600),
        _run("r1", "decode", "tui", "131.0 tok/s", FIXED_NOW - 7200),
    ])
    unavailable: str | None = None
    hold: threading.Event | None = None
    ran: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    outcome: str = "ok"  # what the next run's summary says (the core says "failed (errors)" and the like)

    def suites(self) -> list[SuiteInfo]:
        return [] if self.unavailable else list(SUITES)

    def check_params(self, suite: str, values: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        spec = next(s for s in SUITES if s.id == suite)
        params: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for p in spec.params:
            raw = values.get(p.name, "")
            try:
                if p.kind == "int":
                    value: Any = int(raw)
                    if p.minimum is not None and value < p.minimum:
                        raise ValueError(f"must be ≥ {p.minimum:g}")
                elif p.kind == "int-list":
                    value = [int(x) for x in raw.split(",")]
                else:
                    value = raw
            except ValueError as exc:
                errors[p.name] = str(exc) if "must" in str(exc) else f"{raw!r} is not {p.kind}"
                continue
            params[p.name] = value
        return params, errors

    def run(self, suite: str, params: dict[str, Any], on_event: Callable[[BenchProgress], None],
            cancel: CancelToken) -> RunSummary:
        self.ran.append((suite, params))
        for i in range(5):
            on_event(BenchProgress(i, 5, f"request {i + 1}/5"))
            if self.hold is not None:
                while not self.hold.wait(0.01):
                    on_event(BenchProgress(i, 5, "waiting"))
        run = _run(f"r{len(self.runs) + 1}", suite, "tui", "133.0 tok/s", FIXED_NOW)
        run = RunSummary(run.run_id, run.suite, run.started, run.source, run.target, self.outcome, run.headline, run.path)
        self.runs.insert(0, run)
        return run

    def history(self, limit: int = 200) -> list[RunSummary]:
        return self.runs[:limit]

    def detail(self, run: RunSummary) -> RunDetail:
        return RunDetail(run, {"max_tokens": 128 if run.suite == "decode" else 64, "suite": run.suite},
                         ("concurrency", "tok_s", "ttft_p95_ms"), (("1", "131", "42"), ("2", "230", "48")))


@dataclass
class FakeServices:
    items: tuple[LibraryItem, ...] = DEFAULT_ITEMS
    served: list[str] = field(default_factory=list)
    views: list[TopView] = field(default_factory=lambda: [top_view(i) for i in range(40)])
    log_lines: list[str] = field(default_factory=lambda: [f"engine line {i}" for i in range(5)])
    log_rate: float | None = None  # lines per second, forever (benchmark); None: log_lines then wait
    feed_interval_s: float = 0.05  # the real feed ticks at 1 s; tests want charts quickly
    checks: list[CheckResult] = field(default_factory=lambda: [
        CheckResult("docker", "Docker daemon", "ok", "Docker 28.2 answers on unix:///var/run/docker.sock"),
        CheckResult("gpu", "GPU driver", "problem", "no NVIDIA driver", "install the NVIDIA driver (580 or newer)"),
        CheckResult("port", "Port 8888", "warn", "in use by python3 (pid 42)", "free it or `--set resources.port=N`"),
    ])
    fail: dict[str, MetralError] = field(default_factory=dict)  # method name -> error to raise
    hold: threading.Event | None = None  # perform() emits log lines until this is set (or cancelled)
    bench: FakeBench = field(default_factory=FakeBench)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    cleaned_up: list[str] = field(default_factory=list)
    feeds: list[FakeFeed] = field(default_factory=list)
    follow_stops: list[threading.Event] = field(default_factory=list)

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise self.fail[name]

    def now(self) -> float:
        return FIXED_NOW

    def library(self) -> LibrarySnapshot:
        self.calls.append(("library",))
        self._maybe_fail("library")
        items = tuple(replace(i, serving=i.row.name in self.served) for i in self.items)
        return LibrarySnapshot(items, "fit judged on: gb10 (detected NVIDIA GB10)")

    def detail(self, name: str) -> str:
        self._maybe_fail("detail")
        return (f"{name} — demo\n\nProvenance\n  file          recipes/{name}.yaml (shipped)\n\n"
                f"Memory estimate (on gb10)\n  weights     20.00 GB\n  KV pool      3.10 GB\n  total       24.10 GB\n\n"
                f"Command\ndocker run -d --name metralectl-{name} metrale/metrale-inference-gb10:latest serve")

    def plan(self, action: Action, name: str | None) -> Plan:
        self.calls.append(("plan", action, name))
        self._maybe_fail("plan")
        if action == "run" and self.served:
            return Plan("run", name, f"Run {name}", (), blocked=f"a model is already served: {self.served[0]}",
                        hint="press w to swap")
        if action == "stop":
            if not self.served:
                return Plan("stop", name, "Stop", (), blocked="nothing is being served by metralectl")
            return Plan("stop", self.served[0], f"Stop {self.served[0]}", ("SIGTERM", "remove"), cancellable=False)
        return Plan(action, name, f"{action.capitalize()} {name}", ("check image", f"start metralectl-{name}"),
                    command=f"docker run -d --name metralectl-{name} IMAGE serve")

    def perform(self, action: Action, name: str | None, on_event: Callable[[Any], None],
                cancel: CancelToken) -> Outcome:
        self.calls.append(("perform", action, name))
        try:
            self._maybe_fail("perform")
            if action == "stop":
                on_event(ev.Step("stopping", f"metralectl-{name}"))
                self.served = [s for s in self.served if s != name]
                return Outcome("stop", name, "done", f"stopped metralectl-{name}")
            if action == "pull":
                from metralectl.seams.hf.steps import PullEvent

                for done in (0, 50, 100):
                    on_event(PullEvent(f"Org/{name}", "download", done, 100, 10.0, 1.0, 0, 2))
                on_event(PullEvent(f"Org/{name}", "done", 100, 100, files_done=2, files_total=2))
                return Outcome("pull", name, "done", f"{name}: weights complete")
            on_event(ev.Step("image", "metrale/metrale-inference-gb10:latest"))
            on_event(ev.ContainerStarted(f"metralectl-{name}", "abc123", "run-1"))
            on_event(ev.Phase("loading", "loading Org/model", 0.1))
            for i in range(30):
                on_event(ev.LogLine(f"loading tensor {i}"))
            if self.hold is not None:
                while not self.hold.wait(0.01):
                    on_event(ev.LogLine("still loading"))
            on_event(ev.Phase("ready", "Listening on 127.0.0.1:8888", 1.5))
            on_event(ev.Ready("http://127.0.0.1:8888", "Org/model", 1.6))
            if action == "swap":
                self.served = [name or "?"]
                return Outcome("swap", name, "done", f"swapped → {name}: downtime 2.0 s")
            self.served.append(name or "?")
            return Outcome("run", name, "done", f"{name} serves on http://127.0.0.1:8888/v1")
        except BaseException:
            self.cleaned_up.append(f"{action} {name}")  # what launch() does: remove the half-started container
            raise

    def status(self) -> StatusReport:
        self.calls.append(("status",))
        self._maybe_fail("status")
        serving = [Serving(recipe=n, name=f"metralectl-{n}", owner="root", state="running", health="ok",
                           uptime="12m", uptime_s=720.0, endpoint="http://127.0.0.1:8888", run_id="run-1",
                           image="metrale/metrale-inference-gb10:latest", image_revision="0123456789abcdef")
                   for n in self.served]
        return StatusReport(serving, None, "qwen3.5-35b-a3b → gemma-4-31b: swapped, downtime 41.0 s (drain 0.0 s, "
                                           "stop 3.1 s, boot 37.9 s)" if self.served else None)

    def follow_logs(self, container: str, stop: threading.Event) -> Iterator[str]:
        self.follow_stops.append(stop)
        self._maybe_fail("follow_logs")
        if self.log_rate is None:
            yield from self.log_lines
            stop.wait()
            return
        period = 0.01
        per_tick = max(1, int(self.log_rate * period))
        n = 0
        next_t = time.monotonic()
        while not stop.is_set():
            for _ in range(per_tick):
                n += 1
                yield f"{n:08d} INFO request done: 128 tokens in 0.97 s (131.9 tok/s) ttft 41 ms"
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                stop.wait(delay)

    def telemetry(self) -> FakeFeed:
        self._maybe_fail("telemetry")
        feed = FakeFeed(self.views, self.feed_interval_s)
        self.feeds.append(feed)
        return feed

    def doctor(self) -> list[CheckResult]:
        self.calls.append(("doctor",))
        self._maybe_fail("doctor")
        return list(self.checks)


def several_view(i: int = 0) -> TopView:
    """Two engines side by side (the second a llama-server on its own port) and two gateways: one serving (its
    numbers from its /metrics), one whose process is gone (its record stale)."""
    from metralectl.telemetry.gateway_view import GatewayModel, GatewayRow

    first = replace(engine_row(), model="qwen3.5-35b-a3b")
    second = replace(engine_row(tok_s=64.5, active=1.0, ttft_s=0.018),
                     target=EngineTarget("http://127.0.0.1:8890", "metralectl-gemma-4-e4b", "gemma-4-e4b", "container",
                                         "llama-cpp"), model="gemma-4-e4b-q8")
    serving = GatewayRow("http://127.0.0.1:8090", 4242, 1, "2026-12-04T05:00:00Z", "serving", models_served=2,
                         models=(GatewayModel("gemma-4-e4b", routed=True, requests=7, loads=1),
                                 GatewayModel("qwen3.5-35b-a3b", routed=True, requests=12, errors=1, in_flight=2),
                                 GatewayModel("qwen3-8b", loading=True, queue_depth=3, evictions=1)),
                         loads={"loaded": 1}, errors_by_reason={"upstream": 1})
    gone = GatewayRow("http://127.0.0.1:8091", 4343, 0, None, "gone", error="its process is gone")
    base = top_view(i)
    return replace(base, engines=(first, second), gateways=(serving, gone))
