"""Signed records: an envelope binding a record's exact bytes to what it names, under this box's key.

The envelope (JSON, docs/agent.md has the full specification):

    {
      "format": "metralectl-envelope/1",
      "payloadType": "application/vnd.metralectl.bench-record+json",
      "payload": "<base64 of the record's exact bytes>",           (absent in a detached envelope)
      "names": {"commit": "3f2c…", "recipe": "qwen3.5-35b-a3b", "unit": "certify-r1-spark2-decode"},
      "signatures": [{"keyid": "<fingerprint>", "publicKey": "<base64, 32 bytes>", "sig": "<base64, 64 bytes>"}]
    }

What is signed is PAE(payloadType, names, payload), a length-prefixed encoding in the manner of DSSE
so that no two different (type, names, payload) triples encode to the same bytes:

    PAE = "metralectl-envelope/1" SP enc(type) SP DEC(n) (SP enc(key_i) SP enc(value_i))*  SP enc(payload)
    enc(x) = DEC(len(x)) SP x          (x as UTF-8 bytes; DEC = ASCII decimal; names sorted by key)

Verification never trusts the envelope's own key: `keyid` selects a key from the caller's known keys
(this box and its paired peers), `publicKey` must equal it, and the signature must verify over the PAE.
The payload type must be the one the caller expects (BENCH_RECORD_TYPE unless it says otherwise): a
signature over some other kind of document is not a benchmark record.
Base64 must be canonical, unknown fields are refused, and v1 has exactly one signature: any changed
bit anywhere in the envelope makes verification fail.

A detached envelope (no "payload") sits next to its record as `<record>.sig`; `verify_file` reads the
record's bytes from disk. `cryptography` is imported only when a signature is made or checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metralectl.errors import ExitCode, MetralError
from metralectl.seams.identity import b64, fingerprint_of, unb64, verify_signature
from metralectl.wording import noun

if TYPE_CHECKING:
    from metralectl.seams.identity import Identity

FORMAT = "metralectl-envelope/1"
# The one payload type of a benchmark record (bench/signed.py signs with it; docs/agent.md shows it).
BENCH_RECORD_TYPE = "application/vnd.metralectl.bench-record+json"
SIDECAR_SUFFIX = ".sig"
_NAME_KEY = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
_FIELDS = {"format", "payloadType", "payload", "names", "signatures"}
_SIG_FIELDS = {"keyid", "publicKey", "sig"}
MAX_ENVELOPE_BYTES = 64 * 1024 * 1024


class SignatureInvalid(MetralError):
    """A signed record failed verification."""

    exit_code = ExitCode.FAILED


def _enc(data: bytes) -> bytes:
    return str(len(data)).encode("ascii") + b" " + data


def check_names(names: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for key, value in names.items():
        if not isinstance(key, str) or not _NAME_KEY.fullmatch(key):
            raise ValueError(f"name key {key!r}: use lower-case letters, digits, '_', '.', '-' (max 64)")
        if not isinstance(value, str):
            raise ValueError(f"name {key!r}: the value must be a string, not {type(value).__name__}")
        out[key] = value
    return out


def pae(payload_type: str, names: Mapping[str, str], payload: bytes, *, domain: str = FORMAT) -> bytes:
    """The exact bytes a signature covers (pre-authentication encoding)."""
    parts = [domain.encode("ascii"), _enc(payload_type.encode("utf-8")), str(len(names)).encode("ascii")]
    for key in sorted(names):
        parts += [_enc(key.encode("utf-8")), _enc(names[key].encode("utf-8"))]
    parts.append(_enc(payload))
    return b" ".join(parts)


def sign_envelope(payload_type: str, payload: bytes, names: Mapping[str, str], key: Identity, *,
                  detached: bool = False) -> dict[str, Any]:
    clean = check_names(names)
    if not payload_type:
        raise ValueError("the payload type must not be empty")
    signature = key.sign(pae(payload_type, clean, payload))
    envelope: dict[str, Any] = {"format": FORMAT, "payloadType": payload_type, "names": clean,
                                "signatures": [{"keyid": key.fingerprint, "publicKey": key.public_b64,
                                                "sig": b64(signature)}]}
    if not detached:
        envelope["payload"] = b64(payload)
    return envelope


def dumps(envelope: Mapping[str, Any]) -> str:
    return json.dumps(envelope, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def sign(payload_type: str, payload: bytes, names: Mapping[str, str], key: Identity) -> str:
    """The envelope, as JSON text, for payload (its exact bytes) and what it names, signed by key."""
    return dumps(sign_envelope(payload_type, payload, names, key))


@dataclass(frozen=True)
class Verification:
    """The verdict. Unpacks as (ok, signer, reason); the payload and names ride along when ok."""

    ok: bool
    signer: str | None
    reason: str
    payload_type: str | None = None
    payload: bytes | None = field(default=None, repr=False)
    names: dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.ok, self.signer, self.reason))


def _fail(reason: str, signer: str | None = None) -> Verification:
    return Verification(False, signer, reason)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _parse(envelope: str | bytes | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(envelope, Mapping):
        return dict(envelope)
    try:
        value = json.loads(envelope, object_pairs_hook=_no_duplicates)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a JSON envelope ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON envelope (expected an object)")
    return value


def verify(envelope: str | bytes | Mapping[str, Any], known_keys: Mapping[str, bytes], *,
           payload: bytes | None = None, expect: Mapping[str, str] | None = None,
           expect_type: str | None = BENCH_RECORD_TYPE) -> Verification:
    """Check an envelope against known keys (fingerprint -> raw public key).

    `payload` supplies the bytes of a detached envelope; `expect` lists names that must match (e.g.
    the unit a remote record must be for); `expect_type` is the payload type it must have (None: any).
    Never raises for a bad envelope: the reason says why.
    """
    try:
        env = _parse(envelope)
    except ValueError as exc:
        return _fail(str(exc))
    unknown = set(env) - _FIELDS
    if unknown:
        return _fail(f"unknown envelope {noun(len(unknown), 'field')}: {', '.join(sorted(unknown))}")
    if env.get("format") != FORMAT:
        return _fail(f"not a {FORMAT} envelope (format {env.get('format')!r})")
    payload_type, names, sigs = env.get("payloadType"), env.get("names"), env.get("signatures")
    if not isinstance(payload_type, str) or not payload_type:
        return _fail("payloadType missing")
    if not isinstance(names, dict):
        return _fail("names missing")
    try:
        names = check_names(names)
    except ValueError as exc:
        return _fail(f"bad names: {exc}")
    if "payload" in env:
        if payload is not None:
            return _fail("the envelope carries a payload and another was given")
        if not isinstance(env["payload"], str):
            return _fail("payload is not a base64 string")
        try:
            body = unb64(env["payload"], "payload")
        except ValueError as exc:
            return _fail(str(exc))
    elif payload is None:
        return _fail("a detached envelope: the record's bytes are needed (verify the record file)")
    else:
        body = payload
    if not isinstance(sigs, list) or len(sigs) != 1 or not isinstance(sigs[0], dict):
        return _fail("expected exactly one signature")
    sig = sigs[0]
    if set(sig) != _SIG_FIELDS or not all(isinstance(sig[k], str) for k in _SIG_FIELDS):
        return _fail("malformed signature entry (keyid, publicKey, sig)")
    keyid = sig["keyid"]
    known = known_keys.get(keyid)
    if known is None:
        return _fail(f"signed by {keyid}, which is not a known key (not this box, not a paired peer)", keyid)
    if fingerprint_of(known) != keyid:
        return _fail(f"the known key filed under {keyid} does not have that fingerprint", keyid)
    try:
        claimed = unb64(sig["publicKey"], "publicKey")
        signature = unb64(sig["sig"], "sig")
    except ValueError as exc:
        return _fail(str(exc), keyid)
    if claimed != known:
        return _fail(f"the envelope's public key is not the known key of {keyid}", keyid)
    if not verify_signature(known, signature, pae(payload_type, names, body)):
        return _fail("bad signature: the record, what it names, or the signature was changed", keyid)
    if expect_type is not None and payload_type != expect_type:
        return Verification(False, keyid, f"signed, but its payload type is {payload_type!r}, not the expected "
                            f"{expect_type!r}", payload_type, body, names)
    for key, want in (expect or {}).items():
        if names.get(key) != want:
            return Verification(False, keyid, f"signed, but names {key}={names.get(key)!r}, expected {want!r}",
                                payload_type, body, names)
    return Verification(True, keyid, "good signature", payload_type, body, names)


def sidecar(record: Path) -> Path:
    return record.with_name(record.name + SIDECAR_SUFFIX)


def sign_file(record: Path, payload_type: str, names: Mapping[str, str], key: Identity) -> Path:
    """Write a detached envelope for a record file next to it (`<record>.sig`); the record is untouched."""
    from metralectl.seams.store import write_atomic

    data = record.read_bytes()
    out = sidecar(record)
    write_atomic(out, dumps(sign_envelope(payload_type, data, names, key, detached=True)))
    return out


def _read(path: Path) -> bytes:
    from metralectl.filecap import FileRefused, read_bytes

    try:  # a FIFO, a device or a file past the cap is no envelope (read_bytes never reads past the cap)
        return read_bytes(path, MAX_ENVELOPE_BYTES, "signed file")
    except FileRefused as exc:
        raise SignatureInvalid(exc.message) from None


def verify_file(path: Path | str, known_keys: Mapping[str, bytes], *,
                expect: Mapping[str, str] | None = None, expect_type: str | None = BENCH_RECORD_TYPE) -> Verification:
    """Verify a signed record on disk: an envelope with its payload inside, or a record with `<record>.sig`.

    Raises MetralError only when the file cannot be read; every verdict is a Verification.
    """
    path = Path(path)
    try:
        data = _read(path)
    except OSError as exc:
        raise MetralError(f"cannot read {path}: {exc.strerror}") from None
    try:
        env = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        env = None
    if isinstance(env, dict) and env.get("format") == FORMAT and "payload" in env:
        return verify(data, known_keys, expect=expect, expect_type=expect_type)
    side = sidecar(path)
    if isinstance(env, dict) and env.get("format") == FORMAT:
        return _fail(f"{path} is a detached envelope: verify the record it sits next to")
    if not side.exists():
        return _fail(f"{path} is not signed: neither an envelope nor a record with {side.name} next to it")
    try:
        side_data = _read(side)
    except OSError as exc:
        raise MetralError(f"cannot read {side}: {exc.strerror}") from None
    return verify(side_data, known_keys, payload=data, expect=expect, expect_type=expect_type)


__all__ = [
    "BENCH_RECORD_TYPE", "FORMAT", "SignatureInvalid", "Verification", "dumps", "pae", "sidecar", "sign",
    "sign_envelope", "sign_file", "verify", "verify_file",
]
