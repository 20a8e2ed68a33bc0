"""`top`: a live view of the GPUs, the served engines (a row each) and this box's gateways. The numbers come from
metralectl.telemetry (watch: sampler + engine poller; view: the pure model); this module only renders.
rich is imported inside the command, so other commands never load it.

Names and messages come from NVML, container labels and engines: every one is escaped (safetext.clean) and
handed to Rich as a Text, never as a string Rich would read as markup.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer

from metralectl.cli.state import note
from metralectl.wording import count

if TYPE_CHECKING:
    from metralectl.telemetry.engine_view import EngineRow
    from metralectl.telemetry.gateway_view import GatewayRow
    from metralectl.telemetry.view import GpuRow, TopView

GiB = 1024**3
REFRESH_HZ = 4.0  # the display; the sampler runs at 10 Hz on its own thread
GPU_COLUMNS = ("GPU", "UTIL", "POWER", "ENERGY", "TEMP GPU/MEM", "THERMAL", "THROTTLE", "CLOCKS SM/MEM",
               "MEMORY")
WRAPPING = {"MEMORY", "THROTTLE", "URL"}  # these wrap in a narrow terminal; the others keep their width
ENGINE_COLUMNS = ("RECIPE", "ENGINE", "MODEL", "PORT", "STATE", "TOK/S", "ACTIVE", "TTFT p50/p95", "PREFIX HIT",
                  "SPEC ACC", "REQUESTS", "URL")
GATEWAY_COLUMNS = ("GATEWAY", "PID", "STATE", "ROUTED", "LOADING", "QUEUE", "LOADS", "EVICTIONS", "REQUESTS",
                   "ERRORS")
WRAPPING = WRAPPING | {"MODEL", "ROUTED", "LOADING"}
BENIGN_REASONS = ("gpu_idle", "applications_clocks", "display_clocks")  # shown only in --json
METHOD_MARK = {"counter": "", "instant-integral": " ∫", "average-integral": " ∫avg"}


def top(
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit (rates over --interval)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="JSON on stdout: one document with --once, else a line per interval."),
    record: Path = typer.Option(None, "--record", metavar="FILE",
                                help="Append one JSON object per interval to FILE (JSONL)."),
    interval: float = typer.Option(1.0, "--interval", min=0.1, max=3600.0,
                                   help="Seconds between engine scrapes and records."),
    url: list[str] = typer.Option(None, "--url", metavar="URL",
                                  help="Watch this engine (repeatable), not the ones metralectl serves."),
) -> None:
    """Live view of the GPUs, the served engines and the gateways: util, power, energy rate, thermal, memory, tok/s,
    TTFT."""
    from metralectl.errors import UsageError

    live = not once and not as_json
    terminal = sys.stdout if sys.stdout.isatty() else (sys.stderr if sys.stderr.isatty() else None)
    if live and terminal is None and record is None:
        raise UsageError("`metralectl top` needs a terminal for its live view",
                         "for scripts: `metralectl top --once --json`, or `--json` (one line per interval), "
                         "or `--record FILE`")
    recorder = _recorder(record)
    session = _session(interval, url or [])
    from metralectl.seams.process import sigterm_as_interrupt

    with sigterm_as_interrupt():  # SIGTERM leaves like Ctrl-C: the recording is closed and counted
        try:
            if once:
                session.start(poll_thread=False)
                view = _once(session, interval)
                if recorder is not None:
                    recorder.write(view.to_json())
                if as_json:
                    print(json.dumps(view.to_json(), indent=2, allow_nan=False))
                else:
                    from rich.console import Console

                    wide = None if sys.stdout.isatty() else 240  # piped: no wrapping or cropping at 80 columns
                    Console(file=sys.stdout, highlight=False, width=wide,
                            color_system=_colors(sys.stdout)).print(render(view, recording=record))
                return
            session.start()
            if live and terminal is not None:
                _live(session, terminal, recorder, interval, record)
            else:
                _stream(session, recorder, interval, as_json, record)
        except KeyboardInterrupt:
            if once:
                raise  # a snapshot cut short is interrupted (130), not a result
            # Ctrl-C (or SIGTERM) is how one leaves the live view or a recording: not an error
        except BrokenPipeError:
            # `top --json | head -3`: the reader left, which ends a stream normally
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        finally:
            session.close()
            if recorder is not None and not once:
                note(f"recorded {count(recorder.records, 'record')} to {record}")


def _recorder(path: Path | None) -> Any:
    if path is None:
        return None
    from metralectl.errors import UsageError
    from metralectl.telemetry.watch import Recorder

    try:
        return Recorder(path)
    except OSError as exc:
        raise UsageError(f"cannot record to {path}: {exc.strerror or exc}") from None


def _session(interval: float, urls: list[str]) -> Any:
    from metralectl.errors import MetralError
    from metralectl.seams.gpu import NvmlProbe
    from metralectl.core.gpudata import DEFAULT_GPU_CLASSES, DEFAULT_UNIFIED_CLASSES
    from metralectl.telemetry.view import thermal_lines_from
    from metralectl.telemetry.watch import EngineDiscovery, TopSession, fixed_targets

    classes, unified, lines, notes = DEFAULT_GPU_CLASSES, DEFAULT_UNIFIED_CLASSES, {}, []
    try:
        from metralectl.core.catalog import load_catalog

        catalog = load_catalog()
        # the catalog's gpu-names first (they are the product's data), the built-in patterns after
        classes = tuple((n, hw.id) for hw in catalog.hardware.values() for n in hw.gpu_names) + classes
        unified = frozenset(hw.id for hw in catalog.hardware.values() if hw.unified_memory)
        lines = thermal_lines_from(catalog.hardware)
    except MetralError as exc:
        notes.append(f"no thermal lines: the catalog did not load ({exc.message})")
    probe = NvmlProbe(gpu_classes=classes, unified_classes=unified)
    from metralectl.app.chat import served_labels  # an engine of this box named by its URL gets its token too

    discover = fixed_targets(urls, served_labels) if urls else EngineDiscovery()  # one Docker connection for all of top
    from metralectl.gateway.watch import observe

    gateways = None if urls else observe  # --url watches those engines only
    return TopSession(probe, discover, lines, interval_s=interval, notes=notes, gateways=gateways)


def _once(session: Any, interval: float) -> TopView:
    session.poller.poll_once()  # discovery + the first /metrics snapshot
    time.sleep(interval)
    session.poller.poll_once()  # the second: token rates over the interval
    session.wait_for_energy(2, timeout_s=max(3.0, interval + 2.0))
    view: TopView = session.view()
    return view


def _live(session: Any, terminal: Any, recorder: Any, interval: float, record: Path | None) -> None:
    from rich.console import Console
    from rich.live import Live

    console = Console(file=terminal, highlight=False, color_system=_colors(terminal))
    next_record = time.monotonic() + interval
    view = session.view()
    with Live(render(view, recording=record, live=True), console=console, auto_refresh=False, transient=False,
              screen=False, redirect_stdout=False, redirect_stderr=False) as display:
        while True:
            time.sleep(1.0 / REFRESH_HZ)
            view = session.view()
            display.update(render(view, recording=record, live=True), refresh=True)
            if recorder is not None and time.monotonic() >= next_record:
                recorder.write(view.to_json())
                next_record += interval


def _colors(stream: Any) -> Literal["auto"] | None:
    """Rich's colour system under our colour rules (NO_COLOR: no style at all, not even bold; FORCE_COLOR)."""
    from metralectl.cli.state import color_enabled

    return "auto" if color_enabled(stream) else None


def _stream(session: Any, recorder: Any, interval: float, as_json: bool, record: Path | None) -> None:
    """No live display: JSON lines on stdout (--json) and/or records, one per interval."""
    if not as_json:
        note(f"recording to {record} every {interval:g} s; Ctrl-C to stop")
    next_t = time.monotonic() + interval
    while True:
        time.sleep(max(0.0, next_t - time.monotonic()))
        next_t += interval
        data = session.view().to_json()
        if recorder is not None:
            recorder.write(data)
        if as_json:
            print(json.dumps(data, allow_nan=False), flush=True)


# -- rendering ------------------------------------------------------------------------------------
def render(view: TopView, *, recording: Path | None = None, live: bool = False) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from metralectl.core.gpudata import GpuSystem
    from metralectl.safetext import clean

    def cell(value: Any) -> Any:
        return Text(clean(value)) if isinstance(value, str) else value

    parts: list[Any] = [Text(clean(_header(view)), style="bold")]
    if isinstance(view.gpu, GpuSystem):
        table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
        for col in GPU_COLUMNS:
            table.add_column(col, no_wrap=col not in WRAPPING)
        for g in view.gpus:
            table.add_row(*map(cell, _gpu_cells(g)))
        parts.append(table)
        if not view.gpus:
            parts.append(Text("waiting for the first GPU sample…", style="dim"))
        for g in view.gpus:
            if g.thermal is not None and g.thermal.state != "ok":
                parts.append(Text(clean(f"GPU {g.index} {g.thermal.state}: {g.thermal.reason}"),
                                  style="bold red" if g.thermal.state == "parked" else "yellow"))
    else:
        parts.append(Text(f"no GPU: {clean(view.gpu.reason)}", style="yellow"))
        if view.gpu.hint:
            parts.append(Text(f"    hint: {clean(view.gpu.hint)}", style="dim"))
    parts.append(Text(""))
    if view.engines:
        table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
        for col in ENGINE_COLUMNS:
            table.add_column(col, no_wrap=col not in WRAPPING)
        for e in view.engines:
            table.add_row(*map(cell, _engine_cells(e)))
        parts.append(table)
        for e in view.engines:
            if e.error:
                parts.append(Text(clean(f"{_engine_name(e)}: {e.error}"), style="yellow"))
    else:
        parts.append(Text(clean(view.engine_note or "no engine"), style="dim"))
    if view.gateways:
        parts.append(Text(""))
        table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
        for col in GATEWAY_COLUMNS:
            table.add_column(col, no_wrap=col not in WRAPPING)
        for gw in view.gateways:
            table.add_row(*map(cell, _gateway_cells(gw)))
        parts.append(table)
        for gw in view.gateways:
            if gw.error:
                parts.append(Text(clean(f"gateway {gw.url} (pid {gw.pid}): {gw.error}"),
                                  style="dim" if gw.state == "gone" else "yellow"))
    for line in view.notes:
        parts.append(Text(clean(line), style="dim"))
    footer = [f"rates over the last {_rate_window(view):g} s"] if view.gpus or view.engines else []
    if recording is not None:
        footer.append(clean(f"recording to {recording}"))
    if live:
        footer.append("Ctrl-C to quit")
    if footer:
        parts.append(Text(" · ".join(footer), style="dim"))
    return Group(*parts)


def _header(view: TopView) -> str:
    from metralectl.core.gpudata import GpuSystem

    stamp = time.strftime("%H:%M:%S", time.localtime(view.wall))
    bits = [f"metralectl top  {stamp}"]
    if isinstance(view.gpu, GpuSystem):
        bits.append(f"driver {view.gpu.driver_version or '?'}, CUDA {view.gpu.cuda_driver_version or '?'}")
        if view.gpus:
            bits.append(f"node thermal: {view.thermal}")
    st = view.sampler
    if st is not None and st.cpu_pct is not None:
        bits.append(f"sampler {st.hz:g} Hz, {st.cpu_pct:.2f} % CPU")
    return "  ·  ".join(bits)


def _rate_window(view: TopView) -> float:
    from metralectl.telemetry.view import RATE_WINDOW_S

    spans = [g.energy.span_s for g in view.gpus if g.energy.span_s] + \
            [e.rates.dt_s for e in view.engines if e.rates is not None]
    return round(max(spans), 1) if spans else RATE_WINDOW_S


def _gpu_cells(g: GpuRow) -> list[Any]:
    from rich.text import Text

    from metralectl.safetext import clean

    name = f"{g.index} {(g.name or '?').removeprefix('NVIDIA ')}"
    util = _num(g.util_gpu_pct, "%")
    power = _num(g.power_w, "W", 1)
    if g.power_w is not None:
        power += " inst" if g.power_source == "instant" else " avg"  # avg: the driver's ~1 s average
        if g.power_limit_w:
            power += f"/{g.power_limit_w:.0f}"
    energy = _num(g.energy.watts, "W", 1)
    if g.energy.watts is not None:
        energy += METHOD_MARK.get(g.energy.method or "", "")
    temp = f"{_num(g.temp_gpu_c)}/{_num(g.temp_mem_c)} °C"
    clocks = f"{_num(g.sm_clock_mhz)}/{_num(g.mem_clock_mhz)} MHz"
    if g.clock_reasons is None:
        throttle = Text("?", style="dim")
    else:
        slow = [r for r in g.clock_reasons if r not in BENIGN_REASONS]
        throttle = Text(clean(", ".join(slow)) or "-", style="yellow" if slow else "")
    return [name, util, power, energy, temp, _thermal_cell(g), throttle, clocks, _memory_cell(g)]


def _thermal_cell(g: GpuRow) -> Any:
    """State and the class's lines (park ≥ first, resume ≤ second); the reason goes below the table."""
    from rich.text import Text

    if g.thermal is None or g.lines is None:
        return Text("no lines", style="dim")
    lines = f"{g.lines.park_c:g}/{g.lines.resume_c:g}"
    style = {"parked": "bold red", "unknown": "yellow"}.get(g.thermal.state, "green")
    word = "PARKED" if g.thermal.state == "parked" else g.thermal.state
    return Text(f"{word} {lines}", style=style)


def _memory_cell(g: GpuRow) -> str:
    m = g.memory
    used, total = _gib(m.used_bytes), _gib(m.total_bytes)
    if m.kind == "unified":
        avail, resident = _gib(m.available_bytes), _gib(m.gpu_resident_bytes)
        return f"unified {used}/{total} GiB, {avail} avail, GPU {resident}"
    pct = ""
    if m.used_bytes is not None and m.total_bytes:
        pct = f" ({100 * m.used_bytes / m.total_bytes:.0f} %)"
    return f"{used}/{total} GiB{pct}"


def _engine_name(e: EngineRow) -> str:
    return e.target.recipe or e.target.name or "(--url)"


def _gateway_cells(g: GatewayRow) -> list[Any]:
    from rich.text import Text

    from metralectl.safetext import clean

    state = Text(clean(g.state), style={"serving": "green", "gone": "dim"}.get(g.state, "yellow"))
    if not g.serving:  # gone (its process is not there) or unreadable: no number is shown as if it were current
        return [g.url, str(g.pid), state, "-", "-", "-", "-", "-", "-", "-"]
    loads = g.loads or {}
    load_words = f"{loads.get('loaded', 0)}" + "".join(f", {loads[k]} {k}" for k in ("failed", "refused")
                                                        if loads.get(k))
    return [g.url, str(g.pid), state, ", ".join(g.names("routed")) or "-", ", ".join(g.names("loading")) or "-",
            _num(g.total("queue_depth")), load_words, _num(g.total("evictions")), _num(g.total("requests")),
            _num(g.total("errors"))]


def _engine_cells(e: EngineRow) -> list[Any]:
    from rich.text import Text

    from metralectl.safetext import clean

    s = e.snapshot
    state = Text(clean(e.state), style="green" if e.state == "ok" else "red")
    ttft = f"{_ms(e.ttft_p50_s)}/{_ms(e.ttft_p95_s)}" + (" (all)" if e.ttft_scope == "lifetime" else "")
    requests = _num(s.requests_total if s else None)
    active = _num(s.requests_active if s else None)
    port = str(e.target.port) if e.target.port is not None else "?"
    return [_engine_name(e), e.engine or "?", e.model or "?", port, state, _num(e.tokens_per_s, digits=1), active,
            ttft,
            _pct(e.prefix_cache_hit_rate), _pct(e.spec_acceptance), requests, e.target.url]


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "?"
    text = f"{value:.{digits}f}"
    return f"{text} {unit}" if unit else text


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / GiB:.1f}"


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.0f} ms"


def _pct(ratio: float | None) -> str:
    return "?" if ratio is None else f"{100 * ratio:.0f} %"


def register(app: typer.Typer) -> None:
    app.command("top")(top)
