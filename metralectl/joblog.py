"""The agent's log of what it did (written by agent/jobs.py for the local API and peers/units.py for a
peer's benchmark units, hence here, below both): one line when a job starts and one when it ends, each saying who asked
(the local API's client, or which peer), what (kind, recipe, sets; a peer's benchmark unit and its suite),
and, at the end, the result (outcome, exit code, duration, why). Every field is escaped (safetext): a
recipe name, a set or an error can come from a client or a peer and must not forge log lines.

The HTTP clients' own per-request INFO lines (httpx's "HTTP Request: GET .../health") are quieted here:
a readiness wait polls health several times a second and drowned what the agent did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from metralectl.safetext import clean

log = logging.getLogger("metralectl.agent.jobs")
QUIET = ("httpx", "httpcore")
FIELD_LIMIT = 200  # one field of a line (a long error is cut, the rest of the line stays readable)


def quiet_http_clients() -> None:
    """The HTTP client libraries log at WARNING and above only (their per-request lines are INFO)."""
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


def describe(kind: str, recipe: str | None = None, sets: Iterable[str] = (), extra: str = "") -> str:
    """What a job does, e.g. `run qwen3-8b --set serve.port=8001`; escaped."""
    words = [clean(kind, 40)] + ([clean(recipe, FIELD_LIMIT)] if recipe else [])
    words += [f"--set {clean(s, FIELD_LIMIT)}" for s in sets]
    return " ".join(words) + (f" ({clean(extra, FIELD_LIMIT)})" if extra else "")


def started(job_id: str, who: str, what: str) -> None:
    log.info("job %s started: %s, asked by %s", clean(job_id, 160), what, clean(who, FIELD_LIMIT))


def ended(job_id: str, who: str, what: str, *, outcome: str, exit_code: int | None, duration_s: float | None,
          error: str | None = None) -> None:
    """The end of a job; a failed or cancelled one at WARNING, with its error."""
    code = "-" if exit_code is None else str(int(exit_code))
    took = "-" if duration_s is None else f"{max(duration_s, 0.0):.1f} s"
    why = f": {clean(error, 400)}" if error else ""
    level = logging.INFO if outcome in ("done", "completed") else logging.WARNING
    log.log(level, "job %s %s (exit %s, %s): %s, asked by %s%s", clean(job_id, 160), clean(outcome, 40), code, took,
            what, clean(who, FIELD_LIMIT), why)
