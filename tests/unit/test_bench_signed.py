"""Every benchmark record is signed with the box's key; any change to it or its timings fails verification,
and `metralectl verify` and `metralectl bench verify` say the same (one verifier behind both)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.bench import signed
from metralectl.peers.store import known_keys
from metralectl.seams import identity, signing

REPO = Path(__file__).resolve().parents[2]
COMMANDS = {"verify": ["verify"], "bench verify": ["bench", "verify"]}


def _run(tmp_path: Path) -> Path:
    directory = tmp_path / "runs" / "decode" / "r1"
    directory.mkdir(parents=True)
    record = {"run_id": "r1", "suite": "decode", "requests_file": "requests.jsonl",
              "target": {"recipe": "qwen3.5-35b-a3b", "spec_hash": "abc", "image_revision": "deadbeef"},
              "summary": {"headline": {"decode_tok_s": 131.0}}}
    (directory / "run.json").write_text(json.dumps(record))
    (directory / "requests.jsonl").write_text('{"ttft_ms": 42.0}\n')
    assert signed.sign_run(directory, record) is None
    return directory


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env={**os.environ}, cwd=REPO)  # fmt: skip


def _resign(directory: Path, payload_type: str, names: dict[str, str]) -> None:
    """Sign run.json again as something other than sign_run would (another type, other names)."""
    signing.sign_file(directory / "run.json", payload_type, names, identity.load_or_create())


def test_signed_record_verifies_and_names_what_it_covers(tmp_path: Path) -> None:
    verdict = signed.verify_record(_run(tmp_path), known_keys())
    assert verdict.ok, verdict.reason
    assert verdict.timings == "checked" and verdict.payload_type == signing.BENCH_RECORD_TYPE
    assert verdict.names["recipe"] == "qwen3.5-35b-a3b" and verdict.names["image_revision"] == "deadbeef"


def test_one_payload_type_everywhere(tmp_path: Path) -> None:
    """The constant, what sign_run writes and what the docs show are one value."""
    assert signed.PAYLOAD_TYPE == signing.BENCH_RECORD_TYPE
    envelope = json.loads((_run(tmp_path) / "run.json.sig").read_text())
    assert envelope["payloadType"] == signing.BENCH_RECORD_TYPE
    shown = []
    for doc in ("docs/agent.md", "docs/bench.md", "metralectl/seams/signing.py"):
        shown += re.findall(r'"payloadType": "([^"]*)"', (REPO / doc).read_text())
    assert shown and set(shown) == {signing.BENCH_RECORD_TYPE}, shown


def test_a_changed_byte_in_the_record_fails(tmp_path: Path) -> None:
    directory = _run(tmp_path)
    record = directory / "run.json"
    record.write_text(record.read_text().replace("131.0", "141.0"))
    verdict = signed.verify_record(directory, known_keys())
    assert not verdict.ok and "bad signature" in verdict.reason


def test_changed_missing_or_added_timings_fail(tmp_path: Path) -> None:
    directory = _run(tmp_path)
    timings = directory / "requests.jsonl"
    timings.write_text('{"ttft_ms": 12.0}\n')
    verdict = signed.verify_record(directory, known_keys())
    assert not verdict.ok and verdict.timings == "changed" and "timings changed" in verdict.reason
    timings.unlink()
    verdict = signed.verify_record(directory, known_keys())
    assert not verdict.ok and verdict.timings == "missing" and "missing" in verdict.reason
    # a run signed without timings: fine while there are none, refused once a file appears
    record = json.loads((directory / "run.json").read_text())
    assert signed.sign_run(directory, record) is None
    verdict = signed.verify_record(directory / "run.json", known_keys())
    assert verdict.ok and verdict.timings == "none", verdict.reason
    timings.write_text('{"ttft_ms": 1.0}\n')
    verdict = signed.verify_record(directory, known_keys())
    assert not verdict.ok and verdict.timings == "added"


def test_the_timings_file_is_read_from_the_signed_record_and_only_beside_it(tmp_path: Path) -> None:
    directory = _run(tmp_path)
    # a record naming a timings file elsewhere cannot be signed by sign_run ...
    record = json.loads((directory / "run.json").read_text())
    record["requests_file"] = "../../elsewhere.jsonl"
    assert "not a file name" in (signed.sign_run(directory, record) or "")
    # ... and one signed some other way is refused when verified
    (directory / "run.json").write_text(json.dumps(record))
    _resign(directory, signing.BENCH_RECORD_TYPE, {"requests_sha256": "none"})
    verdict = signed.verify_record(directory, known_keys())
    assert not verdict.ok and "not a file name" in verdict.reason


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_both_commands_refuse_changed_timings(tmp_path: Path, command: str) -> None:
    """The reported hole: `metralectl verify run.json` said "good signature" after requests.jsonl changed."""
    directory = _run(tmp_path)
    timings = directory / "requests.jsonl"
    signed_timings = timings.read_bytes()
    timings.write_text('{"ttft_ms": 1.0}\n')
    for target in (directory / "run.json", directory):
        bad = _cli(*COMMANDS[command], str(target))
        assert "good signature" not in bad.stdout, bad.stdout
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "NOT VERIFIED" in bad.stderr and "timings changed after signing" in bad.stderr
        assert "Traceback" not in bad.stderr
    timings.write_bytes(signed_timings)
    ok = _cli(*COMMANDS[command], str(directory / "run.json"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("good signature by ") and "timings: requests.jsonl is the one signed" in ok.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_both_commands_refuse_a_changed_record(tmp_path: Path, command: str) -> None:
    directory = _run(tmp_path)
    (directory / "run.json").write_text((directory / "run.json").read_text() + " ")
    bad = _cli(*COMMANDS[command], str(directory / "run.json"))
    assert bad.returncode == 1 and "NOT VERIFIED" in bad.stderr and "bad signature" in bad.stderr
    assert bad.stdout == ""


def test_both_commands_give_the_same_verdict_as_json(tmp_path: Path) -> None:
    directory = _run(tmp_path)
    (directory / "requests.jsonl").write_text("")
    answers = [_cli(*COMMANDS[c], "--json", str(directory)) for c in sorted(COMMANDS)]
    assert [a.returncode for a in answers] == [1, 1]
    verdicts = [json.loads(a.stdout) for a in answers]
    assert verdicts[0] == verdicts[1]
    assert verdicts[0]["ok"] is False and verdicts[0]["timings"] == "changed"
    assert verdicts[0]["payload_type"] == signing.BENCH_RECORD_TYPE


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_record_of_another_payload_type_is_refused(tmp_path: Path, command: str) -> None:
    """A good signature by a known key over the right bytes and names, but not as a bench record (here the
    type the docs used to show)."""
    directory = _run(tmp_path)
    names = json.loads((directory / "run.json.sig").read_text())["names"]
    _resign(directory, "application/vnd.metrale.bench-record+json", names)
    bad = _cli(*COMMANDS[command], str(directory / "run.json"))
    assert bad.returncode == 1, bad.stdout
    assert "payload type" in bad.stderr and "application/vnd.metrale.bench-record+json" in bad.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_signature_that_does_not_cover_the_timings_is_not_good(tmp_path: Path, command: str) -> None:
    """An envelope without the timings digest (not one sign_run makes): the signature is good, the timings
    are not covered, and that is said and refused, not passed as good."""
    directory = _run(tmp_path)
    names = json.loads((directory / "run.json.sig").read_text())["names"]
    del names["requests_sha256"]
    _resign(directory, signing.BENCH_RECORD_TYPE, names)
    bad = _cli(*COMMANDS[command], str(directory / "run.json"))
    assert bad.returncode == 1, bad.stdout
    assert "signature good, timings not covered" in bad.stderr
    verdict = json.loads(_cli(*COMMANDS[command], "--json", str(directory)).stdout)
    assert verdict["ok"] is False and verdict["timings"] == "not covered"


def test_an_embedded_envelope_is_checked_against_the_timings_beside_it(tmp_path: Path) -> None:
    directory = _run(tmp_path)
    payload = (directory / "run.json").read_bytes()
    sidecar = json.loads((directory / "run.json.sig").read_text())
    embedded = tmp_path / "runs" / "decode" / "r1" / "record.envelope.json"
    embedded.write_text(signing.dumps({**sidecar, "payload": base64.b64encode(payload).decode()}))
    assert _cli("verify", str(embedded)).returncode == 0
    (directory / "requests.jsonl").write_text("changed\n")
    bad = _cli("verify", "--json", str(embedded))
    assert bad.returncode == 1 and json.loads(bad.stdout)["timings"] == "changed"


def test_a_remote_record_of_another_payload_type_is_not_accepted(tmp_path: Path) -> None:
    """The campaign's fetch (peers.remote_units.accept_record) goes through the same type check."""
    from metralectl.peers.remote_units import RecordRejected, accept_record

    me = identity.load_or_create()
    payload = json.dumps({"unit": {"key": "u1"}, "status": "completed", "suite": "decode"}).encode()
    names = {"unit": "u1", "requester": me.fingerprint, "requests_sha256": "none"}  # no timings came with it
    for payload_type, accepted in ((signing.BENCH_RECORD_TYPE, True), ("application/vnd.metrale.bench-record+json", False)):
        envelope = signing.sign_envelope(payload_type, payload, names, me, detached=True)
        dest = tmp_path / payload_type.replace("/", "_")
        try:
            accept_record("node", me.fingerprint, me.fingerprint, "u1", payload, envelope, b"", dest,
                          known=known_keys())  # fmt: skip
        except RecordRejected as exc:
            assert not accepted and "payload type" in str(exc)
            assert not dest.exists()
        else:
            assert accepted and (dest / "run.json").read_bytes() == payload


def test_unknown_run_and_bad_expect_are_usage_errors(tmp_path: Path) -> None:
    _run(tmp_path)
    missing = _cli("verify", "no-such-run")
    assert missing.returncode == 64 and "no benchmark run" in missing.stderr
    bad = _cli("bench", "verify", "--expect", "unit", "r1")
    assert bad.returncode == 64 and "NAME=VALUE" in bad.stderr
