"""Where a swap leaves its traces (the journal of one in progress, the record of past ones), and how `ps`
words them. Apart from swap.py so that `ps` reads them without loading the launch machinery.
"""

from __future__ import annotations

from pathlib import Path

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


def last_swap_summary() -> str | None:
    records = store.read_jsonl(swaps_path())
    if not records:
        return None
    last = records[-1]
    split = ", ".join(f"{k} {v:.1f} s" for k, v in (last.get("phases") or {}).items())
    return (f"{last.get('from_recipe')} → {last.get('to_recipe')}: {last.get('outcome')}, downtime "
            f"{last.get('downtime_s', 0):.1f} s ({split})")
