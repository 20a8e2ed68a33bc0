"""An attacker's pass over bench inputs from outside: trace files (`bench run trace -p trace=FILE`): a CSV field past the csv module's
limit, an unclosed quote that swallows the file, NUL bytes, absurd numbers (negative, NaN, inf, 1e308, 5000 digits),
JSON nested past Python's stack, millions of rows. Each is exit 65 naming file and line, before anything is sent
(the URL is a closed loopback port), never 70; a file of millions of rows stops at the cap without holding them all.
And the engine's tool-call arguments (`bench run tool`), judged as JSON."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

HEADER = "timestamp_s,input_tokens,output_tokens\n"


def _bench(tmp_path: Path, trace: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "METRALE_HOME": str(tmp_path / "home"), "METRALECTL_CONFIG_DIR": str(tmp_path / "config"),
           "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "metralectl", "bench", "run", "trace", "-p", f"trace={trace}",
                           "--url", "http://127.0.0.1:9"], capture_output=True, text=True, env=env, timeout=120)


CASES = [
    ("big-field.csv", HEADER + "0,1,1\n1,1," + "1" * 200_000 + "\n", "line 3: not CSV (field larger"),
    ("open-quote.csv", HEADER + "0,1,1\n1,1,\"" + "1\n" * 70_000, "line 3: not CSV"),
    ("nul.csv", HEADER + "0,1\x00,1\n", "line 2 field input_tokens: '1\\\\x00' is not a whole number"),
    ("nan.csv", HEADER + "nan,1,1\n", "line 2 field timestamp_s: 'nan' is not a number"),
    ("neg.jsonl", '{"timestamp_s": -1, "input_tokens": 1, "output_tokens": 1}\n', "line 1 field timestamp_s: -1 is"),
    ("huge.jsonl", '{"timestamp_s": 1e308, "input_tokens": 1, "output_tokens": 1}\n', "1e+308 is outside"),
    ("inf.jsonl", '{"timestamp_s": 1e999, "input_tokens": 1, "output_tokens": 1}\n', "'inf' is not a number"),
    ("digits.jsonl", '{"timestamp_s": 0, "input_tokens": ' + "9" * 5000 + ', "output_tokens": 1}\n', "line 1: not JSON"),
    ("deep.jsonl", '{"timestamp_s": ' + "[" * 100_000 + "\n", "line 1: not JSON"),
]


@pytest.mark.parametrize("name,text,said", CASES, ids=[c[0] for c in CASES])  # ids short: they go in the env
def test_a_hostile_trace_is_exit_65_naming_file_and_line(tmp_path: Path, name: str, text: str, said: str) -> None:
    trace = tmp_path / name
    trace.write_text(text)
    done = _bench(tmp_path, trace)
    assert done.returncode == 65, done.stderr
    assert f"trace {trace} " in done.stderr and said in done.stderr, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


def test_millions_of_rows_stop_at_the_cap_without_holding_them(tmp_path: Path) -> None:
    """8 MiB of one-character rows (1.4 million): refused at row 100 001, in bounded memory (was ~470 MB)."""
    from metralectl.bench import trace

    text = HEADER + "0,1,1\n" * 1_390_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(trace.TraceInvalid, match="line 100002: more than 100000 requests"):
        trace.parse(text, "rows.csv")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 150, grown_mb


def test_an_engines_tool_call_arguments_nested_past_pythons_stack_are_a_problem_not_a_crash() -> None:
    """`bench run tool`: the engine's own text (capped at 1 MiB an event) judged as JSON arguments."""
    from metralectl.bench.results import RequestResult
    from metralectl.bench.suites.tool import tool_call_problems

    result = RequestResult(index=0, worker=0, phase="measure", t_sched=0.0, t_send=0.0, ok=True, status=200, error=None)
    result.tool_calls = [{"id": "c1", "name": "get_weather", "arguments": "[" * 200_000}]
    problems = tool_call_problems(result, {"get_weather"})
    assert problems and "arguments are not valid JSON" in problems[0]
