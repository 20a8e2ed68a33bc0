"""`metralectl verify` and `metralectl bench verify`: one command, one verifier (bench.signed.verify_record).

Both names run this same function, so neither can say "good signature" for a record whose per-request
timings changed, whose payload type is not a benchmark record's, or whose timings the signature does
not cover. Nothing heavy at import time (registered from the command tables).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from metralectl.errors import ExitCode


def verify(
    record: str = typer.Argument(..., metavar="RUN|PATH",
                                 help="A run id (see `bench history`), a run directory, its run.json "
                                      "(with run.json.sig next to it), or an envelope file."),
    expect: list[str] = typer.Option(None, "--expect", metavar="NAME=VALUE", help="A name the record must carry (e.g. unit=...)."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON (on stdout, also when it fails)."),
) -> None:
    """Check a signed benchmark record and its per-request timings against this box's key and its paired
    peers' keys (exit 1 if anything does not verify)."""
    from metralectl import paths
    from metralectl.bench import records, signed
    from metralectl.errors import UsageError
    from metralectl.peers.store import known_keys
    from metralectl.safetext import clean
    from metralectl.seams.signing import SignatureInvalid

    wanted = {}
    for item in expect or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--expect {item!r}: write NAME=VALUE")
        wanted[key] = value
    path = Path(record)
    target = path if path.exists() or path.is_symlink() else records.find(record)
    verdict = signed.verify_record(target, known_keys(), expect=wanted)
    if as_json:
        print(json.dumps(verdict.to_json(), indent=2))
        if not verdict.ok:
            raise typer.Exit(ExitCode.FAILED)
        return
    if not verdict.ok:
        unknown_signer = verdict.reason.startswith("signed by") and "not a known key" in verdict.reason
        raise SignatureInvalid(f"NOT VERIFIED: {clean(paths.display(verdict.record))}: {clean(verdict.reason, 400)}",
                               "pair with the signer (`metralectl peer pair ADDR`) if it is a node you trust"
                               if unknown_signer else None)
    print(f"good signature by {clean(verdict.signer or '?')}")
    timings = verdict.timings_file.name if verdict.timings_file else "requests.jsonl"
    print(f"  timings: {timings} is the one signed" if verdict.timings == "checked"
          else "  timings: none (signed without per-request timings)")
    if verdict.names.get("suite") == "versus":  # bench/versus.SUITE_DIR: a comparison names runs, not timings
        print("  runs: every benchmark record the comparison names is the one it signed")
    for key, value in sorted(verdict.names.items()):
        print(f"  {clean(key, 64)}: {clean(value, 200)}")
