"""Request traces to replay (the `trace` suite): when each request arrives and how long it is, read from CSV or JSONL.

One request a line (JSONL) or a row under a header (CSV), fields:
- `timestamp_s`: seconds from the start of the replay (a number >= 0, never before the line above it);
- `input_tokens`: prompt tokens, as the engine counts them (chat template included; 1..MAX_INPUT);
- `output_tokens`: tokens to generate (1..MAX_OUTPUT);
- `session` (optional): a name; requests of one session open with the same head, so a prefix cache may reuse it.
Read capped (MAX_BYTES, MAX_REQUESTS); a bad line is named with its field and the fix, exit 65.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from metralectl.errors import ExitCode, MetralError

MAX_BYTES = 8 * 1024 * 1024
MAX_REQUESTS = 100_000
MAX_INPUT = 1_000_000
MAX_OUTPUT = 100_000
FIELDS = ("timestamp_s", "input_tokens", "output_tokens", "session")
SAMPLE = Path(__file__).parent / "traces" / "sample.jsonl"  # shipped: 40 requests over 20 s, 3 sessions
FORMAT = ("one request a line: JSONL {\"timestamp_s\": 0.5, \"input_tokens\": 256, \"output_tokens\": 64, "
          "\"session\": \"a\"} or CSV with the header timestamp_s,input_tokens,output_tokens[,session] "
          "(docs/bench.md, \"Trace replay\")")


@dataclass(frozen=True)
class TraceRequest:
    timestamp_s: float
    input_tokens: int
    output_tokens: int
    session: str | None = None


class TraceInvalid(MetralError):
    """A trace file that cannot be replayed: where (file, line, field), what is wrong, and the fix."""

    exit_code = ExitCode.DATA


def _bad(path: str, line: int | None, field: str | None, why: str, fix: str) -> TraceInvalid:
    from metralectl.safetext import clean

    where = f"{clean(path, 200)}" + (f" line {line}" if line else "") + (f" field {field}" if field else "")
    return TraceInvalid(f"trace {where}: {why}", fix)


def _number(path: str, line: int, field: str, value: Any, *, integer: bool, low: float, high: float) -> float:
    from metralectl.safetext import clean

    if isinstance(value, bool):
        value = None
    try:
        x = float(value) if not integer else (int(value) if not isinstance(value, float) or value.is_integer() else None)
    except (TypeError, ValueError):
        x = None
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        want = "a whole number" if integer else "a number"
        raise _bad(path, line, field, f"{clean(str(value), 40)!r} is not {want}", f"give {field} as {want}; {FORMAT}")
    if not low <= x <= high:
        raise _bad(path, line, field, f"{x:g} is outside {low:g}..{high:g}", f"keep {field} within {low:g}..{high:g}")
    return x


def _request(path: str, line: int, row: dict[str, Any], before: float) -> TraceRequest:
    missing = [f for f in FIELDS[:3] if row.get(f) in (None, "")]
    if missing:
        raise _bad(path, line, missing[0], "missing", f"every request needs {', '.join(FIELDS[:3])}; {FORMAT}")
    unknown = sorted(k for k in row if k not in FIELDS)
    if unknown:
        from metralectl.safetext import clean

        raise _bad(path, line, clean(unknown[0], 40), "not a trace field", f"fields: {', '.join(FIELDS)}")
    ts = _number(path, line, "timestamp_s", row["timestamp_s"], integer=False, low=0, high=7 * 86400)
    if ts < before:
        raise _bad(path, line, "timestamp_s", f"{ts:g} is before the line above ({before:g})",
                   "sort the trace by timestamp_s")
    session = row.get("session")
    return TraceRequest(ts, int(_number(path, line, "input_tokens", row["input_tokens"], integer=True, low=1, high=MAX_INPUT)),
                        int(_number(path, line, "output_tokens", row["output_tokens"], integer=True, low=1, high=MAX_OUTPUT)),
                        None if session in (None, "") else str(session)[:200])


def parse(text: str, path: str) -> list[TraceRequest]:
    """The requests of a trace's text (JSONL when its first non-blank character is `{`, else CSV)."""
    out: list[TraceRequest] = []
    before = 0.0
    stripped = text.lstrip()
    if not stripped:
        raise _bad(path, None, None, "no requests in it (the file is empty)", FORMAT)
    rows = _jsonl_rows(text, path) if stripped.startswith("{") else _csv_rows(text, path)
    for n, row in rows:  # one row at a time: a file of millions of rows stops at MAX_REQUESTS, not in memory
        if not isinstance(row, dict):
            raise _bad(path, n, None, "not an object", FORMAT)
        if len(out) >= MAX_REQUESTS:
            raise _bad(path, n, None, f"more than {MAX_REQUESTS} requests", "replay a part of it (split the file)")
        req = _request(path, n, row, before)
        before = req.timestamp_s
        out.append(req)
    if not out:
        raise _bad(path, None, None, "no requests in it", FORMAT)
    return out


def _jsonl_rows(text: str, path: str) -> Iterator[tuple[int, Any]]:
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        try:
            yield n, json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise _bad(path, n, None, f"not JSON ({str(exc)[:80]})", FORMAT) from None


def _csv_rows(text: str, path: str) -> Iterator[tuple[int, dict[str, str]]]:
    """The CSV's rows; the csv module's own refusals (a field past its limit, an unclosed quote that swallows the
    rest of the file) are the file's fault, named with the line the reader stopped at."""
    reader = csv.DictReader(io.StringIO(text))
    try:
        header = [h.strip() for h in (reader.fieldnames or [])]
        if not set(FIELDS[:3]) <= set(header):
            raise _bad(path, 1, None, f"the CSV header is {','.join(header)[:120]!r}", FORMAT)
        for row in reader:
            yield reader.line_num, {(k or "").strip(): (v or "").strip() for k, v in row.items()}
    except csv.Error as exc:
        raise _bad(path, reader.line_num + 1, None, f"not CSV ({str(exc)[:80]})",
                   f"a field is at most {csv.field_size_limit()} characters and every quote is closed; {FORMAT}") \
            from None


def load(path: str) -> tuple[list[TraceRequest], str]:
    """The trace at `path` ("" or "sample": the shipped one), read capped; and the name it is recorded under."""
    from metralectl.filecap import FileRefused, read_text

    if path in ("", "sample"):
        return parse(SAMPLE.read_text(encoding="utf-8"), "sample.jsonl (shipped)"), "sample"
    try:
        text = read_text(path, MAX_BYTES, "trace")
    except FileNotFoundError:
        raise _bad(path, None, None, "no such file", "give the path of a CSV or JSONL trace") from None
    except OSError as exc:
        raise _bad(path, None, None, f"cannot be read ({exc.strerror})", "give a trace file this user can read") from None
    except ValueError:
        raise _bad(path, None, None, "not UTF-8 text", FORMAT) from None
    except FileRefused as exc:
        raise TraceInvalid(exc.message, f"a trace is read up to {MAX_BYTES // (1024 * 1024)} MiB") from None
    return parse(text, path), str(Path(path).resolve())
