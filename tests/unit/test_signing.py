"""Signed records: round trips, and any flipped bit (payload, names, signature, the envelope text) fails."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metralectl.seams import identity, signing
from metralectl.seams.signing import pae, sign, verify, verify_file

_KEYS: dict[str, identity.Identity] = {}


def key(name: str, tmp_root: Path | None = None) -> identity.Identity:
    """Module-lifetime keys (hypothesis re-runs bodies; generating a key per example is wasteful)."""
    if name not in _KEYS:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        _KEYS[name] = identity._from_private(Ed25519PrivateKey.generate(), Path(f"/nonexistent/{name}"))
    return _KEYS[name]


def known(*names: str) -> dict[str, bytes]:
    return {key(n).fingerprint: key(n).public_key for n in names}


names_st = st.dictionaries(st.from_regex(r"[a-z][a-z0-9_.-]{0,10}", fullmatch=True), st.text(max_size=20), max_size=4)
types_st = st.text(min_size=1, max_size=30)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _flip(data: bytes, bit: int) -> bytes:
    b = bytearray(data)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


@SETTINGS
@given(types_st, st.binary(max_size=300), names_st)
def test_round_trip(payload_type: str, payload: bytes, names: dict[str, str]) -> None:
    env = sign(payload_type, payload, names, key("a"))
    ok, signer, reason = verify(env, known("a", "b"), expect_type=None)
    assert ok, reason
    assert signer == key("a").fingerprint
    v = verify(env, known("a"), expect_type=None)
    assert v.payload == payload and v.names == names and v.payload_type == payload_type


@SETTINGS
@given(types_st, st.binary(min_size=1, max_size=200), names_st, st.data())
def test_flipped_payload_bit_fails(payload_type: str, payload: bytes, names: dict[str, str], data: st.DataObject) -> None:
    env = json.loads(sign(payload_type, payload, names, key("a")))
    bit = data.draw(st.integers(0, len(payload) * 8 - 1))
    env["payload"] = base64.b64encode(_flip(payload, bit)).decode()
    assert not verify(env, known("a"), expect_type=None).ok


@SETTINGS
@given(types_st, st.binary(max_size=100), names_st.filter(bool), st.data())
def test_flipped_name_bit_fails(payload_type: str, payload: bytes, names: dict[str, str], data: st.DataObject) -> None:
    env = json.loads(sign(payload_type, payload, names, key("a")))
    name = data.draw(st.sampled_from(sorted(names)))
    if names[name]:
        raw = names[name].encode()
        flipped = _flip(raw, data.draw(st.integers(0, len(raw) * 8 - 1)))
        try:
            env["names"][name] = flipped.decode()
        except UnicodeDecodeError:
            return  # not text any more: cannot even be written into the envelope
    else:
        env["names"][name] = "x"
    assert not verify(env, known("a"), expect_type=None).ok


@SETTINGS
@given(types_st, st.binary(max_size=100), names_st, st.data())
def test_flipped_type_or_signature_bit_fails(payload_type: str, payload: bytes, names: dict[str, str],
                                             data: st.DataObject) -> None:
    env = json.loads(sign(payload_type, payload, names, key("a")))
    sig = base64.b64decode(env["signatures"][0]["sig"])
    bad = json.loads(json.dumps(env))
    bad["signatures"][0]["sig"] = base64.b64encode(_flip(sig, data.draw(st.integers(0, 64 * 8 - 1)))).decode()
    assert not verify(bad, known("a"), expect_type=None).ok
    raw = payload_type.encode()
    try:
        env["payloadType"] = _flip(raw, data.draw(st.integers(0, len(raw) * 8 - 1))).decode()
    except UnicodeDecodeError:
        return
    assert not verify(env, known("a"), expect_type=None).ok


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_any_flipped_bit_in_the_envelope_file_fails(data: st.DataObject) -> None:
    text = sign(signing.BENCH_RECORD_TYPE, b'{"tok_s": 131.2, "unit": "certify-r1-spark2-decode"}\n',
                {"commit": "3f2c9a1", "recipe": "qwen3.5-35b-a3b", "unit": "certify-r1-spark2-decode"}, key("a"))
    raw = text.encode()
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    assert not verify(_flip(raw, bit), known("a"), expect_type=None).ok


def test_swapped_or_unknown_keys_fail() -> None:
    env = json.loads(sign("t", b"record", {"commit": "abc"}, key("a")))
    ok, signer, reason = verify(env, known("b"), expect_type=None)
    assert not ok and "not a known key" in reason
    # the signature block of b grafted onto a's envelope
    env_b = json.loads(sign("t", b"record", {"commit": "abc"}, key("b")))
    env["signatures"] = env_b["signatures"][:1]
    env["signatures"][0]["sig"] = json.loads(sign("t", b"record", {"commit": "abc"}, key("a")))["signatures"][0]["sig"]
    assert not verify(env, known("a", "b"), expect_type=None).ok
    # a known fingerprint whose key claims to be another's
    env = json.loads(sign("t", b"record", {}, key("a")))
    env["signatures"][0]["publicKey"] = key("b").public_b64
    assert not verify(env, known("a", "b"), expect_type=None).ok
    # the caller's key table lying about a fingerprint
    assert not verify(sign("t", b"r", {}, key("a")), {key("a").fingerprint: key("b").public_key}, expect_type=None).ok


def test_pae_is_unambiguous() -> None:
    assert pae("t", {"a": "b c"}, b"") != pae("t", {"a": "b", "c": ""}, b"")
    assert pae("t", {}, b"1 x") != pae("t 1", {}, b"x")
    assert pae("t", {"ab": ""}, b"") != pae("t", {"a": "b"}, b"")


def test_structure_is_strict() -> None:
    env = json.loads(sign("t", b"r", {"unit": "u1"}, key("a")))
    assert verify(env, known("a"), expect={"unit": "u1"}, expect_type=None).ok
    verdict = verify(env, known("a"), expect={"unit": "u2"}, expect_type=None)
    assert not verdict.ok and "expected 'u2'" in verdict.reason
    extra = {**env, "comment": "hi"}
    assert not verify(extra, known("a"), expect_type=None).ok
    two = {**env, "signatures": env["signatures"] * 2}
    assert not verify(two, known("a"), expect_type=None).ok
    text = signing.dumps(env).replace('"format"', '"names": {}, "format"', 1)
    assert "duplicate" in verify(text, known("a"), expect_type=None).reason
    with pytest.raises(ValueError):
        sign("t", b"r", {"Bad Key": "x"}, key("a"))


def test_files_embedded_and_detached(tmp_path: Path) -> None:
    me = key("a")
    record = tmp_path / "run.json"
    record.write_bytes(b'{"tok_s": 131.2}\n')
    side = signing.sign_file(record, signing.BENCH_RECORD_TYPE, {"commit": "abc"}, me)
    assert side.name == "run.json.sig"
    assert verify_file(record, known("a")).ok
    assert not verify_file(side, known("a")).ok  # the sidecar alone has no bytes to check
    record.write_bytes(b'{"tok_s": 231.2}\n')
    assert not verify_file(record, known("a")).ok
    env_file = tmp_path / "run.envelope.json"
    env_file.write_text(sign(signing.BENCH_RECORD_TYPE, b"x", {"commit": "abc"}, me))
    assert verify_file(env_file, known("a")).ok
    unsigned = tmp_path / "plain.json"
    unsigned.write_text("{}")
    assert "not signed" in verify_file(unsigned, known("a")).reason


def test_the_payload_type_is_checked(tmp_path: Path) -> None:
    """One bench-record type (the one real records carry); a good signature over another type is refused
    unless the caller asks for any type."""
    assert signing.BENCH_RECORD_TYPE == "application/vnd.metralectl.bench-record+json"
    for wrong in ("application/vnd.metrale.bench-record+json", "application/json", "t"):
        env = sign(wrong, b'{"tok_s": 1}', {"commit": "abc"}, key("a"))
        verdict = verify(env, known("a"))
        assert not verdict.ok and "payload type" in verdict.reason and wrong in verdict.reason
        assert verdict.signer == key("a").fingerprint      # the signature itself was good
        assert verify(env, known("a"), expect_type=wrong).ok
        assert verify(env, known("a"), expect_type=None).ok
        record = tmp_path / "run.json"
        record.write_bytes(b'{"tok_s": 1}')
        signing.sign_file(record, wrong, {"commit": "abc"}, key("a"))
        assert "payload type" in verify_file(record, known("a")).reason
    assert verify(sign(signing.BENCH_RECORD_TYPE, b"{}", {}, key("a")), known("a")).ok
