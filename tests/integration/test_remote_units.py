"""Remote benchmark units between two nodes on loopback, over real HTTP, with real `metralectl bench run`
children measuring a real engine double and signing with the node's key.

Pair + grant, submit (idempotent), follow the event stream through a proxy that cuts the link and then
goes silent (the follower re-attaches from the last event: nothing lost, nothing twice), fetch and verify
the record; replayed/expired/unpaired/ungranted submissions refused; cancel; a tampered record rejected.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metralectl.errors import ExitCode
from metralectl.seams import identity, store
from metralectl.bench import signed
from metralectl.peers import remote_units as ru
from metralectl.peers.protocol import sign_request
from metralectl.peers.store import known_keys
from tests.integration.peer_nodes import EngineDouble, PeerNode, pair_and_grant

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def double() -> Iterator[EngineDouble]:
    d = EngineDouble(itl_ms=4.0)
    yield d
    d.stop()


@pytest.fixture()
def pair(tmp_path: Path, double: EngineDouble) -> Iterator[tuple[Path, identity.Identity, PeerNode]]:
    """This box (config dir + key) and one node granted it bench, benchmarking the double."""
    here = tmp_path / "here"
    me = identity.load_or_create(here)
    node = PeerNode(tmp_path, "node1", endpoint=double.url)
    pair_and_grant(here, me, "here", node)
    yield here, me, node
    node.stop()


def _spec(key: str, **params: Any) -> dict[str, Any]:
    # client_bound=warn: these tests are about the units and their records; a busy box's load generator judged
    # client-bound (seen on CI) must not fail the run they fetch and verify
    return {"key": key, "suite": "decode",
            "params": {"repeats": 3, "max_tokens": 16, "warmup": 1, "client_bound": "warn", **params}, "timeout_s": 120}


def _run_to_end(me: identity.Identity, ref: ru.NodeRef, key: str) -> tuple[list[dict[str, Any]], ru.Followed]:
    seen: list[dict[str, Any]] = []
    followed = ru.follow(me, ref, key, seen.append, read_timeout=5)
    return seen, followed


def test_submit_follow_fetch_verify_and_idempotency(pair: tuple[Path, identity.Identity, PeerNode],
                                                    tmp_path: Path) -> None:
    here, me, node = pair
    ref = ru.NodeRef.lookup(node.addr, here)
    unit, created = ru.submit(me, ref, _spec("certify-r1-node1-decode"))
    assert created and unit["state"] in ("queued", "running")
    again, created_again = ru.submit(me, ref, _spec("certify-r1-node1-decode", repeats="3"))  # same body, as text
    assert not created_again and again["digest"] == unit["digest"]
    with pytest.raises(ru.UnitRefused, match="different body") as conflict:
        ru.submit(me, ref, _spec("certify-r1-node1-decode", repeats=4))
    assert conflict.value.status == 409

    seen, followed = _run_to_end(me, ref, "certify-r1-node1-decode")
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    kinds = [e["kind"] for e in seen]
    assert kinds[0] == "queued" and "started" in kinds and "stage-done" in kinds and kinds[-1] == "end"
    assert followed.end["data"]["state"] == "completed" and followed.losses == 0

    dest = tmp_path / "fetched"
    got = ru.fetch_record(me, ref, "certify-r1-node1-decode", dest, known=known_keys(here), suite="decode")
    assert got.signer == node.me.fingerprint and got.names["unit"] == "certify-r1-node1-decode"
    assert got.record["unit"]["requester"] == me.fingerprint and got.record["source"] == f"peer:{me.fingerprint}"
    assert got.record["stages"][0]["summary"]["ok"] == 3
    # the kept copy verifies later with the same keys (this box's view: the node is a known peer)
    from metralectl.seams import signing
    verdict = signing.verify_file(dest / "run.json", known_keys(here), expect={"unit": "certify-r1-node1-decode"})
    assert verdict.ok and verdict.signer == node.me.fingerprint
    # and the node's admission counts nothing queued once it is done
    assert node.node.units.waiting() == 0
    # the node's operator sees it (read-only: listing never takes units over from the running agent)
    import subprocess
    import sys

    listed = subprocess.run([sys.executable, "-m", "metralectl", "peer", "units", "--json"], capture_output=True,
                            text=True, env={**os.environ, "METRALE_HOME": str(node.home)}, timeout=60)
    assert listed.returncode == 0, listed.stderr
    shown = json.loads(listed.stdout)
    assert [(u["key"], u["state"], u["requester"]) for u in shown] == [("certify-r1-node1-decode", "completed",
                                                                         me.fingerprint)]


class CuttingProxy:
    """TCP proxy in front of a node. Connection 1 is cut after `cut_after` lines; connection 2 goes silent
    after `stall_after` lines (the link is up but nothing arrives); later connections pass everything."""

    def __init__(self, target_port: int, cut_after: int, stall_after: int) -> None:
        self.target_port = target_port
        self.plan = [("cut", cut_after), ("stall", stall_after)]
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            mode = self.plan[self.connections] if self.connections < len(self.plan) else ("pass", 0)
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, mode), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, mode: tuple[str, int] | None) -> None:
        lines = 0
        body = False
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if mode is not None and mode[0] != "pass":
                    out = bytearray()
                    for byte in data:
                        out.append(byte)
                        if byte == 10:
                            if body:
                                lines += 1
                            elif out.endswith(b"\r\n\r\n"):
                                body = True  # the response headers are through; count body lines from here
                            if body and lines >= mode[1]:
                                break
                    dst.sendall(bytes(out))
                    if body and lines >= mode[1]:
                        if mode[0] == "cut":
                            break
                        threading.Event().wait(60)  # stall: hold the connection open, forward nothing
                        break
                    continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass


def test_lost_link_mid_stream_resumes_from_the_last_event(pair: tuple[Path, identity.Identity, PeerNode]) -> None:
    here, me, node = pair
    proxy = CuttingProxy(node.server.port, cut_after=2, stall_after=1)
    try:
        ref = ru.NodeRef.lookup(node.addr, here)
        via_proxy = ru.NodeRef(ru.parse_address(f"127.0.0.1:{proxy.port}"), ref.fingerprint, ref.public_key)
        ru.submit(me, ref, _spec("certify-r2-node1-decode", repeats=12, max_tokens=48))
        seen: list[dict[str, Any]] = []
        losses: list[str] = []
        followed = ru.follow(me, via_proxy, "certify-r2-node1-decode", seen.append, read_timeout=2.5,
                             on_loss=lambda n, why: losses.append(why))
    finally:
        proxy.close()
    assert followed.losses == 2 and len(losses) == 2 and proxy.connections >= 3, losses
    assert [e["seq"] for e in seen] == list(range(1, followed.last_seq + 1))  # no gap, no repeat
    end = seen[-1]
    assert end["kind"] == "end", end
    # The unit's outcome is the benchmark's own: on a box busy enough that the load generator, not the server, set
    # the numbers, the bench fails it as client-bound, honestly (seen in CI beside another test worker). That is
    # not this test's subject; any other failure is.
    assert end["data"]["state"] == "completed" or (
        end["data"]["state"] == "failed" and "client-bound" in end["message"]), end
    assert end["data"]["state"] == node.node.units.get("certify-r2-node1-decode").state
    # the events a follower saw are exactly the node's own log
    node_events = node.node.units.get("certify-r2-node1-decode").events
    assert [(e["seq"], e["kind"]) for e in node_events] == [(e["seq"], e["kind"]) for e in seen]


def _post_units(node: PeerNode, headers: dict[str, str], body: bytes) -> httpx.Response:
    return httpx.post(f"http://{node.addr}/peer/v1/units", content=body,
                      headers={**headers, "Content-Type": "application/json"}, timeout=10, trust_env=False)


def test_replayed_expired_unpaired_and_ungranted_submissions_refused(
        pair: tuple[Path, identity.Identity, PeerNode], tmp_path: Path) -> None:
    here, me, node = pair
    body = json.dumps(_spec("certify-r3-node1-decode")).encode()
    headers = sign_request(me, node.me.fingerprint, "POST", "/peer/v1/units", body)
    assert _post_units(node, headers, body).status_code == 202
    replay = _post_units(node, headers, body)
    assert replay.status_code == 409 and "replayed" in replay.json()["error"]
    expired = _post_units(node, sign_request(me, node.me.fingerprint, "POST", "/peer/v1/units", body,
                                             now=time.time() - 400), body)
    assert expired.status_code == 401 and "expired" in expired.json()["error"]
    stranger = identity.load_or_create(tmp_path / "stranger")
    unpaired = _post_units(node, sign_request(stranger, node.me.fingerprint, "POST", "/peer/v1/units", body), body)
    assert unpaired.status_code == 403 and "unknown peer" in unpaired.json()["error"]
    # known (it paired the node itself, so the node has its hello; promoted without the bench grant)
    other_base = tmp_path / "other"
    other = identity.load_or_create(other_base)
    from metralectl.peers import ops
    from metralectl.peers.store import PeerStore

    ops.pair(node.addr, other, base=other_base, confirm=lambda r, w: True, name="other")
    store = PeerStore(node.base)
    pending = store.load().pending[0]
    store.add_paired(pending.fingerprint, pending.public_key, None, "other")
    with pytest.raises(ru.UnitRefused, match="not granted you bench") as refused:
        ru.submit(other, ru.NodeRef.lookup(node.addr, other_base), _spec("certify-r3-other-decode"))
    assert refused.value.status == 403
    with pytest.raises(ru.UnitRefused, match="unknown parameter") as bad:
        ru.submit(me, ru.NodeRef.lookup(node.addr, here), {**_spec("certify-r3-bad"), "params": {"nope": 1}})
    assert bad.value.status == 400
    # another peer cannot see, follow, fetch or cancel my unit
    with pytest.raises(ru.UnitRefused) as hidden:
        ru.unit_state(other, ru.NodeRef.lookup(node.addr, other_base), "certify-r3-node1-decode")
    assert hidden.value.status in (403, 404)
    _run_to_end(me, ru.NodeRef.lookup(node.addr, here), "certify-r3-node1-decode")


def test_cancel_a_running_unit_and_no_record_is_served(pair: tuple[Path, identity.Identity, PeerNode]) -> None:
    here, me, node = pair
    ref = ru.NodeRef.lookup(node.addr, here)
    ru.submit(me, ref, _spec("certify-r4-node1-decode", repeats=200, max_tokens=64))
    deadline = time.monotonic() + 30
    while ru.unit_state(me, ref, "certify-r4-node1-decode")["state"] != "running" or \
            not any(e["kind"] == "stage" for e in node.node.units.get("certify-r4-node1-decode").events):
        assert time.monotonic() < deadline, "the unit never started measuring"
        time.sleep(0.1)
    t0 = time.monotonic()
    ru.cancel(me, ref, "certify-r4-node1-decode")
    seen, followed = _run_to_end(me, ref, "certify-r4-node1-decode")
    assert followed.end["data"]["state"] == "cancelled" and time.monotonic() - t0 < 15
    unit = node.node.units.get("certify-r4-node1-decode")
    assert unit.record_status == "interrupted"  # the child wrote its record as interrupted (the CLI's Ctrl-C path)
    with pytest.raises(ru.UnitRefused, match="no completed record") as refused:
        ru.fetch_record(me, ref, "certify-r4-node1-decode", Path(unit.run_dir or "/nonexistent") / "x",
                        known=known_keys(here))
    assert refused.value.status == 409


def test_a_running_unit_holds_the_lifecycle_lock_and_the_nodes_operator_can_stop_it(
        pair: tuple[Path, identity.Identity, PeerNode]) -> None:
    """While a peer's unit measures, nobody on the node launches, swaps or stops under it: the lock names
    the unit and the way to stop it, and `metralectl peer units --cancel KEY` on the node (through its
    agent) does; the requester sees the unit end cancelled by the operator, and the lock is free again."""
    here, me, node = pair
    ref = ru.NodeRef.lookup(node.addr, here)
    key = "certify-r6-node1-decode"
    ru.submit(me, ref, _spec(key, repeats=200, max_tokens=64))
    deadline = time.monotonic() + 30
    while not any(e["kind"] == "stage" for e in node.node.units.get(key).events):
        assert time.monotonic() < deadline, "the unit never started measuring"
        time.sleep(0.1)
    holder = store.lock_holder(node.lock_path)
    assert holder and holder.startswith(f"bench unit {key} for peer {me.fingerprint[:9]}"), holder
    with pytest.raises(store.Busy) as refused:
        with store.lifecycle_lock("swap qwen", path=node.lock_path):
            pass
    assert f"bench unit {key}" in refused.value.message and f"peer units --cancel {key}" in str(refused.value.hint)

    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(node.base), "METRALE_HOME": str(node.home),
           "METRALECTL_LOCK_DIR": str(node.lock_path.parent)}
    shown = subprocess.run([sys.executable, "-m", "metralectl", "peer", "units"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert key in shown.stdout and "running" in shown.stdout and f"peer units --cancel {key}" in shown.stderr
    done = subprocess.run([sys.executable, "-m", "metralectl", "peer", "units", "--cancel", key], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "stopping" in done.stderr, done.stderr
    seen, followed = _run_to_end(me, ref, key)
    assert followed.end["data"]["state"] == "cancelled"
    assert any("by this node's operator" in e["message"] for e in seen)
    assert store.lock_holder(node.lock_path) is None
    listed = subprocess.run([sys.executable, "-m", "metralectl", "peer", "units", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert [u["state"] for u in json.loads(listed.stdout) if u["key"] == key] == ["cancelled"]
    unknown = subprocess.run([sys.executable, "-m", "metralectl", "peer", "units", "--cancel", "certify-nope"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == ExitCode.USAGE and "no unit certify-nope on this node" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_a_unit_whose_turn_comes_during_a_swap_waits_for_it(pair: tuple[Path, identity.Identity, PeerNode]) -> None:
    here, me, node = pair
    ref = ru.NodeRef.lookup(node.addr, here)
    key = "certify-r7-node1-decode"
    with store.lifecycle_lock("swap qwen", path=node.lock_path):
        ru.submit(me, ref, _spec(key))
        deadline = time.monotonic() + 10
        while not any(e["kind"] == "waiting" for e in node.node.units.get(key).events):
            assert time.monotonic() < deadline, "the unit never said what it waits for"
            time.sleep(0.05)
        time.sleep(1.5)
        assert not any(e["kind"] == "started" for e in node.node.units.get(key).events)
    seen, followed = _run_to_end(me, ref, key)
    assert followed.end["data"]["state"] == "completed"
    waiting = [e for e in seen if e["kind"] == "waiting"]
    assert len(waiting) == 1 and "swap qwen (pid" in waiting[0]["message"]
    assert [e["kind"] for e in seen].index("waiting") < [e["kind"] for e in seen].index("started")


def test_a_tampered_record_is_rejected_and_nothing_kept(pair: tuple[Path, identity.Identity, PeerNode],
                                                        tmp_path: Path) -> None:
    here, me, node = pair
    ref = ru.NodeRef.lookup(node.addr, here)
    ru.submit(me, ref, _spec("certify-r5-node1-decode"))
    _run_to_end(me, ref, "certify-r5-node1-decode")
    run_dir = Path(node.node.units.get("certify-r5-node1-decode").run_dir or "")
    record = run_dir / "run.json"
    original = record.read_bytes()
    record.write_bytes(original.replace(b'"ok": 3', b'"ok": 4', 1))
    dest = tmp_path / "kept"
    with pytest.raises(ru.RecordRejected, match="not accepted"):
        ru.fetch_record(me, ref, "certify-r5-node1-decode", dest, known=known_keys(here))
    assert not dest.exists()
    record.write_bytes(original)
    requests = run_dir / "requests.jsonl"
    requests.write_bytes(requests.read_bytes() + b'{"forged": true}\n')
    with pytest.raises(ru.RecordRejected, match="per-request timings"):
        ru.fetch_record(me, ref, "certify-r5-node1-decode", dest, known=known_keys(here))
    assert not dest.exists()
    # a record signed by a key this box does not know is rejected too
    with pytest.raises(ru.RecordRejected, match="not accepted"):
        ru.fetch_record(me, ref, "certify-r5-node1-decode", dest, known={})
    assert signed.names_for(run_dir, json.loads(original))["unit"] == "certify-r5-node1-decode"
