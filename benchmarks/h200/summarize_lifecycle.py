"""Turn one lifecycle run (lifecycle_gpu.py's results folder, or the tar the device run made of it) into the
numbers the issue asks for, and the expectations they must meet:

    python3 benchmarks/h200/summarize_lifecycle.py RUN.tar.gz|DIR [--out FILE.json] [--md FILE.md]
        [--label "run 1"] [--allow-no-gpu] [--idle-tolerance-mib 64] [--memory-back-s 5]

Per boot (run A, swap to B, the rollback's restore of B): time to ready (to the engine's first /health 200, and
what metralectl said after it), split into start (the runtime's start to the engine's "loading model" line),
load (to "model loaded") and ready (to the first 200, as metralectl's own boot phases record it), the engine's
own clock for the load, and the GPU memory it holds. Per swap: downtime and its phases (drain, stop, start,
load, ready; the rolled-back swap's failed boot and restore). Per benchmark: ok / failed requests, from the
request records themselves. After stop: how soon the GPU memory was back at its idle level. Every figure is
read from metralectl's --json output, its records under METRALE_HOME, the engine's log and the NVML samples;
nothing is estimated. check_lifecycle.py fails on any expectation that does not hold. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lifecycle_expect import expectations  # noqa: E402

LOGS_AFTER = {"run-a": "logs-a", "swap-b": "logs-b", "swap-damaged": "logs-b-after-rollback"}  # boot -> its log
EVENT = re.compile(r"▸ (?:r\d+ )?(?P<name>[a-z][\w-]*)\s")
ENGINE_CLOCK = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")


def load_run(path: Path, scratch: Path) -> Path:
    """The folder holding lifecycle.json: PATH itself, or found inside the tar once unpacked into scratch."""
    if path.is_file():
        with tarfile.open(path) as tar:
            tar.extractall(scratch, filter="data")
        path = scratch
    found = sorted(path.glob("lifecycle.json")) or sorted(path.glob("*/lifecycle.json"))
    if not found:
        raise SystemExit(f"summarize_lifecycle: no lifecycle.json in {path} (or one folder down)")
    return found[0].parent


def stamped_events(err_file: Path) -> list[tuple[float, str, str]]:
    """(wall time, event name, text) for each `▸ NAME` event on a step's stamped stderr, and the `!` warnings."""
    events = []
    for raw in err_file.read_text().splitlines():
        stamp, _, line = raw.partition("\t")
        try:
            t = float(stamp)
        except ValueError:
            continue
        for part in line.split("▸ ")[1:] if "▸ " in line else []:
            m = EVENT.match("▸ " + part)
            if m:
                events.append((t, m.group("name"), part))
        if line.startswith("! "):
            events.append((t, "warning", line[2:]))
    return events


def boot_split(events: list[tuple[float, str, str]], total_s: float | None,
               clock: dict[str, float | None] | None = None) -> dict[str, Any]:
    """start / load / ready of one boot from its events (starting → loading → loaded) and its total (metralectl's
    boot or restore phase): start + load + ready = total. `t_starting`: when the boot began (its clock starts
    just before the `▸ starting` event). When metralectl reported ready before it read the engine's log lines
    (a fast load: /health answered first), they come from the engine's own clock (`clock`, from its log) counted
    from its `▸ started` event, and `split_from` says so."""
    t: dict[str, float] = {}
    for when, name, _ in events:
        t.setdefault(name, when)
    start, load, split_from = _diff(t.get("loading"), t.get("starting")), _diff(t.get("loaded"), t.get("loading")), \
        "events"
    if (start is None or load is None) and clock and clock.get("loading") is not None:
        split_from = "engine-log"
        if start is None and t.get("started") is not None and t.get("starting") is not None:
            start = round(t["started"] - t["starting"] + (clock["loading"] or 0.0), 3)
        if load is None:
            load = _diff(clock.get("loaded"), clock.get("loading"))
    ready = None
    if total_s is not None and start is not None and load is not None:
        ready = round(total_s - start - load, 3)
    return {"phase_start_s": start, "phase_load_s": load, "phase_ready_s": ready,
            "split_from": split_from if start is not None or load is not None else None,
            "t_starting": t.get("starting")}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def segments(events: list[tuple[float, str, str]]) -> list[list[tuple[float, str, str]]]:
    """A swap's stderr cut at each `▸ starting`: [the new model's boot, the restore's boot (a rollback)]."""
    cuts = [i for i, e in enumerate(events) if e[1] == "starting"]
    return [events[i:j] for i, j in zip(cuts, cuts[1:] + [len(events)])]


def engine_clock(text: str) -> dict[str, float | None]:
    """The engine's own clock (its log's `M.SS.mmm.uuu` stamps since it started) at loading / loaded / listening."""
    marks = {"loading": "load_model: loading model", "loaded": "llama_server: model loaded",
             "listening": "listening on http"}
    found: dict[str, float | None] = dict.fromkeys(marks)
    for line in text.splitlines():
        m = ENGINE_CLOCK.match(line)
        if not m:
            continue
        for key, mark in marks.items():
            if found[key] is None and mark in line:
                minutes, secs, ms, us = (int(g) for g in m.groups())
                found[key] = round(minutes * 60 + secs + ms / 1e3 + us / 1e6, 6)
    return found


def jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def requests_of(run: Path, run_id: str | None) -> dict[str, Any]:
    found = sorted(run.glob(f"metrale/runs/*/{run_id}/requests.jsonl")) if run_id else []
    if not found:
        return {"measured": 0, "ok": 0, "failed": 0, "errors": ["no request records"]}
    rows = jsonl(found[0])
    measured = [r for r in rows if r.get("phase") == "measure"]  # warm-up requests are not measured
    failed = [r for r in measured if not r.get("ok")]
    return {"measured": len(measured), "ok": len(measured) - len(failed), "failed": len(failed),
            "warmup_failed": sum(1 for r in rows if r.get("phase") != "measure" and not r.get("ok")),
            "errors": sorted({str(r.get("error"))[:160] for r in failed})[:3]}


class Reader:
    """One run's records, and the boots, swaps and benchmarks read off them."""

    def __init__(self, run: Path) -> None:
        self.run = run
        self.life = json.loads((run / "lifecycle.json").read_text())
        self.steps = {step["name"]: step for step in self.life["steps"]}
        for step in self.life["steps"]:  # what the expectations read of metralectl's words, without the stamps
            err = run / "steps" / step["stderr"]
            lines = err.read_text().splitlines() if step["stderr"] and err.is_file() else []
            step["stderr_text"] = "\n".join(line.partition("\t")[2] for line in lines)
        self.runs = jsonl(run / "metrale" / "state" / "runs.jsonl")  # every boot metralectl recorded
        self.idle = self.life["gpu"].get("idle_mib")

    def boots_in(self, step: dict[str, Any], outcome: str) -> list[dict[str, Any]]:
        return [r for r in self.runs if step["t_start"] <= r.get("at", 0) <= step["t_end"] + 1
                and r.get("outcome") == outcome]

    def events(self, step: dict[str, Any]) -> list[list[tuple[float, str, str]]]:
        err = self.run / "steps" / step["stderr"]
        return segments(stamped_events(err)) if step["stderr"] and err.is_file() else []

    def clock(self, entry: dict[str, Any], step_name: str) -> dict[str, float | None]:
        """The boot's engine clock: from the log metralectl kept of the start (cut at ready), or, when that ends
        before `model loaded`, from the `logs` step that followed the boot."""
        kept = self.run / "metrale" / "logs" / f"{entry.get('run_id')}-{entry.get('recipe')}.log"
        clock = engine_clock(kept.read_text(errors="replace") if kept.is_file() else "")
        logs_step = self.steps.get(LOGS_AFTER.get(step_name, ""))
        if clock["loaded"] is None and logs_step is not None and logs_step.get("stdout"):
            clock = engine_clock((self.run / "steps" / logs_step["stdout"]).read_text(errors="replace"))
        return clock

    def boot(self, step_name: str, entry: dict[str, Any], split: dict[str, Any]) -> dict[str, Any]:
        step, clock = self.steps[step_name], self.clock(entry, step_name)
        after = step["gpu"]["after_mib"]
        return {"step": step_name, "recipe": entry.get("recipe"), "run_id": entry.get("run_id"),
                "ready_s": entry.get("ready_s"), "first_200_s": _diff(entry.get("ready_at"), split.get("t_starting")),
                **{k: v for k, v in split.items() if k != "t_starting"},
                "engine_load_s": _diff(clock["loaded"], clock["loading"]), "engine_loading_at_s": clock["loading"],
                "gpu_mib_after": after,
                "gpu_mib_model": None if after is None or self.idle is None else round(after - self.idle, 1),
                "gpu_processes_after": step["gpu"]["processes_after"]}

    def run_boot(self) -> dict[str, Any] | None:
        """`run A`: its phases are in its --json (relative to the boot's start)."""
        step = self.steps.get("run-a")
        if step is None:
            return None
        ready, doc = self.boots_in(step, "ready"), step.get("json")
        if not ready or not isinstance(doc, dict):
            return None
        ph, segs = doc.get("phases") or {}, self.events(step)
        total = doc.get("ready_s")
        split = boot_split([], None)
        split.update(phase_start_s=_r(ph.get("loading")), phase_load_s=_diff(ph.get("loaded"), ph.get("loading")),
                     split_from="events", t_starting=segs[0][0][0] if segs else None)
        if split["phase_load_s"] is None:  # ready before `model loaded` was read: the engine's own clock
            clock = self.clock(ready[-1], "run-a")
            split.update(phase_load_s=_diff(clock["loaded"], clock["loading"]), split_from="engine-log")
        if None not in (total, split["phase_start_s"], split["phase_load_s"]):
            split["phase_ready_s"] = round(total - split["phase_start_s"] - split["phase_load_s"], 3)
        return self.boot("run-a", ready[-1], split)

    def swap(self, name: str) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """A swap's record, and the boot that served after it (B, or B restored)."""
        step = self.steps.get(name)
        if step is None:
            return None
        result = step.get("json") if isinstance(step.get("json"), dict) else {}
        phases = result.get("phases") or {}
        segs = self.events(step)
        ready = self.boots_in(step, "ready")
        clock = self.clock(ready[-1], name) if ready else None
        new = boot_split(segs[0], phases.get("boot"), clock if result.get("outcome") == "swapped" else None) \
            if segs else boot_split([], None)
        failed = self.boots_in(step, "failed")
        swap = {"step": name, "rc": step["rc"], "from": result.get("from_recipe"), "to": result.get("to_recipe"),
                "outcome": result.get("outcome"), "downtime_s": _r(result.get("downtime_s")),
                "drain_s": _r(phases.get("drain")), "stop_s": _r(phases.get("stop")), "boot_s": _r(phases.get("boot")),
                **{k: v for k, v in new.items() if k != "t_starting"}, "restore_s": _r(phases.get("restore")),
                "message": result.get("message"), "failure_cause": failed[-1].get("cause") if failed else None}
        served = new
        if len(segs) > 1:  # a rollback: the restore's own boot
            served = boot_split(segs[1], phases.get("restore"), clock)
            swap["restore_split"] = {k: v for k, v in served.items() if k != "t_starting"}
        return swap, (self.boot(name, ready[-1], served) if ready else None)

    def benches(self) -> list[dict[str, Any]]:
        out = []
        for step in self.life["steps"]:
            if not step["name"].startswith("bench"):
                continue
            doc = step.get("json") if isinstance(step.get("json"), dict) else {}
            headline = (doc.get("summary") or {}).get("headline") or {}
            out.append({"step": step["name"], "rc": step["rc"], "status": doc.get("status"),
                        "run_id": doc.get("run_id"), **requests_of(self.run, doc.get("run_id")),
                        "decode_tok_s_p50": _r(headline.get("decode_tok_s_p50")),
                        "ttft_ms_p50": _r(headline.get("ttft_ms_p50"))})
        return out


def summarize(run: Path, *, idle_tolerance_mib: float = 64.0, memory_back_s: float = 5.0,
              allow_no_gpu: bool = False, label: str = "") -> dict[str, Any]:
    r = Reader(run)
    life, gpu = r.life, r.life["gpu"]
    boots = [b for b in [r.run_boot()] if b is not None]
    swaps = []
    for name in ("swap-b", "swap-damaged"):
        read = r.swap(name)
        if read is not None:
            swaps.append(read[0])
            boots += [read[1]] if read[1] is not None else []
    samples = _samples(run / "gpu-samples.csv")
    out = {
        "label": label, "url": life.get("url"), "names": life.get("names"), "models": life.get("models"),
        "gpu": {k: gpu.get(k) for k in ("present", "why_not", "name", "total_mib", "idle_mib", "interval_s")},
        "environment": _text(run / "environment.txt"), "build": _text(run / "build-info.txt"),
        "steps": [{"name": s["name"], "argv": " ".join(s["argv"]), "rc": s["rc"], "seconds": s["seconds"],
                   "gpu_before_mib": s["gpu"]["before_mib"], "gpu_after_mib": s["gpu"]["after_mib"],
                   "gpu_max_mib": s["gpu"]["max_mib"]} for s in life["steps"]],
        "boots": boots, "swaps": swaps, "benches": r.benches(),
        "memory_after_stop": _memory_after_stop(samples, r.steps.get("stop"), r.idle, idle_tolerance_mib),
        "leftovers": life.get("leftovers"), "samples": len(samples),
    }
    out["expectations"] = expectations(out, r.steps, idle_tolerance_mib=idle_tolerance_mib,
                                       memory_back_s=memory_back_s, allow_no_gpu=allow_no_gpu)
    out["passed"] = all(e["passed"] for e in out["expectations"])
    return out


def _r(v: Any) -> float | None:
    return round(float(v), 3) if isinstance(v, (int, float)) else None


def _text(path: Path) -> str | None:
    return path.read_text(errors="replace")[:4000] if path.is_file() else None


def _samples(path: Path) -> list[tuple[float, float]]:
    if not path.is_file():
        return []
    rows = path.read_text().splitlines()[1:]
    return [(float(t), float(m)) for t, m in (r.split(",") for r in rows if r)]


def _memory_after_stop(samples: list[tuple[float, float]], stop: dict[str, Any] | None, idle: float | None,
                       tolerance: float) -> dict[str, Any]:
    """When the GPU memory came back to the idle level (within `tolerance`) after stop, and stayed there."""
    if stop is None or idle is None or not samples:
        return {"checked": False, "why": "no GPU samples" if not samples else "no idle level or no stop step"}
    after = [(t, m) for t, m in samples if t >= stop["t_start"]]
    back_at = None
    for i, (t, m) in enumerate(after):
        if m <= idle + tolerance and all(mm <= idle + tolerance for _, mm in after[i:]):
            back_at = t
            break
    last = after[-1] if after else None
    return {"checked": True, "idle_mib": idle, "tolerance_mib": tolerance,
            "before_stop_mib": stop["gpu"]["before_mib"], "level_at_end_mib": last[1] if last else None,
            "sampled_until_s_after_stop": None if last is None else round(last[0] - stop["t_end"], 3),
            "back_s_after_stop_began": _diff(back_at, stop["t_start"]),
            "back_s_after_stop_returned": None if back_at is None else round(max(0.0, back_at - stop["t_end"]), 3)}


def markdown(s: dict[str, Any]) -> str:
    from lifecycle_table import table

    return table(s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the device run's tar.gz, or its results folder")
    ap.add_argument("--out", type=Path, help="write the summary JSON here (else stdout)")
    ap.add_argument("--md", type=Path, help="write the markdown table here")
    ap.add_argument("--label", default="")
    ap.add_argument("--allow-no-gpu", action="store_true", help="a CPU dry run: no NVML is not a failure")
    ap.add_argument("--idle-tolerance-mib", type=float, default=64.0)
    ap.add_argument("--memory-back-s", type=float, default=5.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        run = load_run(args.run, Path(scratch))
        s = summarize(run, idle_tolerance_mib=args.idle_tolerance_mib, memory_back_s=args.memory_back_s,
                      allow_no_gpu=args.allow_no_gpu, label=args.label)
    text = json.dumps(s, indent=1, default=str) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    if args.md:
        args.md.write_text(markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
