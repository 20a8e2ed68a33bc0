"""This box as a campaign node (`bench campaign --local`): its units run here exactly as a peer's units run on
a node — a `metralectl bench run` child that signs with this box's key — and its records pass the same checks
before they count. Its queue lives in the campaign's own directory, apart from the agent's peer units, and a
unit starts only while this box is admitted (not busy, nothing of a peer's queued or running, floors, a GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from metralectl.errors import MetralError
from metralectl.seams.identity import Identity
from metralectl.peers.admission import Admission, Facts, judge
from metralectl.peers.config import bench_path, load_bench_config
from metralectl.peers.remote_units import UnitRefused, accept_record
from metralectl.peers.unit_exec import SubprocessExecutor
from metralectl.peers.unit_spec import UnitSpec
from metralectl.peers.units import UnitQueue, read_units

NOT_FOR_LOCAL = ("bench.enabled", "grant")  # peers' rules; the operator runs this campaign here


class LocalNode:
    def __init__(self, me: Identity, base: Path, home: Path, workdir: Path, known: Mapping[str, bytes], *,
                 facts: Facts | None = None, name: str = "local") -> None:
        self.me, self.base, self.home, self.known = me, base, home, known
        self.name, self.fingerprint = name, me.fingerprint
        self.facts = facts or Facts()
        executor = SubprocessExecutor(base, home, lambda: load_bench_config(base).endpoint)
        self.queue = UnitQueue(workdir, executor).start()

    def admission(self) -> Admission:
        peers_units = sum(1 for u in read_units(self.home) if u.get("state") in ("queued", "running"))
        return judge(load_bench_config(self.base), fingerprint=self.fingerprint, name=self.name, facts=self.facts,
                     requester_grants=None, config_path=bench_path(self.base), queued=peers_units)

    def blocking(self) -> list[str]:
        """Why this box may not take a unit now (busy, a peer's unit here, floors, no GPU); [] when it may."""
        return [c.detail for c in self.admission().reasons if c.id not in NOT_FOR_LOCAL]

    def submit(self, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        why = self.blocking()
        if why:
            raise UnitRefused(f"{self.name}: not admitted now: {'; '.join(why)}", status=503)
        try:
            unit, created = self.queue.submit(UnitSpec.from_json(spec), self.fingerprint)
        except MetralError as exc:
            raise UnitRefused(f"{self.name}: {exc.message}", exc.hint, status=400) from None
        return unit.to_json(), created

    def follow(self, key: str, on_event: Callable[[dict[str, Any]], None],
               on_loss: Callable[[int, str], None]) -> dict[str, Any]:
        after = 0
        while True:
            events, done = self.queue.events_after(key, after, 2.0)
            for event in events:
                on_event(event)
                after = int(event["seq"])
                if event.get("kind") == "end":
                    return event
            if done and not events:
                raise MetralError(f"{self.name}: unit {key} ended without its end event")

    def fetch(self, key: str, dest: Path, suite: str) -> dict[str, Any]:
        unit = self.queue.get(key, self.fingerprint)
        if unit.state != "completed" or not unit.run_dir:
            raise UnitRefused(f"{self.name}: unit {key} has no completed record (it is {unit.state})", status=409)
        from metralectl.bench.signed import read_signed

        try:
            payload, envelope, requests = read_signed(Path(unit.run_dir))
        except (OSError, ValueError) as exc:
            raise MetralError(f"{self.name}: the record of unit {key} cannot be read: {exc}") from None
        return accept_record(self.name, self.fingerprint, self.fingerprint, key, payload, envelope, requests, dest,
                             known=self.known, suite=suite).record

    def cancel(self, key: str) -> None:
        self.queue.cancel(key, self.fingerprint)

    def thermal(self) -> dict[str, Any]:
        return self.facts.thermal()

    def close(self) -> None:
        self.queue.stop()
