"""The one exit-code table: every way metralectl ends maps to it, through the real entry point; every
exit in the code is taken from it; the docs are generated from or checked against it; a Docker refusal
is told apart by its cause, never by its words."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from metralectl.errors import EXIT_MEANINGS, ExitCode, MetralError
from tests.bench_truth.helpers import truth_server
from tests.ports import own_port

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "metralectl"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("exit_codes_script", REPO / "scripts" / "exit-codes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the table ------------------------------------------------------------------------------------------
def test_the_table_keeps_the_books_codes_and_gives_each_reason_its_own() -> None:
    assert (ExitCode.OK, ExitCode.FAILED, ExitCode.GATE) == (0, 1, 2)  # the book's benchmark meaning
    assert (ExitCode.BUSY, ExitCode.INTERRUPTED) == (75, 130)
    # usage, data and Docker-down are told apart from each other and from a gate that said no
    distinct = {ExitCode.GATE, ExitCode.USAGE, ExitCode.DATA, ExitCode.UNAVAILABLE, ExitCode.DEGRADED,
                ExitCode.SOFTWARE, ExitCode.BUSY, ExitCode.INTERRUPTED}
    assert len({int(c) for c in distinct}) == len(distinct)
    assert set(EXIT_MEANINGS) == set(ExitCode) and all(m and w for m, w in EXIT_MEANINGS.values())
    assert all(0 <= c <= 255 for c in ExitCode)


@pytest.mark.parametrize("value,expected", [(0, ExitCode.OK), (2, ExitCode.GATE), (75, ExitCode.BUSY),
                                            (3, ExitCode.DEGRADED), (-9, ExitCode.FAILED), (255, ExitCode.FAILED),
                                            ("2", ExitCode.FAILED), (True, ExitCode.FAILED), (None, ExitCode.FAILED)])
def test_a_code_from_another_process_is_read_through_the_table(value: Any, expected: ExitCode) -> None:
    assert ExitCode.of(value) is expected


def _all_modules() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if name.endswith("__main__"):
            continue
        importlib.import_module(name.removesuffix(".__init__"))


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_names_its_own_code_from_the_table() -> None:
    _all_modules()
    found = [c for c in _subclasses(MetralError) if c.__module__.startswith("metralectl.")]
    assert len(found) > 25  # every module was imported (a namespace package is not skipped)
    unnamed = [f"{c.__module__}.{c.__name__}" for c in found if "exit_code" not in vars(c)]
    assert unnamed == [], "each MetralError subclass says its exit code (class attribute exit_code = ExitCode.X)"
    assert all(isinstance(vars(c)["exit_code"], ExitCode) for c in found)
    by_name = {c.__name__: c.exit_code for c in found}
    assert by_name["DockerUnavailable"] is ExitCode.UNAVAILABLE and by_name["Busy"] is ExitCode.BUSY
    assert by_name["SwapDegraded"] is ExitCode.DEGRADED and by_name["SwapRolledBack"] is ExitCode.FAILED
    assert by_name["CampaignInvalid"] is ExitCode.DATA and by_name["DataError"] is ExitCode.DATA
    assert by_name["RunInterrupted"] is ExitCode.INTERRUPTED and by_name["NotFound"] is ExitCode.USAGE


def _bare_exits(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Exit statuses written as numbers: Exit(3), sys.exit(2), exit_code=3, `exit_code = 2` in a class."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func.endswith(("Exit", "sys.exit", "_exit")) and node.args and isinstance(node.args[0], ast.Constant):
                yield node.lineno, ast.unparse(node)
            for kw in node.keywords:
                if kw.arg == "exit_code" and isinstance(kw.value, ast.Constant) and kw.value.value is not None:
                    yield node.lineno, ast.unparse(node)
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(ast.unparse(t) == "exit_code" for t in stmt.targets) \
                        and isinstance(stmt.value, ast.Constant):
                    yield stmt.lineno, ast.unparse(stmt)
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "exit_code" and isinstance(value, ast.Constant) \
                        and value.value is not None:
                    yield node.lineno, ast.unparse(node)[:80]


def test_every_exit_in_the_code_is_taken_from_the_table() -> None:
    found = [f"{path.relative_to(REPO)}:{line}: {text}" for path in sorted(PACKAGE.rglob("*.py"))
             for line, text in _bare_exits(ast.parse(path.read_text()))]
    assert found == [], "use ExitCode.X, not a number:\n" + "\n".join(found)


def test_the_scan_for_bare_exits_can_fail() -> None:
    source = ("import sys, typer\nclass E(Exception):\n    exit_code = 3\n"
              "def f():\n    raise typer.Exit(2)\ndef g():\n    sys.exit(70)\nrecord = {'exit_code': 1}\n"
              "def h():\n    raise E('x', exit_code=130)\n")
    assert sorted(line for line, _ in _bare_exits(ast.parse(source))) == [3, 5, 7, 8, 10]


# --- through the real entry point -----------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--no-such-flag"], ["show"], ["no-such-command"], ["bench", "run", "--nope"],
                                  ["stop", "--timeout", "soon"], ["recipes", "check", "--jsonn"]])
def test_click_usage_errors_end_with_usage_not_2(argv: list[str]) -> None:
    """Click's own refusals (unknown option or command, missing or malformed argument) would exit 2, the
    code a gate's verdict has: the root group gives them USAGE, sub-commands and sub-groups included."""
    out = cli(*argv)
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert "Usage: metralectl" in out.stderr and "Traceback" not in out.stderr and out.stdout == ""


def test_click_usage_errors_end_with_usage_under_the_test_runner_too() -> None:
    from click.testing import CliRunner

    from metralectl.cli.main import cli

    result = CliRunner().invoke(cli, ["show"])
    assert result.exit_code == ExitCode.USAGE


def test_our_own_usage_errors_end_with_usage() -> None:
    out = cli("show", "no-such-recipe")
    assert out.returncode == ExitCode.USAGE and "no recipe named 'no-such-recipe'" in out.stderr


def test_docker_unreachable_ends_with_unavailable() -> None:
    port = own_port()  # held, never listening: the daemon's address refuses connections
    out = cli("ps", env={"DOCKER_HOST": f"tcp://127.0.0.1:{port}"})
    assert out.returncode == ExitCode.UNAVAILABLE, out.stderr
    assert f"127.0.0.1:{port}" in out.stderr and "Traceback" not in out.stderr


def test_a_broken_user_recipe_ends_with_data(isolated_env: Path) -> None:
    user = isolated_env / "config" / "recipes"
    user.mkdir(parents=True)
    (user / "broken.yaml").write_text("extends: qwen3.5-35b-a3b\nname: broken\nserve:\n  max-seq-len: lots\n")
    shown = cli("show", "broken")
    assert shown.returncode == ExitCode.DATA and f"{user / 'broken.yaml'}:4:3" in shown.stderr
    assert cli("list").returncode == ExitCode.DATA  # listed without it, and the exit says a file is broken
    checked = cli("recipes", "check", str(user / "broken.yaml"))
    assert checked.returncode == ExitCode.DATA and "REFUSED" in checked.stdout


def test_a_set_that_breaks_a_valid_recipe_is_a_usage_error() -> None:
    out = cli("run", "qwen3.5-35b-a3b", "--print", "--set", "max-seq-len=lots")
    assert out.returncode == ExitCode.USAGE and "--set max-seq-len=lots" in out.stderr


class _FakeDaemon(BaseHTTPRequestHandler):
    """Enough of the Docker API for a client to connect (ping, version); any other call is a 500."""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        path = self.path.split("?")[0]
        if path.endswith("/_ping"):
            self._send(200, b"OK", "text/plain")
        elif path.endswith("/version"):
            self._send(200, json.dumps({"ApiVersion": "1.41", "Version": "20.10.0"}).encode(), "application/json")
        else:
            self._send(500, json.dumps({"message": "fake daemon: nothing here"}).encode(), "application/json")

    do_HEAD = do_GET
    do_POST = do_GET

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_busy_ends_with_75_and_names_the_holder() -> None:
    from metralectl.seams.store import lifecycle_lock

    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeDaemon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with lifecycle_lock("swap to x"):
            out = cli("stop", env={"DOCKER_HOST": f"tcp://127.0.0.1:{server.server_address[1]}"})
    finally:
        server.shutdown()
    assert out.returncode == ExitCode.BUSY == 75, out.stderr
    assert "busy: swap to x" in out.stderr


def test_a_gate_that_says_no_ends_with_2_and_a_passing_one_with_0() -> None:
    with truth_server("--ttft-ms", "5", "--itl-ms", "1") as url:
        # client_bound=warn: on a busy 2-core box the honesty guard may call the client late, and that
        # run's own code (1, failed) is not what this test is about
        base = ("bench", "run", "decode", "--url", url, "-p", "repeats=1", "-p", "max_tokens=5",
                "-p", "client_bound=warn", "--format", "json")
        gated = cli(*base, "--gate", "decode_tok_s_p50>=100000000", timeout=120)
        passed = cli(*base, "--gate", "decode_tok_s_p50>=0.001", timeout=120)
    assert gated.returncode == ExitCode.GATE, gated.stderr
    assert json.loads(gated.stdout)["exit_code"] == ExitCode.GATE  # the record says the same code
    assert passed.returncode == ExitCode.OK, passed.stderr


@pytest.mark.parametrize("status,verdict,expected", [
    ("completed", "pass", ExitCode.OK), ("completed", "none", ExitCode.OK), ("completed", "fail", ExitCode.GATE),
    ("errors", "pass", ExitCode.FAILED), ("invalid", "none", ExitCode.FAILED),
    ("client-bound", "fail", ExitCode.FAILED), ("failed", "none", ExitCode.FAILED),
    ("interrupted", "none", ExitCode.INTERRUPTED)])
def test_the_bench_statuses_map_to_the_table(status: str, verdict: str, expected: ExitCode) -> None:
    from metralectl.bench import gates

    assert gates.exit_code(status, verdict) is expected


def test_an_unexpected_exception_ends_with_software(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from metralectl.cli import main as entry

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("metralectl.core.catalog.load_catalog", broken)
    with pytest.raises(SystemExit) as exited:
        entry.main(["list"])
    assert exited.value.code == ExitCode.SOFTWARE and "internal error" in capsys.readouterr().err


# --- the agent's jobs and a peer's units carry the same codes ---------------------------------------------
def test_a_jobs_codes_are_members_of_the_table() -> None:
    import contextlib

    from metralectl.agent.jobs import JobRunner

    runner = JobRunner(lambda what: contextlib.nullcontext())

    def fails(emit: Any) -> None:
        raise MetralError("no", exit_code=ExitCode.DATA)

    def breaks(emit: Any) -> None:
        raise ValueError("a bug")

    def works(emit: Any) -> str:
        return "ok"

    codes = []
    for work in (works, fails, breaks):
        job = runner.start("run", "r", work)
        assert job.wait_finished(10)
        codes.append(job.exit_code)
    assert codes == [ExitCode.OK, ExitCode.DATA, ExitCode.SOFTWARE]
    assert all(type(c) is ExitCode for c in codes)


# --- Docker refusals: by cause ------------------------------------------------------------------------------
@pytest.mark.parametrize("status,text,cause", [
    (400, 'invalid mount config for type "bind": bind source path does not exist: /nonexistent', "mount-source-missing"),
    (409, 'Conflict. The container name "/metralectl-x" is already in use by container "abc"', "conflict"),
    (500, 'could not select device driver "" with capabilities: [[gpu]]', "gpu-runtime-missing"),
    (500, "OCI runtime create failed: nvidia-container-cli: initialization error: nvml error: driver not loaded",
     "gpu-hook-failed"),
    (500, 'error gathering device information while adding custom device "/dev/infiniband": no such file',
     "device-missing"),
    (500, "something else entirely about a GPU", "refused"),
])
def test_the_seam_reads_a_refusals_cause_once(status: int, text: str, cause: str) -> None:
    """The first two texts are Docker 20.10's own, read from this box's daemon."""
    import docker.errors

    from metralectl.seams.docker import errors as rt
    from metralectl.seams.docker.client import translate

    response = type("R", (), {"status_code": status, "reason": "x", "url": "x"})()
    refused = translate(rt_endpoint(), docker.errors.APIError(str(status), response=response, explanation=text))
    assert isinstance(refused, rt.Refused)
    failure = rt.refused_failure(refused)
    assert isinstance(failure, rt.RuntimeFailure) and failure.cause == cause and failure.cause is rt.RuntimeCause(cause)
    assert failure.exit_code is ExitCode.FAILED


def test_an_image_not_found_is_image_missing() -> None:
    import docker.errors

    from metralectl.seams.docker import errors as rt
    from metralectl.seams.docker.client import translate

    response = type("R", (), {"status_code": 404, "reason": "x", "url": "x"})()
    refused = translate(rt_endpoint(), docker.errors.ImageNotFound("404", response=response,
                                                                   explanation="No such image: x"))
    assert isinstance(refused, rt.Refused)
    failure = rt.refused_failure(refused)
    assert isinstance(failure, rt.RuntimeFailure) and failure.cause is rt.RuntimeCause.IMAGE_MISSING


def rt_endpoint() -> Any:
    from metralectl.seams.docker.endpoints import Endpoint

    return Endpoint("unix:///nowhere.sock", "test")


def _message_matches(tree: ast.AST) -> Iterator[int]:
    """Lines inside `except RuntimeFailure as X:` that test X's words (X.message / str(X) in a comparison,
    `in`, .startswith, .endswith or a regex)."""
    for handler in ast.walk(tree):
        if not (isinstance(handler, ast.ExceptHandler) and handler.name and handler.type is not None
                and "RuntimeFailure" in ast.unparse(handler.type)):
            continue
        words = {f"{handler.name}.message", f"str({handler.name})"}
        for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
            if isinstance(node, ast.Compare) and any(ast.unparse(n) in words for n in [node.left, *node.comparators]):
                yield node.lineno
            if isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                if any(func.startswith(w + ".") for w in words) or (
                        func.startswith("re.") and any(ast.unparse(a) in words for a in node.args)):
                    yield node.lineno


def test_no_caller_reads_a_runtime_failures_words() -> None:
    found = [f"{p.relative_to(REPO)}:{line}" for p in sorted(PACKAGE.rglob("*.py"))
             for line in _message_matches(ast.parse(p.read_text()))]
    assert found == [], "test failure.cause (seams.docker.errors.RuntimeCause), not the message"


def test_the_scan_for_message_matching_can_fail() -> None:
    source = ("try:\n    f()\nexcept RuntimeFailure as exc:\n    if 'GPU' in exc.message:\n        pass\n"
              "    ok = exc.message.startswith('x')\n    import re\n    re.search('y', str(exc))\n")
    assert list(_message_matches(ast.parse(source))) == [4, 6, 8]


# --- the docs ---------------------------------------------------------------------------------------------
def test_the_docs_agree_with_the_table() -> None:
    out = subprocess.run([sys.executable, "scripts/exit-codes.py", "check"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("text,says", [
    # the three pages that disagreed before the table, in their own words
    ("## Exit codes\n\n0 ok · 1 refused or failed (swap rolled back) · 2 usage · 3 Docker unusable, or a swap "
     "left nothing\nserving (degraded) · 75 busy · 130 interrupted.\n", "`2 gate`"),
    ("the same stdout (`--json` too) and the same exit codes (0, 1 refused or failed, 2 usage, 3 degraded\n"
     "swap, 75 busy, 130 interrupted). The CLI says so.\n", "`0 ok`"),
    ("- **One error hierarchy.** `cli/main.py` turns them into stderr lines and exit codes (2 usage, 1 "
     "refused/failed,\n  3 broken shipped data, 70 internal, 130 interrupted); tracebacks only with `--debug`.\n",
     "`2 gate`"),
    ("Without a terminal, `metralectl tui` is a usage error (exit 2).\n", "usage error is 64"),
    ("A launch or swap while another runs answers busy (exit 3).\n", "busy is 75"),
    ("Docker is not running: exit 3.\n", "exit 3 is degraded"),
    ("It refuses and exits 99.\n", "not in the table"),
])
def test_the_docs_check_catches_a_disagreement(text: str, says: str) -> None:
    checker = script()
    problems = checker.prose_problems(REPO / "docs" / "example.md", text)
    assert any(says in p for p in problems), problems


def test_the_docs_check_leaves_other_programs_exits_alone() -> None:
    checker = script()
    text = ("| `out-of-memory` | exit 137 / OOM-killed |\n\nThe engine double exits 1 after two readings.\n\n"
            "A rank's container exits 2 when NCCL gives up.\n")
    assert checker.prose_problems(REPO / "docs" / "example.md", text) == []


def test_a_stale_generated_page_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    checker = script()
    assert checker.check() == []
    monkeypatch.setitem(EXIT_MEANINGS, ExitCode.BUSY, ("busy, later", "now"))  # the table changed; the docs not
    assert any("docs/exit-codes.md" in p for p in checker.check())
    assert any("serving.md" in p and "generated" in p for p in checker.check())


def test_help_points_to_the_table() -> None:
    out = cli("--help")
    assert out.returncode == 0 and "docs/exit-codes.md" in out.stdout
    assert all(f"{c.value} {c.name.lower()}" in " ".join(out.stdout.split()) for c in ExitCode)
