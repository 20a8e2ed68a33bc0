"""What a lifecycle run must show (summarize_lifecycle.py computes, check_lifecycle.py fails on any that does
not hold). Each expectation is one line: its name, passed or not, and what was seen."""

from __future__ import annotations

from typing import Any


def expectations(s: dict[str, Any], steps: dict[str, dict[str, Any]], *, idle_tolerance_mib: float,
                 memory_back_s: float, allow_no_gpu: bool) -> list[dict[str, Any]]:
    names = s.get("names") or {}
    a, b = names.get("a"), names.get("b")
    ours = set(names.values())
    out: list[dict[str, Any]] = []

    def expect(name: str, passed: bool, detail: str) -> None:
        out.append({"name": name, "passed": bool(passed), "detail": detail})

    wanted = ["run-a", "ps-a", "top-once", "bench-a", "swap-b", "ps-b", "bench-b", "swap-damaged",
              "ps-after-rollback", "bench-b-after-rollback", "stop", "ps-after-stop"]
    missing = [w for w in wanted if w not in steps]
    expect("every step ran", not missing, f"missing: {missing}" if missing else f"{len(steps)} steps")
    for step_name, ran in steps.items():
        want = 1 if step_name == "swap-damaged" else 0
        if step_name in ("print-a", "version", "recipes-check", "top-once-url") or step_name.startswith("bench"):
            continue  # benches are judged by their requests below; top-once-url only when discovery failed
        expect(f"{step_name} exit {want}", ran["rc"] == want, f"exit {ran['rc']}")

    gpu = s["gpu"]
    if gpu["present"] or not allow_no_gpu:
        expect("a GPU was read (NVML)", gpu["present"], gpu.get("name") or gpu.get("why_not") or "?")
    else:  # a CPU dry run: said plainly, and the memory expectations below are left out
        expect("no GPU here, and the run says so (a dry run)", bool(gpu.get("why_not")), str(gpu.get("why_not")))

    run_a = (steps.get("run-a") or {}).get("json") or {}
    expect("run A is ready at its URL", isinstance(run_a, dict) and run_a.get("url") == s.get("url")
           and (run_a.get("ready_s") or 0) > 0, f"url {run_a.get('url') if isinstance(run_a, dict) else None}")
    for ps_step, recipe in (("ps-a", a), ("ps-b", b), ("ps-after-rollback", b)):
        serving = _serving(steps.get(ps_step), ours)
        expect(f"{ps_step}: only {recipe} serves, health ok", serving == [(recipe, "ok")], f"serving {serving}")
    left = _serving(steps.get("ps-after-stop"), ours)
    expect("ps-after-stop: none of the run's models serves", left == [], f"serving {left}")

    top = (steps.get("top-once") or {}).get("json")
    engines = top.get("engines") if isinstance(top, dict) else None
    found = [e for e in engines or [] if isinstance(e, dict) and e.get("url") == s.get("url")]
    expect("top --once --json finds the served engine by itself, state ok",
           bool(found) and found[0].get("state") == "ok",
           f"engines {[(e.get('url'), e.get('state')) for e in engines or [] if isinstance(e, dict)]}")
    if gpu["present"] and isinstance(top, dict):
        expect("top reads the GPU", bool(top.get("gpus") or top.get("gpu")),
               "gpus present" if top.get("gpus") else "none")

    for bench in s["benches"]:
        passed = bench["status"] == "completed" and bench["measured"] > 0 and bench["failed"] == 0
        expect(f"{bench['step']}: every request ok", passed,
               f"{bench['ok']} ok / {bench['failed']} failed of {bench['measured']} (status {bench['status']}, "
               f"exit {bench['rc']}){' ' + str(bench['errors']) if bench['errors'] else ''}")

    swaps = {w["step"]: w for w in s["swaps"]}
    to_b = swaps.get("swap-b", {})
    expect("swap to B: swapped", to_b.get("outcome") == "swapped", f"outcome {to_b.get('outcome')}")
    bad = swaps.get("swap-damaged", {})
    expect("swap to the damaged model rolls back to B (exit 1)",
           bad.get("outcome") == "rolled-back" and bad.get("rc") == 1,
           f"outcome {bad.get('outcome')}, exit {bad.get('rc')}, cause {bad.get('failure_cause')}")
    err = _stderr_has(steps.get("swap-damaged"), f"the previous recipe {b} serves again")
    expect("the rollback says B serves again", err, "said" if err else "not said")
    expect("the damaged model is named as corrupt weights", bad.get("failure_cause") == "corrupt-weights",
           f"cause {bad.get('failure_cause')}")
    for w in s["swaps"]:
        # a swap that rolled back: its failed boot has no load to split; the restore's boot is split instead
        split = w if w.get("outcome") == "swapped" else (w.get("restore_split") or {})
        have = [k for k in ("drain_s", "stop_s", "boot_s") if w.get(k) is None]
        have += [k for k in ("phase_start_s", "phase_load_s", "phase_ready_s") if split.get(k) is None]
        if w.get("outcome") != "swapped" and w.get("restore_s") is None:
            have.append("restore_s")
        expect(f"{w['step']}: downtime split drain/stop/start/load/ready", not have and w.get("downtime_s") is not None,
               f"missing {have}" if have else f"downtime {w.get('downtime_s')} s")

    leftovers = s.get("leftovers") or {}
    expect("no engine process left after stop", leftovers.get("engine_processes") == [],
           f"{leftovers.get('engine_processes')}")
    expect("nothing listens on the served port after stop", leftovers.get("port_listening") is False,
           f"listening {leftovers.get('port_listening')}")

    if gpu["present"]:
        mem = s["memory_after_stop"]
        back = mem.get("back_s_after_stop_returned")
        expect(f"GPU memory back at idle (+{idle_tolerance_mib:g} MiB) within {memory_back_s:g} s of stop",
               back is not None and back <= memory_back_s,
               f"idle {mem.get('idle_mib')} MiB, before stop {mem.get('before_stop_mib')} MiB, back "
               f"{mem.get('back_s_after_stop_began')} s after stop began / {back} s after it returned; at the end "
               f"{mem.get('level_at_end_mib')} MiB")
        for boot in s["boots"]:
            held = boot.get("gpu_mib_model")
            model = (s.get("models") or {}).get(_key(names, boot.get("recipe"))) or {}
            size_mib = (model.get("bytes") or 0) / 2**20
            expect(f"{boot['step']}: {boot['recipe']}'s weights are on the GPU",
                   held is not None and size_mib > 0 and held >= 0.9 * size_mib,
                   f"{held} MiB held above idle, the file is {size_mib:.0f} MiB")
    return out


def _serving(step: dict[str, Any] | None, ours: set[Any]) -> list[tuple[Any, Any]] | None:
    """What `ps --json` says serves, of this run's recipes (a shared machine may serve others' models too)."""
    doc = (step or {}).get("json")
    if not isinstance(doc, dict) or not isinstance(doc.get("serving"), list):
        return None
    return [(e.get("recipe"), e.get("health")) for e in doc["serving"] if isinstance(e, dict) and e.get("recipe") in ours]


def _stderr_has(step: dict[str, Any] | None, text: str) -> bool:
    return step is not None and text in str(step.get("stderr_text", ""))


def _key(names: dict[str, str], recipe: Any) -> str | None:
    return next((k for k, v in names.items() if v == recipe), None)
