"""The runner (threads, deadlines, broken checks), the exit-code rule, and the CLI over them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from metralectl.doctor import CHECKS, CheckResult, exit_code, run_checks
from metralectl.doctor.model import Check, Finding, counts, ok, problem, skipped, warn
from metralectl.errors import ExitCode
from tests.unit import doctor_fakes as df
from tests.unit.recipe_helpers import REPO

HEAVY = ("docker", "textual", "httpx", "huggingface_hub", "pynvml")


def result(status: str, check_id: str = "x") -> CheckResult:
    return CheckResult(check_id, check_id.title(), status, "detail")  # type: ignore[arg-type]


@pytest.mark.parametrize("statuses,code", [
    ([], 0), (["ok"], 0), (["ok", "warn", "skipped"], 0), (["warn"] * 5, 0), (["skipped"], 0),
    (["problem"], 1), (["ok", "warn", "problem", "skipped"], 1),
])
def test_exit_code_is_non_zero_iff_a_problem(statuses: list[str], code: int) -> None:
    assert exit_code([result(s, f"c{i}") for i, s in enumerate(statuses)]) == code


def test_counts() -> None:
    assert counts([result("ok"), result("warn"), result("warn")]) == {"ok": 1, "warn": 2, "problem": 0, "skipped": 0}


def test_runner_keeps_order_and_survives_broken_and_hung_checks(tmp_path: Path) -> None:
    gate = threading.Event()

    def boom(ctx: Any) -> Finding:
        raise ValueError("bad data")

    def hang(ctx: Any) -> Finding:
        gate.wait(10)
        return ok("late")

    checks = [Check("a", "A", lambda c: ok("fine")), Check("b", "B", boom), Check("c", "C", hang, timeout_s=0.3),
              Check("d", "D", lambda c: problem("bad", "fix it", n=1))]
    started = time.monotonic()
    got = run_checks(df.make_ctx(tmp_path), checks)
    gate.set()
    assert time.monotonic() - started < 5.0  # not the hung check's 10 s
    assert [r.id for r in got] == ["a", "b", "c", "d"]
    assert got[1].status == "warn" and "ValueError: bad data" in got[1].detail
    assert got[2].status == "warn" and got[2].detail == "did not finish within 0.3 s" and got[2].data["timed_out"]
    assert (got[3].status, got[3].remedy, got[3].data) == ("problem", "fix it", {"n": 1})


def test_checks_run_concurrently(tmp_path: Path) -> None:
    def slow(ctx: Any) -> Finding:
        time.sleep(1.0)
        return skipped("slept")

    started = time.monotonic()
    got = run_checks(df.make_ctx(tmp_path), [Check(f"s{i}", "S", slow) for i in range(8)])
    # one after another would take 8 s; together about 1 s (a loaded box adds, but not 4 s)
    assert time.monotonic() - started < 5.0 and {r.status for r in got} == {"skipped"}


def test_whole_run_on_a_healthy_fake_machine_is_clean(tmp_path: Path) -> None:
    df.chown_tree(tmp_path)  # (its speed: benchmarks/cold_start.py --doctor)
    ctx = df.make_ctx(tmp_path)
    got = run_checks(ctx, CHECKS)
    ctx.close()
    assert exit_code(got) == 0, [r for r in got if r.status == "problem"]


def test_hung_daemon_with_default_budgets_answers_long_before_it(tmp_path: Path) -> None:
    gate = threading.Event()
    ctx = df.make_ctx(tmp_path, runtime_factory=lambda: gate.wait(30))
    started = time.monotonic()
    got = {r.id: r for r in run_checks(ctx, CHECKS)}
    gate.set()
    elapsed = time.monotonic() - started
    assert elapsed < 10.0 and got["docker.daemon"].status == "problem"  # the daemon hangs 30 s; budgets are ~2 s
    assert got["docker.daemon"].data["cause"] == "unreachable"


# -- CLI ------------------------------------------------------------------------------------------

def _patch(monkeypatch: pytest.MonkeyPatch, results: list[CheckResult]) -> None:
    import metralectl.doctor as doctor

    monkeypatch.setattr(doctor, "diagnose", lambda ctx: results)


def invoke(*args: str) -> Any:
    from metralectl.cli.main import cli

    return CliRunner().invoke(cli, ["doctor", *args])


def test_cli_exit_code_and_text(monkeypatch: pytest.MonkeyPatch) -> None:
    _patch(monkeypatch, [CheckResult("a", "Alpha", "ok", "fine"), CheckResult("b", "Beta", "warn", "hmm", "do x")])
    out = invoke()
    assert out.exit_code == 0
    assert out.stdout.splitlines()[:3] == ["[ ok ] Alpha: fine", "[warn] Beta: hmm", "       → do x"]
    assert "0 problems, 1 warning, 1 ok, 0 skipped in" in out.stdout and out.stdout.rstrip().endswith("no problems")
    _patch(monkeypatch, [CheckResult("a", "Alpha", "problem", "broken", "fix")])
    out = invoke()
    assert out.exit_code == 1 and "[FAIL] Alpha: broken" in out.stdout and "problems found" in out.stdout


def test_cli_json(monkeypatch: pytest.MonkeyPatch) -> None:
    _patch(monkeypatch, [CheckResult("a", "Alpha", "problem", "broken", "fix", {"k": [1, 2]}),
                         CheckResult("b", "Beta", "skipped", "n/a")])
    out = invoke("--json", "--port", "9001")
    assert out.exit_code == 1
    doc = json.loads(out.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 1 and doc["counts"]["problem"] == 1
    assert doc["options"] == {"recipe": None, "port": 9001}
    assert doc["checks"][0] == {"id": "a", "title": "Alpha", "status": "problem", "detail": "broken", "remedy": "fix",
                                "data": {"k": [1, 2]}}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO, timeout=60)


def test_unknown_recipe_is_a_usage_error() -> None:
    out = cli("doctor", "--recipe", "qwen3.5-35b-a3c")
    assert out.returncode == ExitCode.USAGE and "no recipe named 'qwen3.5-35b-a3c'" in out.stderr and out.stdout == ""


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["doctor", "--help"]])
def test_doctor_stays_out_of_other_commands(argv: list[str]) -> None:
    code = ("import sys, runpy\n"
            f"sys.argv = ['metralectl', *{argv!r}]\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            f"loaded = [m for m in {HEAVY!r} + ('metralectl.doctor',) if m in sys.modules]\n"
            "print('LOADED=' + ','.join(loaded), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stderr.rstrip().endswith("LOADED="), out.stderr


def test_the_checks_import_no_heavy_module_at_import_time() -> None:
    code = ("import sys\nimport metralectl.doctor, metralectl.cli.doctor_cmd\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr


def test_real_doctor_on_this_machine_answers_and_follows_the_rule(tmp_path: Path) -> None:
    # how long it takes is benchmarks/cold_start.py --doctor's to measure, not a test's on a shared box
    out = cli("doctor", "--json", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    doc = json.loads(out.stdout)
    assert out.returncode == (1 if any(c["status"] == "problem" for c in doc["checks"]) else 0)
    daemon = next(c for c in doc["checks"] if c["id"] == "docker.daemon")
    assert daemon["status"] == "problem" and daemon["data"]["cause"] in ("not-running", "not-installed")


def test_warn_helpers_build_findings() -> None:
    assert warn("w", "r", a=1) == Finding("warn", "w", "r", {"a": 1})
