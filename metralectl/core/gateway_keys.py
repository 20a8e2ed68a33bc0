"""The gateway's API keys: a file of hashed keys, each naming the models it may use (docs/gateway.md, "Keys").

A key is `mk-` and 43 URL-safe characters (32 random bytes): shown once when made, and kept only as its
SHA-256 (a key has 256 bits of entropy, so a fast hash is enough: nothing to brute-force). The file,
`<config>/gateway-keys.json`, is written atomically with mode 0600 and refused when another user could
write it (a key added by someone else would be a way in), as ssh refuses its keys.

No key in the file (or no file) means the gateway answers loopback clients only and asks for no key.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from metralectl import atomicfile, paths
from metralectl.errors import ExitCode, MetralError, UsageError

FILE_NAME = "gateway-keys.json"
FILE_LIMIT = 1024 * 1024
KEY_RE = re.compile(r"mk-[A-Za-z0-9_-]{43}")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")  # recipe names and served ids (org/model:tag)
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
PREFIX_RE = re.compile(r"mk-[A-Za-z0-9_-]{0,13}")
CREATED_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
EVERY_MODEL = "*"
PREFIX_LEN = 11  # "mk-" and 8 characters: enough to tell keys apart in a list, useless to an attacker


class KeysFileError(MetralError):
    exit_code = ExitCode.DATA


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: str  # sha256 of the key, hex
    prefix: str
    models: tuple[str, ...]  # ("*",): every model
    created: str

    def allows(self, *names: str) -> bool:
        """Whether this key may use a model known by any of `names` (the name asked for, its recipe, its ids)."""
        return EVERY_MODEL in self.models or any(n in self.models for n in names)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "sha256": self.digest, "prefix": self.prefix, "models": list(self.models),
                "created": self.created}


@dataclass(frozen=True)
class KeyRing:
    keys: tuple[ApiKey, ...] = ()
    by_digest: dict[str, ApiKey] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, keys: tuple[ApiKey, ...]) -> KeyRing:
        return cls(keys, {k.digest: k for k in keys})

    def __bool__(self) -> bool:
        return bool(self.keys)

    def check(self, token: str) -> ApiKey | None:
        """The key `token` is, or None. The lookup is by the token's hash, so its timing says nothing of a key."""
        if not KEY_RE.fullmatch(token):
            return None
        return self.by_digest.get(digest(token))

    def named(self, name: str) -> ApiKey | None:
        return next((k for k in self.keys if k.name == name), None)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def new_token() -> str:
    return "mk-" + secrets.token_urlsafe(32)  # 32 bytes: 43 characters, no padding


def keys_path() -> Path:
    return paths.config_dir() / FILE_NAME


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"key name {name[:80]!r} is not lower-case letters, digits, '.', '_' or '-' (64 at most)",
                         "for example `metralectl gateway keys add laptop --model qwen3-8b`")
    return name


def check_model(model: str) -> str:
    if model != EVERY_MODEL and not MODEL_RE.fullmatch(model):
        raise UsageError(f"model {model[:80]!r} is not a recipe name or a served model id",
                         "name a recipe (`metralectl list`) or a served id (`metralectl ps`); --all-models for every one")
    return model


def load(path: Path | None = None) -> KeyRing:
    """The keys in the file; an empty ring when there is none. A file another user could write, or one that is
    not this format, is refused (KeysFileError, exit 65): the gateway must not run on keys it cannot trust."""
    path = path or keys_path()
    try:  # O_NOFOLLOW: a link is refused by the open itself, and what is judged (fstat) is what is read
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return KeyRing()
    except OSError as exc:  # ELOOP: a link; EACCES: not ours to read
        why = "a link" if exc.errno == errno.ELOOP else exc.strerror
        raise KeysFileError(f"{path} is not a regular file we can read ({why}): refused",
                            "remove it; `metralectl gateway keys add` writes a new one") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeysFileError(f"{path} is not a regular file (a link or something else): refused",
                                "remove it; `metralectl gateway keys add` writes a new one")
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise KeysFileError(f"{path} can be written by another user (owner uid {info.st_uid}, mode "
                                f"{stat.S_IMODE(info.st_mode):04o}): its keys cannot be trusted",
                                f"`chmod 600 {path}` (and `chown` it to yourself) if its keys are yours")
        os.set_blocking(fd, True)
        raw = _read_capped(fd)
    finally:
        os.close(fd)
    if len(raw) > FILE_LIMIT:
        raise KeysFileError(f"{path} holds more than {FILE_LIMIT >> 20} MiB: not a keys file of ours",
                            "restore it, or remove it and add the keys again")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8 or JSON; RecursionError: nested past Python's stack
        raise KeysFileError(f"{path}: not JSON ({str(exc)[:80]})",
                            "restore it, or remove it and add the keys again") from None
    entries = data.get("keys") if isinstance(data, dict) and data.get("schema") == 1 else None
    if not isinstance(entries, list):
        raise KeysFileError(f"{path}: not a keys file (schema 1 with a `keys` list)",
                            "restore it, or remove it and add the keys again")
    keys: list[ApiKey] = []
    for i, entry in enumerate(entries):
        where = f"{path}: keys[{i}]"
        if not isinstance(entry, dict):
            raise KeysFileError(f"{where} is not an object", "restore the file, or remove the entry")
        name, sha, prefix, models, created = (entry.get(k) for k in ("name", "sha256", "prefix", "models", "created"))
        if not (isinstance(name, str) and NAME_RE.fullmatch(name)):
            raise KeysFileError(f"{where}.name {str(name)[:80]!r} is not a key name", "restore the file")
        if not (isinstance(sha, str) and DIGEST_RE.fullmatch(sha)):
            raise KeysFileError(f"{where}.sha256 is not a SHA-256 in hex", "restore the file, or remove the entry")
        if not (isinstance(models, list) and models and all(isinstance(m, str) and (m == EVERY_MODEL or
                                                                                    MODEL_RE.fullmatch(m)) for m in models)):
            raise KeysFileError(f"{where}.models is not a list of model names (or \"*\")", "restore the file")
        if any(k.name == name for k in keys):
            raise KeysFileError(f"{where}: the name {name!r} is used twice", "remove one of them")
        # prefix and created are only shown: kept when they are what `add` writes, else blank (never raw text)
        keys.append(ApiKey(name, sha, prefix if isinstance(prefix, str) and PREFIX_RE.fullmatch(prefix) else "",
                           tuple(models), created if isinstance(created, str) and CREATED_RE.fullmatch(created) else ""))
    return KeyRing.of(tuple(keys))


def _read_capped(fd: int) -> bytes:
    """At most FILE_LIMIT + 1 bytes of the open file, whatever its st_size says."""
    chunks, left = [], FILE_LIMIT + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def save(ring: KeyRing, path: Path | None = None) -> None:
    path = path or keys_path()
    body = {"schema": 1, "keys": [k.to_json() for k in ring.keys]}
    atomicfile.write_atomic(path, json.dumps(body, indent=2) + "\n", mode=0o600)


def add(name: str, models: tuple[str, ...], path: Path | None = None) -> tuple[str, ApiKey]:
    """A new key for `models`: (the key, shown once; its entry, as saved)."""
    ring = load(path)
    check_name(name)
    if ring.named(name) is not None:
        raise UsageError(f"a key named {name!r} exists already", f"`metralectl gateway keys rm {name}` first, or "
                         "choose another name")
    token = new_token()
    entry = ApiKey(name, digest(token), token[:PREFIX_LEN], tuple(check_model(m) for m in models),
                   time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    save(KeyRing.of((*ring.keys, entry)), path)
    return token, entry


def remove(name: str, path: Path | None = None) -> ApiKey:
    ring = load(path)
    found = ring.named(name)
    if found is None:
        names = ", ".join(k.name for k in ring.keys) or "none"
        raise UsageError(f"no key named {name[:80]!r}", f"keys: {names} (`metralectl gateway keys list`)")
    save(KeyRing.of(tuple(k for k in ring.keys if k.name != name)), path)
    return found


class KeyWatch:
    """The ring the gateway checks, re-read when the file changes (a revoked key stops working within the gateway's
    lifecycle poll, 50 ms). A file that turns bad keeps the last good ring and says why (`error`)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or keys_path()
        self.seen: tuple[int, int, int] | None = None
        self.error: str | None = None
        self.ring = load(self.path)  # a bad file at start: the gateway does not start
        self.seen = self._stamp()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size, info.st_ino

    def poll(self) -> bool:
        """Re-read the file if it changed; whether the ring changed."""
        stamp = self._stamp()
        if stamp == self.seen:
            return False
        self.seen = stamp
        try:
            ring = load(self.path)
        except MetralError as exc:
            self.error = str(exc)
            return False
        self.error = None
        changed = ring.keys != self.ring.keys
        self.ring = ring
        return changed
