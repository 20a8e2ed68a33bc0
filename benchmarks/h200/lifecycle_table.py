"""The lifecycle run's markdown tables, from one summary or several (cells then read `run 1 / run 2`):

    python3 benchmarks/h200/lifecycle_table.py SUMMARY.json [SUMMARY2.json ...]

summarize_lifecycle.py --md writes one run's; docs/h200.md holds the two device runs' side by side."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _cell(runs: list[dict[str, Any]], get: Callable[[dict[str, Any]], Any], digits: int = 2) -> str:
    """One value per run, `a / b`; a value a run lacks is `–`."""
    return " / ".join(_fmt(_safe(get, r), digits) for r in runs)


def _safe(get: Callable[[dict[str, Any]], Any], r: dict[str, Any]) -> Any:
    try:
        return get(r)
    except (KeyError, IndexError, TypeError, StopIteration):
        return None


Getter = Callable[[dict[str, Any]], Any]


def pick(collection: str, step: str, *keys: str) -> Getter:
    """A cell's value in one run: the item of `collection` (boots, swaps, benches) for `step`, then `keys`."""
    def get(run: dict[str, Any]) -> Any:
        value: Any = next(i for i in run[collection] if i["step"] == step)
        for key in keys:
            value = value[key]
        return value
    return get


def nothing(run: dict[str, Any]) -> Any:
    return None


def table(summaries: dict[str, Any] | list[dict[str, Any]]) -> str:
    runs = summaries if isinstance(summaries, list) else [summaries]
    first = runs[0]
    labels = " / ".join(r.get("label") or f"run {i + 1}" for i, r in enumerate(runs))
    lines = [f"Cells: {labels}. Seconds unless marked; GPU memory from NVML (MiB).", ""]
    lines += ["| boot | recipe | to first /health 200 | ready (metralectl) | start | load | ready "
              "| load (engine's clock) | GPU MiB held |", "|---|---|---|---|---|---|---|---|---|"]
    for b in first["boots"]:
        step = b["step"]
        what = {"run-a": "`run`", "swap-b": "`swap` to B", "swap-damaged": "rollback: B again"}.get(step, step)
        cells = [_cell(runs, pick("boots", step, k)) for k in ("first_200_s", "ready_s", "phase_start_s",
                                                               "phase_load_s", "phase_ready_s", "engine_load_s")]
        cells.append(_cell(runs, pick("boots", step, "gpu_mib_model"), 0))
        lines.append(f"| {what} | {b['recipe']} | " + " | ".join(cells) + " |")
    lines += ["", "| swap | outcome | exit | downtime | drain | stop | start | load | ready | failed boot | restore |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in first["swaps"]:
        step = w["step"]
        head = [pick("swaps", step, k) for k in ("outcome", "rc", "downtime_s", "drain_s", "stop_s")]
        if w.get("outcome") == "swapped":
            getters = head + [pick("swaps", step, k) for k in ("phase_start_s", "phase_load_s", "phase_ready_s")]
            getters += [nothing, nothing]
            lines.append(f"| {w['from']} → {w['to']} | " + " | ".join(_cell(runs, g) for g in getters) + " |")
            continue
        getters = head + [nothing, nothing, nothing, pick("swaps", step, "boot_s"), pick("swaps", step, "restore_s")]
        lines.append(f"| {w['from']} → {w['to']} | " + " | ".join(_cell(runs, g) for g in getters) + " |")
        lines.append(f"| ↳ restore of {w['from']} | | | | | | " + " | ".join(
            _cell(runs, pick("swaps", step, "restore_split", k))
            for k in ("phase_start_s", "phase_load_s", "phase_ready_s")) + " | | |")
    lines += ["", "| benchmark (`bench run decode`) | requests ok | failed | decode tok/s p50 | TTFT p50 ms |",
              "|---|---|---|---|---|"]
    for bench in first["benches"]:
        step = bench["step"]
        lines.append(f"| {step} | " + " | ".join(_cell(runs, pick("benches", step, k), 1)
                                                 for k in ("ok", "failed", "decode_tok_s_p50", "ttft_ms_p50")) + " |")
    mem: list[tuple[str, Getter]] = [
        ("idle (before `run`)", lambda r: r["gpu"]["idle_mib"]),
        ("before `stop`", lambda r: r["memory_after_stop"]["before_stop_mib"]),
        ("back at idle, s after `stop` began", lambda r: r["memory_after_stop"]["back_s_after_stop_began"]),
        ("back at idle, s after `stop` returned", lambda r: r["memory_after_stop"]["back_s_after_stop_returned"]),
        ("level at the end", lambda r: r["memory_after_stop"]["level_at_end_mib"])]
    lines += ["", "| GPU memory | value |", "|---|---|"]
    lines += [f"| {what} | {_cell(runs, get, 1)} |" for what, get in mem]
    failed = [(r.get("label") or f"run {i + 1}", e) for i, r in enumerate(runs) for e in r["expectations"]
              if not e["passed"]]
    total = sum(len(r["expectations"]) for r in runs)
    lines += ["", f"Expectations: {total - len(failed)} of {total} held."]
    lines += [f"- FAILED ({label}): {e['name']}: {e['detail']}" for label, e in failed]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 0 if argv else 64
    sys.stdout.write(table([json.loads(Path(p).read_text()) for p in argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
