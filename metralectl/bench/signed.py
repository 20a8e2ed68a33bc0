"""Benchmark records signed with this box's key (docs/agent.md: the metralectl-envelope/1 format).

The signature covers the record's exact bytes plus what it names: the run, the suite, the recipe
and spec hash, the image revision, and the digest of the raw per-request timings — so neither the
summary nor the timings behind it can change without the signature failing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.errors import MetralError

if TYPE_CHECKING:
    from metralectl.seams.signing import Verification

PAYLOAD_TYPE = "application/vnd.metralectl.bench-record+json"
RECORD = "run.json"


def names_for(directory: Path, record: Mapping[str, Any]) -> dict[str, str]:
    target = record.get("target") or {}
    requests = directory / str(record.get("requests_file") or "requests.jsonl")
    digest = hashlib.sha256(requests.read_bytes()).hexdigest() if requests.exists() else "none"
    names = {"run": str(record.get("run_id", "")), "suite": str(record.get("suite", "")),
             "recipe": str(target.get("recipe") or "none"), "spec_hash": str(target.get("spec_hash") or "none"),
             "image_revision": str(target.get("image_revision") or "none"), "requests_sha256": digest}
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
    except (MetralError, OSError) as exc:
        return f"record not signed: {exc}"
    return None


def verify_run(directory: Path, known_keys: dict[str, bytes]) -> Verification:
    """The verdict on a run directory: the envelope, and that the timings it names are the ones on disk.

    `known_keys` are the trusted signers (this node's and its peers', from `peers.store.known_keys()`):
    passed in because the peer registry sits above the benchmark layer."""
    import json

    from metralectl.seams import signing

    verdict = signing.verify_file(directory / RECORD, known_keys)
    if not verdict.ok:
        return verdict
    record = json.loads((directory / RECORD).read_text())
    expected = names_for(directory, record)
    if verdict.names.get("requests_sha256") != expected["requests_sha256"]:
        return signing.Verification(False, verdict.signer, "the per-request timings changed after signing")
    return verdict


def read_signed(directory: Path) -> tuple[bytes, Any, bytes]:
    """(the record's exact bytes, its detached envelope, the per-request timings' bytes or b"") of a signed
    run, as a node hands it to a peer. Raises OSError or ValueError when a part cannot be read."""
    import json

    from metralectl.bench.records import REQUESTS
    from metralectl.seams import signing

    payload = (directory / RECORD).read_bytes()
    envelope = json.loads(signing.sidecar(directory / RECORD).read_text())
    timings = directory / REQUESTS
    return payload, envelope, timings.read_bytes() if timings.exists() else b""
