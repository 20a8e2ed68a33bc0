"""The gateways on the control-plane page (issue 32, item 5), in a real browser against a real agent: a real
gateway (the CLI's, in a subprocess) with its numbers from its own /metrics, one killed with -9 (its record left
behind) shown `gone` with no number, and a record naming a process that runs whose port answers a hostile
/metrics: its model names are shown as text, never as HTML. `/api/serving` carries the same `gateways`.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metralectl.seams import store
from metralectl.seams.process import group
from tests.integration.gateway_client import Gateway
from tests.integration.test_page_chromium import (  # noqa: F401
    agent_on,
    assert_loopback_only,
    assert_no_page_errors,
    browser,
    page,
    wait_for,
)

pytestmark = [pytest.mark.integration]

HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'
ROWS = """
return Array.from(document.querySelectorAll("#gateways tbody tr"), (tr) => ({
  state: tr.dataset.state, cells: Array.from(tr.children, (td) => td.innerText)}));
"""


@pytest.fixture()
def hostile_metrics() -> Iterator[int]:
    """A loopback server answering /metrics with a gateway's series whose model name is HTML (port 0: ours)."""
    label = HOSTILE.replace('"', '\\"')  # the exposition format's escape: the parser gives HOSTILE back
    text = f'metralectl_gateway_models_served 1\nmetralectl_gateway_model_routed{{model="{label}"}} 1\n'.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_page_shows_each_gateway_a_gone_one_without_numbers_and_escapes_their_text(
        page: Any, agent_on: Any, tmp_path: Path, hostile_metrics: int) -> None:  # noqa: F811
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    serving = Gateway(env)
    killed = Gateway(env)
    try:
        assert serving.chat("nobody-serves-this")[0] == 404
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait()
        # a record naming this very process (it runs), its address the hostile server's
        me = group.identity_of(os.getpid())
        store.write_json(store.state_dir() / "gateways" / f"{os.getpid()}.json",
                         {"schema": 1, "url": f"http://127.0.0.1:{hostile_metrics}", "keys": 0, "identity": me,
                          "started": "2026-12-04T05:00:00Z"}, mode=0o600)

        agent = agent_on(env["DOCKER_HOST"])
        origin = f"http://127.0.0.1:{agent.api.port}"
        api = httpx.get(origin + "/api/serving", trust_env=False, timeout=30).json()
        by_pid = {g["pid"]: g for g in api["gateways"]}
        assert sorted(by_pid) == sorted([serving.proc.pid, killed.proc.pid, os.getpid()]), api
        assert by_pid[serving.proc.pid]["state"] == "serving" and by_pid[serving.proc.pid]["requests"] == 1
        assert by_pid[serving.proc.pid]["errors"] == 1, by_pid
        assert by_pid[killed.proc.pid]["state"] == "gone" and by_pid[killed.proc.pid]["requests"] is None
        assert by_pid[os.getpid()]["routed"] == [HOSTILE]

        page.get(origin + "/")
        rows = wait_for(page, 30, lambda d: len(d.execute_script(ROWS)) == 3 and d.execute_script(ROWS),
                        "the page did not list the three gateways", lambda: page.execute_script(ROWS))
        shown = {int(r["cells"][1]): r for r in rows}
        live = shown[serving.proc.pid]
        assert live["state"] == "serving" and live["cells"][0] == f"http://127.0.0.1:{serving.port}", live
        assert live["cells"][2] == "serving" and live["cells"][8:] == ["1", "1"], live  # requests, errors
        gone = shown[killed.proc.pid]
        assert gone["state"] == "gone" and gone["cells"][2] == "gone", gone
        assert set(gone["cells"][3:]) == {"-"}, gone  # no number for a gateway whose process is gone
        assert shown[os.getpid()]["cells"][3] == HOSTILE, shown  # the text itself, as text
        assert page.execute_script("return document.querySelectorAll('#gateways img').length") == 0
        assert page.title != "pwned"
        assert_loopback_only(page, origin)
        assert_no_page_errors(page)
    finally:
        (store.state_dir() / "gateways" / f"{os.getpid()}.json").unlink(missing_ok=True)
        killed.stop()
        serving.stop()
    assert json.dumps(api)  # the API's answer is plain JSON
