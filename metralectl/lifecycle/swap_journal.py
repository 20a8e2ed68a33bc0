"""Where a swap leaves its traces (the journal of one in progress, the record of past ones), and how `ps`
words them. Apart from swap.py so that `ps` reads them without loading the launch machinery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metralectl.seams import store


def journal_path() -> Path:
    return store.state_dir() / "swap-journal.json"


def swaps_path() -> Path:
    return store.state_dir() / "swaps.jsonl"


def describe_journal() -> str | None:
    """A line for `ps` when a swap was interrupted (its journal stayed, nobody holds the lock)."""
    journal = store.read_json(journal_path())
    if not isinstance(journal, dict):
        return None
    holder = store.lock_holder()
    if holder is not None and not holder.startswith(store.UNIT_HOLDER):
        return None  # a swap is running right now (a peer's unit holding the lock is no swap)
    old, new = journal.get("old", {}), journal.get("new", {})
    return (f"a swap from {old.get('recipe')} to {new.get('recipe')} was interrupted while {journal.get('phase')} "
            f"(pid {journal.get('pid')})" + (f": {journal['why']}" if journal.get("why") else ""))


def last_swap_record() -> dict[str, Any] | None:
    """The last swap as `ps --json` gives it: from, to, outcome, downtime_s, phases (seconds each), at (Unix
    time; null for a record written before it was kept), message; None when no swap was recorded."""
    records = store.read_jsonl(swaps_path())
    if not records or not isinstance(records[-1], dict):
        return None
    last = records[-1]
    phases = last.get("phases")
    return {"from": last.get("from_recipe"), "to": last.get("to_recipe"), "outcome": last.get("outcome"),
            "downtime_s": last.get("downtime_s"), "phases": phases if isinstance(phases, dict) else {},
            "at": last.get("at"), "message": last.get("message") or ""}


def last_swap_summary(record: dict[str, Any] | None = None) -> str | None:
    """The last swap in a sentence (`ps`, the dashboard): the record's words (default: read it now)."""
    last = record if record is not None else last_swap_record()
    if last is None:
        return None
    split = ", ".join(f"{k} {v:.1f} s" for k, v in last["phases"].items())
    return (f"{last['from']} → {last['to']}: {last['outcome']}, downtime "
            f"{last['downtime_s'] or 0:.1f} s ({split})")
