"""Identity: the key pair on disk (0600 from creation, unsafe files refused) and the fingerprint's check symbol."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metralectl.seams import identity
from metralectl.seams.identity import ALPHABET, InvalidFingerprint, fingerprint_of, parse_fingerprint

REPO = Path(__file__).resolve().parents[2]


def _fingerprints(n: int) -> list[str]:
    return [fingerprint_of(bytes([i]) * 32) for i in range(n)]


def test_fingerprint_shape_and_round_trip() -> None:
    fp = fingerprint_of(b"\x01" * 32)
    groups = fp.split("-")
    assert len(groups) == 7 and all(len(g) == 4 for g in groups)
    assert set(fp.replace("-", "")) <= set(ALPHABET)
    assert parse_fingerprint(fp) == fp
    assert parse_fingerprint(fp.lower()) == fp
    assert parse_fingerprint("  " + fp.replace("-", "") + "\n") == fp


@pytest.mark.parametrize("fp", _fingerprints(6))
def test_every_single_character_typo_is_caught(fp: str) -> None:
    candidates = set(ALPHABET) | set("ILOU-_ .0") | set(ALPHABET.lower())
    for i, original in enumerate(fp):
        for c in candidates:
            if c.upper() == original:
                continue  # the same symbol (fingerprints are case-insensitive)
            typo = fp[:i] + c + fp[i + 1:]
            with pytest.raises(InvalidFingerprint):
                parse_fingerprint(typo)


@pytest.mark.parametrize("fp", _fingerprints(6))
def test_every_adjacent_swap_is_caught(fp: str) -> None:
    for i in range(len(fp) - 1):
        if fp[i] == fp[i + 1]:
            continue
        swapped = fp[:i] + fp[i + 1] + fp[i] + fp[i + 2:]
        with pytest.raises(InvalidFingerprint):
            parse_fingerprint(swapped)
    compact = fp.replace("-", "")  # also in the dash-less form, where group borders do not separate
    for i in range(len(compact) - 1):
        if compact[i] != compact[i + 1]:
            with pytest.raises(InvalidFingerprint):
                parse_fingerprint(compact[:i] + compact[i + 1] + compact[i] + compact[i + 2:])


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.data())
def test_random_keys_typos_and_swaps(key: bytes, data: st.DataObject) -> None:
    symbols = fingerprint_of(key).replace("-", "")
    i = data.draw(st.integers(0, len(symbols) - 1))
    c = data.draw(st.sampled_from(ALPHABET).filter(lambda x: x != symbols[i]))
    with pytest.raises(InvalidFingerprint):
        parse_fingerprint(symbols[:i] + c + symbols[i + 1:])
    j = data.draw(st.integers(0, len(symbols) - 2))
    if symbols[j] != symbols[j + 1]:
        with pytest.raises(InvalidFingerprint):
            parse_fingerprint(symbols[:j] + symbols[j + 1] + symbols[j] + symbols[j + 2:])


def test_malformed_fingerprints_say_why() -> None:
    fp = fingerprint_of(b"\x02" * 32)
    with pytest.raises(InvalidFingerprint, match="I, L, O and U"):
        parse_fingerprint(fp[:-1] + "O")
    with pytest.raises(InvalidFingerprint, match="symbols"):
        parse_fingerprint(fp[:-2])
    with pytest.raises(InvalidFingerprint, match="dashes"):
        parse_fingerprint(fp[:3] + "-" + fp[3:].replace("-", "", 1))
    with pytest.raises(InvalidFingerprint, match="check symbol"):
        parse_fingerprint(fp[:-1] + ("0" if fp[-1] != "0" else "1"))


def test_key_created_0600_and_reloaded(isolated_env: Path) -> None:
    me = identity.load_or_create()
    path = identity.key_path()
    assert path == isolated_env / "config" / "identity" / "ed25519.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = identity.load()
    assert again.fingerprint == me.fingerprint and again.public_key == me.public_key
    assert identity.public_path().read_text().split()[2] == me.fingerprint
    assert identity.verify_signature(me.public_key, me.sign(b"x"), b"x")


def test_key_is_0600_even_under_a_permissive_umask() -> None:
    old = os.umask(0)
    try:
        identity.load_or_create()
    finally:
        os.umask(old)
    assert stat.S_IMODE(identity.key_path().stat().st_mode) == 0o600


def test_a_loose_key_is_refused_loudly_then_repaired() -> None:
    identity.load_or_create()
    path = identity.key_path()
    os.chmod(path, 0o644)
    with pytest.raises(identity.IdentityError, match="mode 0644") as info:
        identity.load()
    assert info.value.hint and "chmod 600" in info.value.hint
    assert "0644 -> 0600" in (identity.repair_permissions() or "")
    identity.load()
    assert identity.repair_permissions() is None


def test_a_symlinked_key_is_refused(tmp_path: Path) -> None:
    identity.load_or_create()
    path = identity.key_path()
    real = tmp_path / "elsewhere.key"
    path.rename(real)
    path.symlink_to(real)
    with pytest.raises(identity.IdentityError):
        identity.load()


def test_concurrent_creation_agrees_on_one_key() -> None:
    results: list[str] = []

    def make() -> None:
        results.append(identity.load_or_create().fingerprint)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    assert [p.name for p in identity.identity_dir().iterdir() if p.name.startswith(".")] == []


def test_config_dir_env_selects_the_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = identity.load_or_create().fingerprint
    monkeypatch.setenv("METRALECTL_CONFIG_DIR", str(tmp_path / "other"))
    assert identity.load_or_create().fingerprint != first


def test_cli_id_json_and_help_stays_light(isolated_env: Path) -> None:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(isolated_env / "config")}
    out = subprocess.run([sys.executable, "-m", "metralectl", "id", "--json"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    data = json.loads(out.stdout)
    assert parse_fingerprint(data["fingerprint"]) == data["fingerprint"]
    assert "created a new identity" in out.stderr
    code = ("import sys, runpy\nsys.argv = ['metralectl', '--help']\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('LOADED=' + ','.join(m for m in ('cryptography', 'httpx', 'metralectl.agent', 'metralectl.peers')"
            " if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert out.stderr.rstrip().endswith("LOADED="), out.stderr
