"""Benchmark records signed with this box's key (docs/agent.md: the metralectl-envelope/1 format).

The signature covers the record's exact bytes plus what it names: the run, the suite, the recipe
and spec hash, the image revision, and the digest of the raw per-request timings — so neither the
summary nor the timings behind it can change without the signature failing.

`verify_record` is the one verifier of a record on disk: `metralectl verify` and `metralectl bench
verify` both answer with it. It checks the envelope (signing.verify_file: a known key, the signature,
the payload type BENCH_RECORD_TYPE) and then that the timings file next to the record hashes to the
digest the signature covers. A record whose envelope names no timings digest is not passed as good:
its signature is good but its timings are not covered, and that is a failed verification.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl.bench.versus import KIND as VERSUS_KIND
from metralectl.bench.versus import check_references
from metralectl.errors import MetralError
from metralectl.seams.signing import BENCH_RECORD_TYPE

PAYLOAD_TYPE = BENCH_RECORD_TYPE  # one value, defined next to the envelope format
RECORD = "run.json"
TIMINGS = "requests.jsonl"
TIMINGS_NAME = "requests_sha256"  # the name under which the signature covers the timings' digest
NO_TIMINGS = "none"  # the digest signed for a run that has no timings file


def _timings_file(directory: Path, record: Mapping[str, Any]) -> Path:
    """The run's per-request timings file: the record's `requests_file`, a plain name in its directory."""
    name = record.get("requests_file") or TIMINGS
    if not isinstance(name, str) or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"requests_file {name!r} is not a file name in the run's directory")
    return directory / name


def _digest(path: Path) -> str:
    from metralectl.filecap import RECORD_LIMIT, read_bytes

    return hashlib.sha256(read_bytes(path, RECORD_LIMIT, "record file")).hexdigest() if path.exists() else NO_TIMINGS


def names_for(directory: Path, record: Mapping[str, Any]) -> dict[str, str]:
    target = record.get("target") or {}
    names = {"run": str(record.get("run_id", "")), "suite": str(record.get("suite", "")),
             "recipe": str(target.get("recipe") or "none"), "spec_hash": str(target.get("spec_hash") or "none"),
             "image_revision": str(target.get("image_revision") or "none"),
             TIMINGS_NAME: _digest(_timings_file(directory, record))}
    unit = record.get("unit")
    if isinstance(unit, dict) and unit.get("key"):  # a remote unit: accepted only as the unit it was run for
        names["unit"] = str(unit["key"])
        names["requester"] = str(unit.get("requester") or "none")
    return names


def sign_run(directory: Path, record: Mapping[str, Any]) -> str | None:
    """Sign the run's record (creating this box's identity on first use); the reason when it could not."""
    from metralectl.seams import identity, signing
    try:
        key = identity.load_or_create()
        signing.sign_file(directory / RECORD, PAYLOAD_TYPE, names_for(directory, record), key)
    except (MetralError, OSError, ValueError) as exc:
        return f"record not signed: {exc}"
    return None


@dataclass(frozen=True)
class RecordVerdict:
    """The verdict on a signed benchmark record.

    `timings`: "checked" (the timings file hashes to the signed digest), "none" (signed as a run
    without timings, and there are none), "not covered" (a good signature that names no digest),
    "changed", "missing" or "added" (the file differs from what was signed), or None when the
    envelope itself failed and the timings were not looked at."""

    ok: bool
    record: Path
    reason: str
    signer: str | None = None
    payload_type: str | None = None
    names: dict[str, str] = field(default_factory=dict)
    timings: str | None = None
    timings_file: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "record": str(self.record), "run": str(self.record.parent), "signer": self.signer,
                "reason": self.reason, "payload_type": self.payload_type, "timings": self.timings,
                "timings_file": str(self.timings_file) if self.timings_file else None, "names": self.names}


def verify_record(target: Path, known_keys: Mapping[str, bytes], *,
                  expect: Mapping[str, str] | None = None) -> RecordVerdict:
    """Verify a benchmark record: a run directory, its run.json (with run.json.sig), or an envelope file.

    `known_keys` are the trusted signers (this node's and its peers', from `peers.store.known_keys()`):
    passed in because the peer registry sits above the benchmark layer. `expect` lists names the record
    must carry. Raises MetralError only when a file cannot be read; every verdict is a RecordVerdict."""
    from metralectl.seams import signing

    record = target / RECORD if target.is_dir() else target
    verdict = signing.verify_file(record, known_keys, expect=expect, expect_type=PAYLOAD_TYPE)

    def answer(ok: bool, reason: str, timings: str | None = None, timings_file: Path | None = None) -> RecordVerdict:
        return RecordVerdict(ok, record, reason, verdict.signer, verdict.payload_type, dict(verdict.names),
                             timings, timings_file)

    if not verdict.ok:
        return answer(False, verdict.reason)
    try:  # the signed bytes, not the file again: what was verified is what is read
        signed_record = json.loads(verdict.payload or b"")
        if not isinstance(signed_record, dict):
            raise ValueError("not a JSON object")
        timings_file = _timings_file(record.parent, signed_record)
    except (ValueError, UnicodeDecodeError) as exc:
        return answer(False, f"signed, but not a benchmark record: {exc}")
    signed_digest = verdict.names.get(TIMINGS_NAME)
    if signed_digest is None:
        return answer(False, f"signature good, timings not covered: the signature names no "
                      f"{TIMINGS_NAME}, so {timings_file.name} cannot be checked against it (every record "
                      "metralectl signs names it; this envelope was made some other way)",
                      "not covered", timings_file)
    try:
        actual = _digest(timings_file)
    except OSError as exc:
        raise MetralError(f"cannot read {timings_file}: {exc.strerror}") from None
    if actual == signed_digest and signed_record.get("kind") == VERSUS_KIND:  # a comparison: its runs must hold too
        broken = check_references(signed_record, record.parent.parent.parent)
        if broken is not None:
            return answer(False, f"the comparison's signature is good, but {broken}", "none", timings_file)
        return answer(True, "good signature; every benchmark record the comparison names is the one it signed",
                      "none", timings_file)
    if actual == signed_digest:
        timings = "checked" if actual != NO_TIMINGS else "none"
        why = (f"good signature; {timings_file.name} is the one signed" if timings == "checked"
               else "good signature; signed without per-request timings, and there are none")
        return answer(True, why, timings, timings_file)
    if actual == NO_TIMINGS:
        state, why = "missing", f"the per-request timings the signature covers ({timings_file.name}) are missing"
    elif signed_digest == NO_TIMINGS:
        state, why = "added", f"{timings_file.name} was added after signing: the record was signed without timings"
    else:
        state, why = "changed", (f"the per-request timings changed after signing: {timings_file.name} has sha256 "
                                 f"{actual[:16]}…, the signature covers {signed_digest[:16]}…")
    return answer(False, why, state, timings_file)


def read_signed(directory: Path) -> tuple[bytes, Any, bytes]:
    """(the record's exact bytes, its detached envelope, the per-request timings' bytes or b"") of a signed
    run, as a node hands it to a peer. Raises OSError or ValueError when a part cannot be read."""
    from metralectl.bench.records import REQUESTS
    from metralectl.seams import signing

    from metralectl.filecap import DOCUMENT_LIMIT, RECORD_LIMIT, read_bytes

    payload = read_bytes(directory / RECORD, RECORD_LIMIT, "run record")
    envelope = json.loads(read_bytes(signing.sidecar(directory / RECORD), DOCUMENT_LIMIT, "signature"))
    timings = directory / REQUESTS
    return payload, envelope, read_bytes(timings, RECORD_LIMIT, "record file") if timings.exists() else b""
