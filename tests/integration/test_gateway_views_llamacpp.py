"""Several served models and the gateway as `top` shows them (issue 32, item 5), with two REAL llama-server host
processes beside each other on one box and the real CLI's gateway routing to both.

- `top --once --json`: a row per served engine (recipe, engine, the model id it serves, its port, its numbers) and a
  `gateways` list read from the gateway's own /metrics (found through its state record): the recipes it routes,
  its requests and errors; the plain view says the same in its tables.
- With API keys in force (a client needs one, /metrics too), `top` still reads the gateway's /metrics: with the
  credential its own 0600 state record holds, which `ps --json` never prints.
- The gateway killed with -9 leaves its record behind: `top` shows it `gone`, with no number, never as serving.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.gateway_client import Gateway
from tests.integration.test_budget_llamacpp import hf_three  # noqa: F401
from tests.integration.test_llamacpp_process import SECOND, TINY, ProcBox, llama_server  # noqa: F401

pytestmark = [pytest.mark.integration]


@pytest.fixture()
def box(tmp_path: Path, hf_three: Path, llama_server: Path) -> Iterator[ProcBox]:  # noqa: F811
    machine = ProcBox(tmp_path, hf_three, llama_server)
    (machine.config / "box.yaml").write_text("budget: 4\n")  # both beside each other
    try:
        yield machine
    finally:
        machine.cleanup()


def _top(box: ProcBox) -> dict[str, Any]:
    data: dict[str, Any] = box.json("top", "--once", "--json", "--interval", "0.5", timeout=60)
    return data


def test_top_shows_every_served_model_and_the_gateway_and_a_killed_gateway_as_gone(box: ProcBox) -> None:
    ports = {"alpha": box.own_port(), "beta": box.own_port()}
    alpha = box.recipe("alpha", TINY, ports["alpha"], alias="tiny-alpha")
    beta = box.recipe("beta", SECOND, ports["beta"], alias="tiny-beta")
    for recipe in (alpha, beta):
        box.cli("run", recipe, check=True, timeout=300)
    key = box.cli("gateway", "keys", "add", "client", "--model", "*", check=True).stdout.strip()
    gateway = Gateway(box.env)
    try:
        both = lambda line: len({m["recipe"] for m in line["models"]}) == 2  # noqa: E731
        if not both(gateway.first):  # the listening line may name both already
            gateway.wait_line(both)
        for model in ("tiny-alpha", "tiny-alpha", "tiny-beta"):
            chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            assert gateway.request("POST", "/v1/chat/completions", chat, headers={"Authorization": f"Bearer {key}"}
                                   )[0] == 200
        assert gateway.request("POST", "/v1/chat/completions", {"model": "nobody-serves-this", "messages": []},
                               headers={"Authorization": f"Bearer {key}"})[0] == 404
        assert gateway.request("GET", "/metrics")[0] == 401  # keys in force: /metrics is not anyone's
        record = box.home / "metrale" / "state" / "gateways" / f"{gateway.proc.pid}.json"
        assert record.stat().st_mode & 0o777 == 0o600
        monitor = json.loads(record.read_text())["monitor"]
        assert monitor not in box.cli("ps", "--json", check=True).stdout

        top = _top(box)
        engines = {e["recipe"]: e for e in top["engines"]}
        assert sorted(engines) == [alpha, beta], top["engines"]
        for short, recipe in (("alpha", alpha), ("beta", beta)):
            row = engines[recipe]
            assert row["state"] == "ok" and row["engine"] == "llama-cpp", row
            assert row["model"] == f"tiny-{short}" and row["port"] == ports[short], row
            assert row["totals"]["generation_tokens"] > 0 and row["totals"]["prompt_tokens"] > 0, row  # mapped
        [shown] = top["gateways"]
        assert shown["url"] == f"http://127.0.0.1:{gateway.port}" and shown["pid"] == gateway.proc.pid, shown
        assert shown["state"] == "serving" and shown["error"] is None, shown
        assert shown["routed"] == [alpha, beta] and shown["loading"] == [] and shown["models_served"] == 2, shown
        assert shown["requests"] == 5 and shown["errors"] == 2 and shown["queue_depth"] == 0, shown  # the 401 too
        assert shown["errors_by_reason"] == {"unknown-model": 1, "unauthorized": 1}, shown
        assert shown["evictions"] == 0 and shown["keys"] == 1, shown

        plain = box.cli("top", "--once", "--interval", "0.3", check=True, timeout=60).stdout
        for word in (alpha, beta, "tiny-alpha", "tiny-beta", str(ports["alpha"]), f"127.0.0.1:{gateway.port}",
                     "serving", "ROUTED"):
            assert word in plain, plain

        gateway.proc.send_signal(signal.SIGKILL)  # its record stays: its process is gone
        gateway.proc.wait()
        [gone] = _top(box)["gateways"]
        assert gone["state"] == "gone" and gone["pid"] == gateway.proc.pid, gone
        assert gone["requests"] is None and gone["routed"] == [] and gone["models_served"] is None, gone
        plain = box.cli("top", "--once", "--interval", "0.3", check=True, timeout=60).stdout
        [line] = [x for x in plain.splitlines() if x.startswith(f"http://127.0.0.1:{gateway.port}")]
        assert " gone " in line and "serving" not in line, plain
        # the engines serve on, straight to their own ports
        for short in ("alpha", "beta"):
            reply = httpx.post(f"http://127.0.0.1:{ports[short]}/v1/completions", timeout=60,
                               json={"prompt": "a", "max_tokens": 1})
            assert reply.status_code == 200, reply.text
    finally:
        gateway.stop()
