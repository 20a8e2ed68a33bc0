"""The peer listener's fabric routes over real HTTP on loopback: only a known peer's signed request is answered,
sizes are capped before a byte of filler is read, one probe at a time, and the client's probes measure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metralectl.peers import fabric, fabric_routes
from metralectl.peers.address import parse_address
from metralectl.peers.protocol import sign_request
from metralectl.peers.remote_units import NodeRef
from metralectl.peers.store import PeerStore
from metralectl.seams import identity
from tests.unit.peer_fixtures import Box, raw_exchange
from tests.unit.test_fabric_sysfs import fake_sys


@pytest.fixture()
def pair(tmp_path: Path) -> Iterator[tuple[Box, identity.Identity, NodeRef]]:
    box = Box(tmp_path, "spark2")
    box.node.sys_root = str(fake_sys(tmp_path))
    me = identity.load_or_create(tmp_path / "head")
    PeerStore(box.base).add_paired(me.fingerprint, me.public_b64, "127.0.0.1:1", "head")  # the peer trusts us
    PeerStore(tmp_path / "head").add_paired(box.me.fingerprint, box.me.public_b64, box.addr, "spark2")
    yield box, me, NodeRef(parse_address(box.addr), box.me.fingerprint, box.me.public_key, "spark2")
    box.stop()


def _get(box: Box, me: identity.Identity | None, path: str) -> httpx.Response:
    headers = sign_request(me, box.me.fingerprint, "GET", path) if me is not None else {}
    return httpx.get(f"http://{box.addr}{path}", headers=headers, timeout=10, trust_env=False)


def test_the_report_is_for_known_peers_only(pair, tmp_path: Path) -> None:
    box, me, ref = pair
    assert _get(box, None, "/peer/v1/fabric").status_code == 401
    stranger = identity.load_or_create(tmp_path / "stranger")
    assert _get(box, stranger, "/peer/v1/fabric").status_code == 403
    report, error = fabric._report(me, ref)
    assert error is None and report is not None
    assert sorted(report.links) == ["eno1", "enp1s0f1np1", "veth0"]  # from the node's (fake) sysfs
    assert [d.name for d in report.links["enp1s0f1np1"].rdma] == ["rocep1s0f1"]


def test_by_name_or_address_and_an_unknown_host_is_a_usage_error(pair, tmp_path: Path) -> None:
    box, _, ref = pair
    base = tmp_path / "head"
    assert fabric.resolve("spark2", base).fingerprint == ref.fingerprint
    assert fabric.resolve(box.addr, base).fingerprint == ref.fingerprint
    assert fabric.resolve("127.0.0.1", base).fingerprint == ref.fingerprint  # the host alone: its paired port
    from metralectl.errors import NotFound

    with pytest.raises(NotFound) as caught:
        fabric.resolve("spark9\x1b[2J", base)
    assert "\x1b" not in caught.value.message and "is not a paired peer" in caught.value.message


def test_the_download_is_capped_and_measured(pair) -> None:
    box, me, ref = pair
    too_big = _get(box, me, f"/peer/v1/fabric/source?bytes={fabric_routes.SOURCE_MAX + 1}")
    assert too_big.status_code == 400 and "bytes=N" in too_big.json()["error"]
    assert _get(box, me, "/peer/v1/fabric/source").status_code == 400
    small = _get(box, me, "/peer/v1/fabric/source?bytes=1000")
    assert small.status_code == 200 and small.content == bytes(1000)
    down = fabric._download(me, ref, ref.address)
    assert down.error is None and down.bytes > 0 and down.mbps is not None


def test_the_sink_admits_by_signature_before_reading_the_filler(pair, tmp_path: Path) -> None:
    box, me, ref = pair
    port = box.server.port
    path = "/peer/v1/fabric/sink?bytes=67108864"
    # a stranger announcing 64 MiB is answered at once, without sending any of it
    stranger = identity.load_or_create(tmp_path / "stranger")
    headers = sign_request(stranger, box.me.fingerprint, "POST", path)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    answer = raw_exchange(port, (f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 67108864\r\n\r\n").encode(),
                          timeout=5)
    assert answer.startswith(b"HTTP/1.1 403")
    # a known peer over the cap, or with a length that is not the one asked: 400, nothing read
    big = f"/peer/v1/fabric/sink?bytes={fabric_routes.SINK_MAX + 1}"
    headers = sign_request(me, box.me.fingerprint, "POST", big)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    answer = raw_exchange(port, (f"POST {big} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {fabric_routes.SINK_MAX + 1}"
                                 "\r\n\r\n").encode(), timeout=5)
    assert answer.startswith(b"HTTP/1.1 400")
    up = fabric._upload(me, ref, ref.address, 1 << 20)
    assert up.error is None and up.bytes == 1 << 20


def test_one_probe_at_a_time(pair) -> None:
    box, me, ref = pair
    assert fabric_routes._PROBE.acquire(blocking=False)
    try:
        assert _get(box, me, "/peer/v1/fabric/source?bytes=1000").status_code == 503
        busy = fabric._upload(me, ref, ref.address, 1000)
        assert busy.error is not None and busy.error.startswith("answered 503")
    finally:
        fabric_routes._PROBE.release()
