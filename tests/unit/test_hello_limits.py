"""A stranger's hellos cannot starve paired peers (issue 19, item 3): hellos are rate-limited per source and
their nonces live apart from the store that signed requests need. Real listener on loopback; the
strangers come from other loopback addresses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metralectl.peers.limits import HELLO_BURST, SourceLimiter, source_key
from metralectl.peers.protocol import NonceStore, sign_request
from metralectl.peers.store import PeerStore
from metralectl.seams import identity
from tests.unit.peer_fixtures import Box, client, send_hello

REPLAY_STORE = 12  # the paired peers' store, made small so a flood would fill it in a few requests


@pytest.fixture()
def node(tmp_path: Path) -> Iterator[Box]:
    box = Box(tmp_path, "b")
    box.node.nonces = NonceStore(box.base / "peers" / "nonces", max_entries=REPLAY_STORE)
    yield box
    box.stop()


def _admission(peer: identity.Identity, node: Box) -> httpx.Response:
    headers = sign_request(peer, node.me.fingerprint, "GET", "/peer/v1/admission")
    with client() as http:
        return http.get(f"http://{node.addr}/peer/v1/admission", headers=headers)


def test_a_hello_flood_does_not_make_paired_peers_get_503(node: Box, tmp_path: Path) -> None:
    paired = identity.load_or_create(tmp_path / "paired")
    PeerStore(node.base).add_paired(paired.fingerprint, paired.public_b64, "127.0.0.1:1", "paired")
    strangers = [identity.load_or_create(tmp_path / f"stranger{i}") for i in range(3)]
    answers = []
    for i in range(3 * REPLAY_STORE):  # from several sources, each within its burst at first
        stranger = strangers[i % 3]
        answers.append(send_hello(stranger, node, source=f"127.0.0.{2 + i % 3}").status_code)
    assert answers.count(200) >= REPLAY_STORE + 1, repr(answers)  # more hellos accepted than the replay store holds
    assert len(node.node.nonces) == 0  # none of them went into it
    for _ in range(REPLAY_STORE):  # the paired peer's signed requests still find room, each one
        answer = _admission(paired, node)
        assert answer.status_code == 200, answer.text


def test_hellos_are_rate_limited_per_source(node: Box, tmp_path: Path) -> None:
    stranger = identity.load_or_create(tmp_path / "stranger")
    codes = [send_hello(stranger, node, source="127.0.0.2").status_code for _ in range(HELLO_BURST + 3)]
    assert codes[:HELLO_BURST] == [200] * HELLO_BURST
    assert codes[HELLO_BURST:] == [429] * 3
    limited = send_hello(stranger, node, source="127.0.0.2")
    assert "too many hellos from 127.0.0.2" in limited.json()["error"]
    assert limited.headers.get("X-Metrale-Signature")  # refused as the node, signed
    assert send_hello(stranger, node, source="127.0.0.3").status_code == 200  # another source is not affected


def test_a_replayed_hello_is_still_refused(node: Box, tmp_path: Path) -> None:
    from tests.unit.peer_fixtures import hello_request

    stranger = identity.load_or_create(tmp_path / "stranger")
    raw, headers = hello_request(stranger, node)
    with client() as http:
        first = http.post(f"http://{node.addr}/peer/v1/hello", content=raw, headers=headers)
        again = http.post(f"http://{node.addr}/peer/v1/hello", content=raw, headers=headers)
    assert first.status_code == 200 and again.status_code == 409


def test_the_bucket_refills_one_per_interval() -> None:
    now = [0.0]
    limit = SourceLimiter(burst=2, every_s=10.0, clock=lambda: now[0])
    assert [limit.take("a"), limit.take("a")] == [0.0, 0.0]
    assert limit.take("a") == pytest.approx(10.0)
    now[0] = 5.0
    assert limit.take("a") == pytest.approx(5.0)  # a refused try costs nothing
    now[0] = 10.0
    assert limit.take("a") == 0.0 and limit.take("a") > 0
    assert limit.take("b") == 0.0  # each source its own bucket


def test_the_limiter_forgets_the_least_recent_source_first() -> None:
    limit = SourceLimiter(burst=1, every_s=100.0, max_sources=2, clock=lambda: 0.0)
    limit.take("a")
    limit.take("b")
    limit.take("a")  # a seen again: b is now the least recent
    limit.take("c")
    assert limit.take("a") > 0  # still remembered: empty
    assert limit.take("b") == 0.0  # forgotten, so full again


@pytest.mark.parametrize("address, key", [
    ("192.0.2.7", "192.0.2.7"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_sources_are_counted_by_address_or_v6_slash_64(address: str, key: str) -> None:
    assert source_key(address) == key
