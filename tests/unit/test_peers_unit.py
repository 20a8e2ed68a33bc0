"""Peers without the network: address parsing, the request signature and replay rules, the nonce store,
the peer store's trust rules, bench.yaml, and the admission checks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from metralectl.seams import identity
from metralectl.peers import PEER_PORT
from metralectl.peers.address import BadAddress, PeerAddress, parse_address
from metralectl.peers.admission import Facts, GpuFact, judge
from metralectl.peers.config import (
    BenchConfig,
    BenchConfigError,
    bench_path,
    load_bench_config,
    save_bench_config,
)
from metralectl.peers.protocol import (
    MAX_WINDOW_S,
    NonceStore,
    Refusal,
    SignedRequest,
    sign_request,
    sign_response,
    verify_request,
    verify_response,
)
from metralectl.peers.store import PeerKeyChanged, PeerStore, known_keys


@pytest.mark.parametrize("text, host, port", [
    ("192.168.1.20", "192.168.1.20", PEER_PORT),
    ("192.168.1.20:9000", "192.168.1.20", 9000),
    ("[fe80::1]:9000", "fe80::1", 9000),
    ("[::1]", "::1", PEER_PORT),
    ("fe80::0001", "fe80::1", PEER_PORT),
    ("[fe80::1%eth0]:9", "fe80::1%eth0", 9),
    ("spark2.local", "spark2.local", PEER_PORT),
    ("Spark2.Example.COM.:8899", "spark2.example.com", 8899),
    ("localhost:1", "localhost", 1),
])
def test_addresses(text: str, host: str, port: int) -> None:
    assert parse_address(text) == PeerAddress(host, port)


@pytest.mark.parametrize("text", ["", "http://x", "x:0", "x:65536", "x:port", "[::1", "[::1]9", "[nope]:1",
                                  "-bad.example", "a..b", "under score!"])
def test_bad_addresses(text: str) -> None:
    with pytest.raises(BadAddress):
        parse_address(text)


def test_netloc_and_url() -> None:
    assert parse_address("[::1]:5").netloc == "[::1]:5"
    assert parse_address("[::1]:5").url("/p") == "http://[::1]:5/p"
    assert parse_address("h.local").url("/p") == f"http://h.local:{PEER_PORT}/p"


# -- request signatures -------------------------------------------------------------------------
@pytest.fixture()
def pair_of_keys(tmp_path: Path) -> tuple[identity.Identity, identity.Identity]:
    return identity.load_or_create(tmp_path / "a"), identity.load_or_create(tmp_path / "b")


def _verify(headers: dict[str, str], a: identity.Identity, b: identity.Identity, nonces: NonceStore, *,
            path: str = "/peer/v1/admission", body: bytes = b"", now: float | None = None) -> SignedRequest | Refusal:
    return verify_request(headers, "GET", path, body, me=b.fingerprint,
                          keys=lambda fp: a.public_key if fp == a.fingerprint else None, nonces=nonces, now=now)


def test_signed_request_accepted_once(pair_of_keys: tuple[identity.Identity, identity.Identity]) -> None:
    a, b = pair_of_keys
    nonces = NonceStore()
    headers = sign_request(a, b.fingerprint, "GET", "/peer/v1/admission")
    assert isinstance(_verify(headers, a, b, nonces), SignedRequest)
    replay = _verify(headers, a, b, nonces)
    assert isinstance(replay, Refusal) and replay.status == 409 and "replayed" in replay.reason


def test_request_refusals(pair_of_keys: tuple[identity.Identity, identity.Identity]) -> None:
    a, b = pair_of_keys
    nonces = NonceStore()
    t = 1_800_000_000
    h = sign_request(a, b.fingerprint, "GET", "/peer/v1/admission", now=t)
    expired = _verify(h, a, b, nonces, now=t + 61)
    assert isinstance(expired, Refusal) and "expired" in expired.reason
    future = _verify(sign_request(a, b.fingerprint, "GET", "/peer/v1/admission", now=t + 100), a, b, nonces, now=t)
    assert isinstance(future, Refusal) and "future" in future.reason
    too_long = _verify(sign_request(a, b.fingerprint, "GET", "/x", now=t, ttl_s=MAX_WINDOW_S + 1), a, b, nonces,
                       path="/x", now=t)
    assert isinstance(too_long, Refusal) and "lifetime" in too_long.reason
    other_node = _verify(sign_request(a, a.fingerprint, "GET", "/x"), a, b, nonces, path="/x")
    assert isinstance(other_node, Refusal) and other_node.status == 403
    tampered_path = _verify(sign_request(a, b.fingerprint, "GET", "/x"), a, b, nonces, path="/y")
    assert isinstance(tampered_path, Refusal) and "bad signature" in tampered_path.reason
    tampered_body = _verify(sign_request(a, b.fingerprint, "GET", "/x", b"1"), a, b, nonces, path="/x", body=b"2")
    assert isinstance(tampered_body, Refusal) and tampered_body.status == 401
    unknown = verify_request(sign_request(b, a.fingerprint, "GET", "/x"), "GET", "/x", b"", me=a.fingerprint,
                             keys=lambda fp: None, nonces=nonces)
    assert isinstance(unknown, Refusal) and "unknown peer" in unknown.reason
    assert isinstance(_verify({}, a, b, nonces), Refusal)
    assert len(nonces) == 0  # nothing unauthenticated or stale ever reached the store


def test_nonce_store_persists_across_restart_and_forgets_expired(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    path = tmp_path / "nonces"
    store = NonceStore(path, clock=lambda: now[0])
    assert store.check_and_add("n" * 20, int(now[0]) + 60) is None
    assert store.check_and_add("m" * 20, int(now[0]) + 5) is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    restarted = NonceStore(path, clock=lambda: now[0])
    assert isinstance(restarted.check_and_add("n" * 20, int(now[0]) + 60), Refusal)
    now[0] += 100  # both requests have expired: their nonces are no longer needed
    later = NonceStore(path, clock=lambda: now[0])
    assert len(later) == 0


def test_nonce_store_is_bounded_without_forgetting_live_nonces() -> None:
    now = 1_800_000_000.0
    store = NonceStore(max_entries=3, clock=lambda: now)
    for i in range(3):
        assert store.check_and_add(f"{i}" * 20, int(now) + 60) is None
    full = store.check_and_add("x" * 20, int(now) + 60)
    assert isinstance(full, Refusal) and full.status == 503
    assert isinstance(store.check_and_add("0" * 20, int(now) + 60), Refusal)  # still remembered


def test_response_signature(pair_of_keys: tuple[identity.Identity, identity.Identity]) -> None:
    a, b = pair_of_keys
    headers = sign_response(b, 200, "nonce" * 4, a.fingerprint, b"{}")
    ok = verify_response(headers, 200, b"{}", nonce="nonce" * 4, me=a.fingerprint, expect_key=b.fingerprint,
                         public=b.public_key)
    assert ok is None
    assert verify_response(headers, 200, b"{ }", nonce="nonce" * 4, me=a.fingerprint, expect_key=b.fingerprint,
                           public=b.public_key)
    assert verify_response(headers, 403, b"{}", nonce="nonce" * 4, me=a.fingerprint, expect_key=b.fingerprint,
                           public=b.public_key)
    assert verify_response(headers, 200, b"{}", nonce="other" * 4, me=a.fingerprint, expect_key=b.fingerprint,
                           public=b.public_key)


# -- the peer store -----------------------------------------------------------------------------
def test_tofu_then_changed_key_refused(pair_of_keys: tuple[identity.Identity, identity.Identity], tmp_path: Path) -> None:
    a, b = pair_of_keys
    store = PeerStore(tmp_path / "me")
    peer, how = store.add_paired(a.fingerprint, a.public_b64, "10.0.0.2:8899", "spark1")
    assert how == "paired" and peer.grants == ()
    assert store.add_paired(a.fingerprint, a.public_b64, "10.0.0.2:8899", "spark1")[1] == "already paired"
    with pytest.raises(PeerKeyChanged, match="KEY CHANGED"):
        store.add_paired(b.fingerprint, b.public_b64, "10.0.0.2:8899", "spark1")
    assert "address updated" in store.add_paired(a.fingerprint, a.public_b64, "10.0.0.3:8899", "spark1")[1]
    assert store.grant(a.fingerprint)[0].grants == ("bench",)
    assert known_keys(tmp_path / "me", include_self=False) == {a.fingerprint: a.public_key}
    store.revoke(a.fingerprint)
    assert store.load().peers == []
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_pending_hello_needs_the_typed_fingerprint(pair_of_keys: tuple[identity.Identity, identity.Identity],
                                                   tmp_path: Path) -> None:
    a, b = pair_of_keys
    store = PeerStore(tmp_path / "me")
    store.add_pending(a.fingerprint, a.public_b64, "spark1", "10.0.0.2:8899")
    assert store.known_keys() == {}  # a hello trusts nothing
    from metralectl.errors import NotFound

    with pytest.raises(NotFound):
        store.grant(b.fingerprint)
    peer, how = store.grant(a.fingerprint)
    assert "trusted from its hello" in how and peer.via == "hello" and peer.grants == ("bench",)
    for i in range(50):
        other = identity.fingerprint_of(bytes([i]) * 32)
        store.add_pending(other, identity.b64(bytes([i]) * 32), f"n{i}", "x:1")
    assert len(store.load().pending) == 32


def test_damaged_store_is_an_error(tmp_path: Path, pair_of_keys: tuple[identity.Identity, identity.Identity]) -> None:
    a, b = pair_of_keys
    store = PeerStore(tmp_path / "me")
    store.add_paired(a.fingerprint, a.public_b64, "h:1", "n")
    text = store.path.read_text().replace(a.public_b64, b.public_b64)  # a key swapped under a fingerprint
    store.path.write_text(text)
    from metralectl.errors import MetralError

    with pytest.raises(MetralError, match="damaged"):
        store.load()


# -- bench.yaml and admission -------------------------------------------------------------------
def test_bench_yaml_defaults_round_trip_and_errors(tmp_path: Path) -> None:
    assert load_bench_config(tmp_path) == BenchConfig()
    save_bench_config(BenchConfig(enabled=True, hardware_class="gb10", memory_floor_gb=8, disk_floor_gb=20), tmp_path)
    got = load_bench_config(tmp_path)
    assert (got.enabled, got.hardware_class, got.memory_floor_gb, got.disk_floor_gb, got.exists) == (True, "gb10", 8, 20, True)
    bench_path(tmp_path).write_text("enabled: yes-please\n")
    with pytest.raises(BenchConfigError, match="true or false"):
        load_bench_config(tmp_path)
    bench_path(tmp_path).write_text("enabled: true\nfloor: {}\n")
    with pytest.raises(BenchConfigError, match="unknown key") as info:
        load_bench_config(tmp_path)
    assert "floors" in (info.value.hint or "")
    bench_path(tmp_path).write_text("floors: {memory_gb: -1}\n")
    with pytest.raises(BenchConfigError, match="memory_gb"):
        load_bench_config(tmp_path)


GOOD = Facts(gpu=lambda: GpuFact("NVIDIA GB10", "gb10"), busy=lambda: None, queued=lambda: 0,
             memory=lambda: 100 * 10**9, disk=lambda p: 500 * 10**9)


def test_admitted_when_everything_holds() -> None:
    answer = judge(BenchConfig(enabled=True, exists=True), fingerprint="FP", name="n", facts=GOOD,
                   requester_grants=("bench",))
    assert answer.admitted and answer.hardware_class == "gb10" and answer.gpu == "NVIDIA GB10"
    assert [c.id for c in answer.checks] == ["bench.enabled", "grant", "hardware_class", "signer", "busy", "queue",
                                             "memory", "disk", "gpu"]


def test_every_refusal_has_its_reason() -> None:
    bad = Facts(gpu=lambda: GpuFact(None, None, "no NVIDIA driver", "install it"), busy=lambda: "swap to qwen (pid 9)",
                queued=lambda: 2, memory=lambda: 1 * 10**9, disk=lambda p: 1 * 10**9)
    answer = judge(BenchConfig(), fingerprint="FP", name="n", facts=bad, requester_grants=())
    assert not answer.admitted
    reasons = {c.id: c for c in answer.reasons}
    assert set(reasons) == {"bench.enabled", "grant", "hardware_class", "busy", "queue", "memory", "disk", "gpu"}
    assert "no NVIDIA driver" in reasons["gpu"].detail and reasons["gpu"].remedy == "install it"
    assert reasons["busy"].detail == "busy: swap to qwen (pid 9) holds the lifecycle lock"
    assert "floor 16 GB" in reasons["memory"].detail
    hw_from_yaml = judge(BenchConfig(enabled=True, hardware_class="h200"), fingerprint="FP", name="n", facts=bad)
    assert hw_from_yaml.hardware_class == "h200"
    assert "grant" not in {c.id for c in hw_from_yaml.checks}  # asked locally: no grant involved


def test_busy_uses_the_lifecycle_lock() -> None:
    from metralectl.seams.store import lifecycle_lock

    facts = Facts(gpu=GOOD.gpu, memory=GOOD.memory, disk=GOOD.disk)  # the real busy()
    config = BenchConfig(enabled=True)
    assert judge(config, fingerprint="FP", name="n", facts=facts).admitted
    with lifecycle_lock("swap to x"):
        answer = judge(config, fingerprint="FP", name="n", facts=facts)
    assert not answer.admitted and [c.id for c in answer.reasons] == ["busy"]
    assert "swap to x (pid" in answer.reasons[0].detail
    # a peer's unit holding the lock is not "busy": the queue check counts it (and lets more units wait)
    with lifecycle_lock("bench unit certify-1 for peer ABCD"):
        assert judge(config, fingerprint="FP", name="n", facts=facts).admitted


def test_a_unit_holding_the_lock_tells_a_local_swap_how_to_stop_it() -> None:
    from metralectl.seams.store import Busy, lifecycle_lock, lock_holder

    assert lock_holder() is None
    with lifecycle_lock("bench unit certify-1 for peer ABCD"):
        assert lock_holder() == f"bench unit certify-1 for peer ABCD (pid {os.getpid()})"
        with pytest.raises(Busy) as refused:
            with lifecycle_lock("swap qwen"):
                pass
    assert "bench unit certify-1 for peer ABCD" in refused.value.message
    assert refused.value.hint and "metralectl peer units --cancel certify-1" in refused.value.hint
    assert lock_holder() is None


def test_an_interrupted_swap_is_reported_while_a_peers_unit_holds_the_lock() -> None:
    from metralectl.seams import store
    from metralectl.lifecycle.swap import describe_journal, journal_path

    store.write_json(journal_path(), {"old": {"recipe": "a"}, "new": {"recipe": "b"}, "phase": "booting", "pid": 1})
    assert describe_journal() and "from a to b was interrupted while booting" in str(describe_journal())
    with store.lifecycle_lock("swap b"):
        assert describe_journal() is None  # a swap is running: its journal is live
    with store.lifecycle_lock("bench unit certify-1 for peer ABCD"):
        assert "was interrupted" in str(describe_journal())
