#!/usr/bin/env python3
"""metralectl's own lifecycle overhead on a real Docker daemon, against the engine test double.

  run overhead   = metralectl launch (preflight -> ready) - the engine's own readiness
  swap overhead  = swap downtime (old stopped -> new ready) - the new engine's own readiness

"The engine's own readiness" is measured in the same run by the tightest loop we can write: create
and start the same container spec through the Docker SDK, then poll /health every 2 ms until 200.
Targets: run overhead <= 0.3 s, swap overhead <= 0.5 s.
Every timed start is checked to have happened (the container served /health 200, the launch was ready, the
swap swapped); otherwise the script says what failed and exits 1, printing no numbers.
Usage: python3 benchmarks/lifecycle.py [--rounds N]   (needs dockerd; builds the test images)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "docker_image"))

from tests.ports import HeldPort  # noqa: E402

RAW_READY_TIMEOUT_S = 120.0


def fail(reason: str) -> None:
    raise SystemExit(f"lifecycle: NOT MEASURED: {reason}")


def health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=0.5) as reply:
            return reply.status == 200
    except OSError:
        return False


def setup(home: Path, image: str) -> list[HeldPort]:
    """The two recipes, each on a loopback port held until the end (the double listens beside it)."""
    os.environ.update({"METRALECTL_CONFIG_DIR": str(home / "config"), "METRALE_HOME": str(home / "metrale"),
                       "HF_HOME": str(home / "hf"), "METRALECTL_CACHE_DIR": str(home / "cache"),
                       "METRALECTL_LOCK_DIR": str(home)})
    (home / "config" / "images").mkdir(parents=True)
    (home / "config" / "recipes").mkdir(parents=True)
    (home / "config" / "images" / "bench.yaml").write_text(
        f"schema: 1\nid: bench-double\nref: {image}\nengine: metrale\nhardware: [hopper]\nplatform: linux/amd64\n")
    held = [HeldPort(), HeldPort()]
    for name, port in zip(("bench-a", "bench-b"), held):
        (home / "config" / "recipes" / f"{name}.yaml").write_text(
            f"extends: qwen3.5-35b-a3b-hopper\nname: {name}\ndescription: benchmark\nimage: bench-double\n"
            f"resources:\n  port: {port.port}\n  gpus: none\n")
    return held


def raw_ready(runtime, spec) -> float:  # noqa: ANN001 - benchmark script
    """The engine's own readiness: SDK create+start, then /health polled every 2 ms."""
    from metralectl.seams.endpoint import base_url

    url = base_url(spec.bind, spec.port)
    started = time.perf_counter()
    info = runtime.create_and_start(spec)
    try:
        while not health_ok(url):
            state = runtime.inspect(info.id)
            if state is None or not state.running:
                fail(f"the container {spec.name} exited before /health said 200: "
                     + " | ".join(runtime.log_tail(info.id, 5)))
            if time.perf_counter() - started > RAW_READY_TIMEOUT_S:
                fail(f"{url}/health not 200 within {RAW_READY_TIMEOUT_S:.0f} s")
            time.sleep(0.002)
        return time.perf_counter() - started
    finally:
        runtime.remove(info.id, force=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import bundle

    image = bundle.build_bundled()
    with tempfile.TemporaryDirectory() as tmp:
        held = setup(Path(tmp), image)
        from metralectl.core.catalog import load_catalog
        from metralectl.errors import MetralError
        from metralectl.lifecycle.launch import LaunchOptions, launch
        from metralectl.lifecycle.stop import stop_containers
        from metralectl.lifecycle.swap import swap
        from metralectl.core.render import render
        from metralectl.seams.docker.runtime import DockerRuntime
        catalog = load_catalog()
        runtime = DockerRuntime()
        a, b = catalog.recipe("bench-a"), catalog.recipe("bench-b")
        options = LaunchOptions(check_weights=False)
        raw, run, swap_down, swap_raw = [], [], [], []
        for _ in range(args.rounds):
            spec_a = render(a, catalog.engines["metrale"], catalog.images[a.image])
            raw.append(raw_ready(runtime, spec_a))
            started = time.perf_counter()
            try:
                launch(a, catalog, runtime, options=options)  # returns only once the engine is ready
                run.append(time.perf_counter() - started)
                # the new engine's own readiness on the port the swap will use (a's)
                result = swap(b, [], catalog, runtime, options=options)
            except MetralError as exc:
                fail(exc.message)
            if result.outcome != "swapped":
                fail(f"the swap to bench-b ended {result.outcome}: {result.message}")
            swap_down.append(result.downtime_s)
            spec_b = render(catalog.recipe("bench-b"), catalog.engines["metrale"], catalog.images[b.image])
            stop_containers(runtime, runtime.containers())
            swap_raw.append(raw_ready(runtime, spec_b))
        med = statistics.median
        print(f"lifecycle overhead on the engine test double, median of {args.rounds} rounds (Docker "
              f"{runtime.server_version()})")
        print(f"{'measure':<44}{'median s':>10}{'min s':>8}")
        for label, values in (("engine's own readiness (raw SDK + 2 ms poll)", raw),
                              ("metralectl run -> ready (in process)", run),
                              ("swap downtime (old stopped -> new ready)", swap_down),
                              ("new engine's own readiness", swap_raw)):
            print(f"{label:<44}{med(values):>10.3f}{min(values):>8.3f}")
        run_over = med(run) - med(raw)
        swap_over = med(swap_down) - med(swap_raw)
        print(f"run overhead  = {run_over:+.3f} s  (target <= 0.3 s: {'ok' if run_over <= 0.3 else 'MISSED'})")
        print(f"swap overhead = {swap_over:+.3f} s  (target <= 0.5 s: {'ok' if swap_over <= 0.5 else 'MISSED'})")
        for port in held:
            port.close()


if __name__ == "__main__":
    main()
