"""One answer per situation (issue 28, item 5), walked through the real entry point (`python -m metralectl`
in a subprocess) on the real Docker daemon with the engine test double: one table of (command, situation)
-> (exit code, the message's words), each row asserted.

Situations: nothing served (logs, chat, bench, swap: exit 1 and one message; top and stop say the same
words and end 0), the Hugging Face Hub unreachable (a loopback port owned by a bound socket that does not
listen: pull and run's staging end 69; list and doctor never ask it, and end as they would without it), an unknown recipe (64 for every
command that takes one), Docker unavailable (DOCKER_HOST at a socket that does not exist: 69), and `run`
of exactly what serves (0, the endpoint, `--json` says already_serving; other `--set`s: refused unless
`--replace`).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from metralectl.errors import ExitCode
from tests.integration.conftest import Box
from tests.ports import HeldPort

pytestmark = [pytest.mark.integration, pytest.mark.docker]

NOTHING = re.escape("nothing is being served by metralectl")


@dataclass(frozen=True)
class Row:
    args: tuple[str, ...]
    code: int
    pattern: str  # a regex that must match stdout + stderr
    env: tuple[tuple[str, str], ...] = ()


def walk(box: Box, rows: list[Row]) -> None:
    """Every row through the CLI; all the mismatches reported at once."""
    wrong = []
    for row in rows:
        saved = dict(box.env)
        box.env.update(dict(row.env))
        try:
            out = box.cli(*row.args, timeout=180)
        finally:
            box.env = saved
        text = out.stdout + out.stderr
        if out.returncode != row.code or not re.search(row.pattern, text, re.MULTILINE) or "Traceback" in text:
            wrong.append(f"metralectl {' '.join(row.args)} {dict(row.env)}: exit {out.returncode} (want {row.code}), "
                         f"want /{row.pattern}/ in:\n{text}")
    assert not wrong, "\n\n".join(wrong)


@pytest.fixture()
def silent_port() -> Iterator[int]:
    """A loopback port this test owns (bound, never listening): a connection to it is refused at once."""
    with HeldPort() as held:
        yield held.port


@pytest.fixture()
def default_bench_url_refused() -> Iterator[None]:
    """`bench` without --url also looks at http://127.0.0.1:8888 (an engine started by hand): held here,
    bound and not listening, so nothing answers there during the walk."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tests/ports.HeldPort: a listener still fails
        try:
            held.bind(("127.0.0.1", 8888))
        except OSError:
            pytest.skip("something else holds 127.0.0.1:8888, where `bench` looks for an engine started by hand")
        yield


def test_each_situation_has_one_answer(box: Box, silent_port: int, default_bench_url_refused: None,
                                       tmp_path) -> None:
    served = box.recipe("served")
    hub = (("HF_ENDPOINT", f"http://127.0.0.1:{silent_port}"),)
    unreachable_hub = re.escape(f"cannot reach the Hugging Face Hub at http://127.0.0.1:{silent_port}")
    no_docker = (("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock"),)
    docker_down = re.escape(f"nothing listens at DOCKER_HOST=unix://{tmp_path}/no-docker.sock")

    # -- nothing served; the Hub unreachable (the weights are not in this box's cache yet) ---------------
    walk(box, [
        Row(("logs",), ExitCode.FAILED, f"^metralectl: {NOTHING}$"),
        Row(("logs", served), ExitCode.FAILED, re.escape(f"{served} is not being served (served now: nothing)")),
        Row(("chat", "hello"), ExitCode.FAILED, f"^metralectl: {NOTHING}$"),
        Row(("chat", served, "hello"), ExitCode.FAILED, re.escape(f"{served} is not being served")),
        Row(("bench", "run", "decode"), ExitCode.FAILED, f"^metralectl: {NOTHING}$"),
        Row(("swap", served), ExitCode.FAILED, f"^metralectl: {NOTHING}$"),
        Row(("top", "--once"), ExitCode.OK, f"no engine: {NOTHING}"),
        Row(("stop",), ExitCode.OK, f"^nothing to stop: {NOTHING}$"),
        Row(("stop", served), ExitCode.OK, re.escape(f"nothing to stop: {served} is not being served")),
        Row(("ps",), ExitCode.OK, f"^{NOTHING}$"),
        Row(("pull", served, "--weights-only"), ExitCode.UNAVAILABLE, unreachable_hub, hub),
        Row(("run", served), ExitCode.UNAVAILABLE, unreachable_hub, hub),  # staging downloads the weights
        Row(("bench", "run", "decode", "--self-start", served), ExitCode.UNAVAILABLE, unreachable_hub, hub),
        Row(("list",), ExitCode.OK, re.escape(served), hub),  # never asks the Hub
    ])
    plain = box.cli("doctor", "--json", timeout=180)  # its HF checks read the cache and the token, never the Hub
    saved, box.env = box.env, {**box.env, **dict(hub)}
    offline = box.cli("doctor", "--json", timeout=180)
    box.env = saved
    assert offline.returncode == plain.returncode and str(silent_port) not in offline.stdout + offline.stderr
    # -- a recipe nobody has ----------------------------------------------------------------------------
    unknown = re.escape("no recipe named 'no-such-recipe'")
    walk(box, [Row((*cmd, "no-such-recipe"), ExitCode.USAGE, unknown) for cmd in (
        ("run",), ("show",), ("pull",), ("swap",), ("stop",), ("logs",))]
        + [Row(("chat", "no-such-recipe", "hello"), ExitCode.USAGE, unknown),  # one word alone is a prompt
           Row(("bench", "run", "decode", "--self-start", "no-such-recipe"), ExitCode.USAGE, unknown)])
    # -- Docker unavailable ------------------------------------------------------------------------------
    walk(box, [Row(args, ExitCode.UNAVAILABLE, docker_down, no_docker) for args in (
        ("run", served), ("ps",), ("ps", "--json"), ("logs",), ("logs", served), ("stop",), ("stop", served),
        ("swap", served), ("chat", "hello"), ("bench", "run", "decode"))]
        + [Row(("top", "--once"), ExitCode.OK, "no engine found: " + docker_down, no_docker)])

    # -- run of what serves ------------------------------------------------------------------------------
    box.weights_complete()
    first = box.cli("run", served, "--json", check=True)
    launched = json.loads(first.stdout)
    assert launched["already_serving"] is False
    again = box.cli("run", served)
    assert again.returncode == ExitCode.OK, again.stderr
    assert f"✔ {served} is already being served with these settings: nothing was started" in again.stderr
    assert again.stdout.startswith(f"endpoint  {launched['url']}/v1\n"), again.stdout
    as_json = json.loads(box.cli("run", served, "--json", check=True).stdout)
    assert as_json["already_serving"] is True
    assert {k: as_json[k] for k in ("url", "container", "container_id", "run_id")} == {
        k: launched[k] for k in ("url", "container", "container_id", "run_id")}
    walk(box, [
        Row(("run", served, "--set", "resources.memory-utilization=0.8"), ExitCode.FAILED,
            re.escape(f"{served} is already being served by metralectl with other settings: metralectl-{served}")),
        Row(("logs", served), ExitCode.OK, "."),
        Row(("stop", "no-such-recipe"), ExitCode.USAGE, unknown),
    ])
    assert box.containers() == [f"metralectl-{served}"]
    replaced = json.loads(box.cli("run", served, "--set", "resources.memory-utilization=0.8", "--replace", "--json",
                                  check=True).stdout)
    assert replaced["already_serving"] is False and replaced["run_id"] != launched["run_id"]
    assert box.cli("stop", served, check=True).stdout.startswith(f"stopped metralectl-{served} ({served})")
