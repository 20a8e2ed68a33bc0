"""This box's identity: an Ed25519 key pair in the config dir, and its human-checkable fingerprint.

    ident = load_or_create()            # <config>/identity/ed25519.key (0600), ed25519.pub
    ident.fingerprint                   # "7KQ2-M9XC-…-TV4R": 7 groups of 4, the last symbol a check
    ident.sign(data) -> 64 bytes

The private key file is created with mode 0600 from the first byte (O_CREAT|O_EXCL with 0600 under a
temporary name, then linked into place: two processes starting at once agree on one key). A key file
whose mode lets anyone else read or write it, that is not a regular file, or that another user owns is
refused with the command that repairs it; `repair_permissions()` applies that repair.

Fingerprint (docs/agent.md): the Crockford base-32 alphabet (no I, L, O, U); the first 135 bits of
SHA-256(raw 32-byte public key) as 27 symbols, then one check symbol from the same alphabet, computed
with a totally anti-symmetric quasigroup over GF(32) (x∘y = αx ⊕ y, Damm's construction), so every
single-symbol substitution and every swap of two adjacent symbols is detected. Shown in 7 groups of
4 joined by "-"; accepted with or without the dashes (not with dashes elsewhere), any case.

`cryptography` is imported inside the functions that need it: fingerprints are pure.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from metralectl import paths
from metralectl.atomicfile import fsync_dir
from metralectl.errors import ExitCode, MetralError, UsageError
from metralectl.wording import count

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford's base 32: no I, L, O, U
_VALUE = {c: i for i, c in enumerate(ALPHABET)}
DATA_SYMBOLS = 27  # 135 bits of SHA-256: a second preimage costs 2^135 work
GROUP = 4
SYMBOLS = DATA_SYMBOLS + 1
PUBLIC_KEY_BYTES = 32
_POLY = 0b100101  # x^5 + x^2 + 1, primitive: GF(32) with α = x


class IdentityError(MetralError):
    """The identity files are missing, unreadable, unsafe or corrupt."""

    exit_code = ExitCode.FAILED


class InvalidFingerprint(UsageError):
    """A typed fingerprint is malformed or its check symbol does not match (a typo)."""

    exit_code = ExitCode.USAGE


# -- fingerprints (pure) ------------------------------------------------------------------------
def _times_alpha(x: int) -> int:
    x <<= 1
    return x ^ _POLY if x & 0b100000 else x


def _chain(values: list[int]) -> int:
    """Fold the quasigroup x∘y = αx ⊕ y over the symbols, from 0."""
    acc = 0
    for v in values:
        acc = _times_alpha(acc) ^ v
    return acc


def check_symbol(data: str) -> str:
    """The symbol k that brings the chain back to 0 (αc ⊕ k = 0 ⇒ k = αc), so the check symbol is a
    full member of the chain and a swap of it with its neighbour is caught too."""
    return ALPHABET[_times_alpha(_chain([_VALUE[c] for c in data]))]


def _group(symbols: str) -> str:
    return "-".join(symbols[i:i + GROUP] for i in range(0, len(symbols), GROUP))


def fingerprint_of(public_key: bytes) -> str:
    """The fingerprint of a raw 32-byte Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key has {PUBLIC_KEY_BYTES} bytes, not {len(public_key)}")
    digest = int.from_bytes(hashlib.sha256(public_key).digest(), "big")
    bits = digest >> (256 - 5 * DATA_SYMBOLS)
    data = "".join(ALPHABET[(bits >> (5 * (DATA_SYMBOLS - 1 - i))) & 31] for i in range(DATA_SYMBOLS))
    return _group(data + check_symbol(data))


def parse_fingerprint(text: str) -> str:
    """A typed fingerprint in its canonical form, or InvalidFingerprint saying what is wrong with it."""
    raw = text.strip().upper()
    symbols = raw.replace("-", "")
    if "-" in raw and raw != _group(symbols):
        raise InvalidFingerprint(f"malformed fingerprint {text.strip()!r}: dashes go between groups of {GROUP}",
                                 "copy it from `metralectl id` on that machine")
    if len(symbols) != SYMBOLS:
        raise InvalidFingerprint(f"malformed fingerprint {text.strip()!r}: {count(len(symbols), 'symbol')}, expected {SYMBOLS}",
                                 "copy it from `metralectl id` on that machine")
    bad = sorted({c for c in symbols if c not in _VALUE})
    if bad:
        extra = " (I, L, O and U are never used)" if set(bad) & set("ILOU") else ""
        raise InvalidFingerprint(f"malformed fingerprint: {''.join(bad)!r} is not a fingerprint symbol{extra}",
                                 "copy it from `metralectl id` on that machine")
    if _chain([_VALUE[c] for c in symbols]) != 0:
        raise InvalidFingerprint(f"fingerprint {text.strip()!r} fails its check symbol: a typo?",
                                 "compare it symbol by symbol with `metralectl id` on that machine")
    return _group(symbols)


def is_fingerprint(text: str) -> bool:
    try:
        parse_fingerprint(text)
    except InvalidFingerprint:
        return False
    return True


def short(fingerprint: str) -> str:
    """The first two groups, for tables (never for trust decisions)."""
    return fingerprint[: 2 * GROUP + 1] + "…"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str, what: str = "value") -> bytes:
    """Strict base64: only the canonical encoding of some bytes is accepted (no stray bits)."""
    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{what} is not valid base64") from exc
    if base64.b64encode(data).decode("ascii") != text:
        raise ValueError(f"{what} is not canonical base64")
    return data


def public_key_from_b64(text: str) -> bytes:
    key = unb64(text, "public key")
    if len(key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"a public key has {PUBLIC_KEY_BYTES} bytes, not {len(key)}")
    return key


def verify_signature(public_key: bytes, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


# -- the key pair on disk -----------------------------------------------------------------------
def identity_dir(base: Path | None = None) -> Path:
    return (base if base is not None else paths.config_dir()) / "identity"


def key_path(base: Path | None = None) -> Path:
    return identity_dir(base) / "ed25519.key"


def public_path(base: Path | None = None) -> Path:
    return identity_dir(base) / "ed25519.pub"


@dataclass(frozen=True)
class Identity:
    private_key: Ed25519PrivateKey
    public_key: bytes  # raw 32 bytes
    fingerprint: str
    path: Path

    @property
    def public_b64(self) -> str:
        return b64(self.public_key)

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)

    def to_json(self) -> dict[str, str]:
        return {"fingerprint": self.fingerprint, "public_key": self.public_b64, "algorithm": "ed25519",
                "key_file": str(self.path)}


def _from_private(private: Ed25519PrivateKey, path: Path) -> Identity:
    from cryptography.hazmat.primitives import serialization

    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return Identity(private, raw, fingerprint_of(raw), path)


def _unsafe_reason(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return f"has mode {mode:04o}: others may read or change it (must be 0600)"
    return None


def load(base: Path | None = None) -> Identity:
    """The existing identity; IdentityError when there is none or it is unsafe to use."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = key_path(base)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise IdentityError(f"no identity yet ({paths.display(path)} does not exist)",
                            "`metralectl id` creates one") from None
    except OSError as exc:
        raise IdentityError(f"cannot open the private key {paths.display(path)}: {exc.strerror}",
                            f"check it: ls -l {paths.display(path)} (a symlink is refused)") from None
    try:
        reason = _unsafe_reason(os.fstat(fd))
        if reason:
            raise IdentityError(f"refusing the private key {paths.display(path)}: it {reason}",
                                f"chmod 600 {paths.display(path)}  (or `metralectl id --fix-permissions`); "
                                "if someone else could read it, make a new identity and pair again")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read()
    finally:
        os.close(fd)
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(f"the private key {paths.display(path)} is corrupt ({exc})",
                            "restore it from a backup, or move it away and run `metralectl id` for a new identity "
                            "(peers must pair again)") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise IdentityError(f"{paths.display(path)} is not an Ed25519 key", "move it away and run `metralectl id`")
    return _from_private(private, path)


def create_exclusive(path: Path, data: bytes, mode: int) -> bool:
    """Write data to path if path does not exist yet; the file has `mode` from its creation on.

    Returns False when another process created it first (theirs is kept).
    """
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may only have narrowed it; make it exact
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and fails if it exists: never replaces a key
        except FileExistsError:
            return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def load_or_create(base: Path | None = None) -> Identity:
    """This box's identity, created on first use."""
    path = key_path(base)
    if os.path.lexists(path):
        return load(base)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    if not create_exclusive(path, pem, 0o600):
        return load(base)  # another process made it a moment ago: use that one
    ident = _from_private(private, path)
    pub = public_path(base)
    pub_text = f"ed25519 {ident.public_b64} {ident.fingerprint}\n".encode()
    if os.path.lexists(pub):
        pub.unlink()
    create_exclusive(pub, pub_text, 0o644)
    return ident


def repair_permissions(base: Path | None = None) -> str | None:
    """Make the key file 0600 (and its directory 0700); returns what was changed, None if nothing."""
    path = key_path(base)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise IdentityError(f"{paths.display(path)} is not a regular file; refusing to touch it",
                            "move it away and run `metralectl id` for a new identity")
    if st.st_uid != os.geteuid():
        raise IdentityError(f"{paths.display(path)} belongs to uid {st.st_uid}",
                            f"sudo chown $USER {paths.display(path)}")
    changed = []
    mode = stat.S_IMODE(st.st_mode)
    if mode != 0o600:
        os.chmod(path, 0o600, follow_symlinks=False)
        changed.append(f"{paths.display(path)}: {mode:04o} -> 0600")
    dmode = stat.S_IMODE(os.stat(path.parent).st_mode)
    if dmode & 0o077:
        os.chmod(path.parent, 0o700)
        changed.append(f"{paths.display(path.parent)}: {dmode:04o} -> 0700")
    return "; ".join(changed) or None


__all__ = [
    "ALPHABET", "Identity", "IdentityError", "InvalidFingerprint", "b64", "check_symbol", "fingerprint_of",
    "is_fingerprint", "key_path", "load", "load_or_create", "parse_fingerprint", "public_key_from_b64",
    "repair_permissions", "short", "unb64", "verify_signature",
]
