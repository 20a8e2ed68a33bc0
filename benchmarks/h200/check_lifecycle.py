"""Fail loudly unless a lifecycle run shows everything it must: every request ok, the damaged swap rolled back
to B with exit 1 and B serving after it, nothing left after stop, and the GPU memory back at its idle level
within 5 s of stop (lifecycle_expect.py has the list).

    python3 benchmarks/h200/check_lifecycle.py RUN.tar.gz|DIR|SUMMARY.json [--allow-no-gpu] [...]

Prints one line per expectation (`ok` or `FAIL`, and what was seen) and exits 1 when any failed, 0 when all
held. The options are summarize_lifecycle.py's; a SUMMARY.json it wrote is judged as it stands.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import summarize_lifecycle  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--allow-no-gpu", action="store_true")
    ap.add_argument("--idle-tolerance-mib", type=float, default=64.0)
    ap.add_argument("--memory-back-s", type=float, default=5.0)
    args = ap.parse_args(argv)
    if args.run.suffix == ".json":
        summary = json.loads(args.run.read_text())
    else:
        with tempfile.TemporaryDirectory() as scratch:
            summary = summarize_lifecycle.summarize(summarize_lifecycle.load_run(args.run, Path(scratch)),
                                                    idle_tolerance_mib=args.idle_tolerance_mib,
                                                    memory_back_s=args.memory_back_s, allow_no_gpu=args.allow_no_gpu)
    checks = summary.get("expectations") or []
    for e in checks:
        print(f"{'ok  ' if e['passed'] else 'FAIL'} {e['name']}: {e['detail']}")
    failed = [e for e in checks if not e["passed"]]
    if not checks:
        print("FAIL no expectations in the summary", file=sys.stderr)
        return 1
    if failed:
        print(f"FAILED: {len(failed)} of {len(checks)} expectations did not hold", file=sys.stderr)
        return 1
    print(f"all {len(checks)} expectations held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
