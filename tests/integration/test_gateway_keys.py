"""`metralectl gateway` with API keys, in front of a REAL llama-server process, all through the real CLI.

Keys made by `metralectl gateway keys add` (the file keeps their hashes): a request without a key, or with a
wrong one, is a 401 naming the fix; a key used for a model outside its scope is a 403; in scope, the engine
answers (by the recipe's name and by the engine's alias alike); /v1/models shows a key only its models;
/health stays open; the key is not passed on to the engine; `gateway keys rm` while the gateway runs: that key
is refused from then on, the other still works.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.gateway_client import Gateway
from tests.integration.test_llamacpp_process import TINY, ProcBox, hf_home, llama_server  # noqa: F401

pytestmark = [pytest.mark.integration]


def _with(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keys_let_in_only_their_models_and_a_removed_key_is_refused(tmp_path: Path, hf_home: Path,  # noqa: F811
                                                                     llama_server: Path) -> None:  # noqa: F811
    box = ProcBox(tmp_path, hf_home, llama_server)
    try:
        served = box.recipe("first", TINY, box.own_port(), alias="tiny-first")
        box.cli("run", served, check=True, timeout=300)
        mine = box.cli("gateway", "keys", "add", "mine", "--model", served, check=True).stdout.strip()
        other = json.loads(box.cli("gateway", "keys", "add", "other", "--model", "some-other-model", "--json",
                                   check=True).stdout)["key"]
        kept = (box.home / "config" / "gateway-keys.json").read_text()
        assert mine not in kept and other not in kept and mine[:11] in kept  # hashes at rest, the prefix to tell them

        gateway = Gateway(box.env)
        try:
            chat = {"model": served, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
            status, headers, body = gateway.request("POST", "/v1/chat/completions", chat)
            error = json.loads(body)["error"]
            assert status == 401 and error["code"] == "invalid_api_key" and "gateway keys add" in error["message"]
            assert headers["www-authenticate"].startswith("Bearer")
            status, _, _ = gateway.request("POST", "/v1/chat/completions", chat, headers=_with("mk-" + "x" * 43))
            assert status == 401
            status, _, body = gateway.request("POST", "/v1/chat/completions", chat, headers=_with(other))
            assert status == 403 and json.loads(body)["error"]["code"] == "model_not_allowed", body
            for name in (served, "tiny-first"):  # the recipe's name, and the engine's alias for the same model
                status, _, body = gateway.request("POST", "/v1/chat/completions", {**chat, "model": name},
                                                  headers=_with(mine))
                assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, body
            _, _, body = gateway.request("GET", "/v1/models", headers=_with(mine))
            assert sorted(m["id"] for m in json.loads(body)["data"]) == [served, "tiny-first"]
            _, _, body = gateway.request("GET", "/v1/models", headers=_with(other))
            assert json.loads(body)["data"] == []
            assert gateway.request("GET", "/health")[0] == 200
            assert gateway.request("GET", "/metrics")[0] == 401
            assert gateway.metric("metralectl_gateway_key_requests_total", auth=mine, key="mine") >= 3
            assert gateway.metric("metralectl_gateway_errors_total", auth=mine, reason="unauthorized") == 3

            box.cli("gateway", "keys", "rm", "mine", check=True)
            deadline = time.monotonic() + 30  # the gateway re-reads the file on its 50 ms poll
            while gateway.request("GET", "/v1/models", headers=_with(mine))[0] != 401:
                assert time.monotonic() < deadline, "the removed key was still let in"
                time.sleep(0.05)
            status, _, _ = gateway.request("POST", "/v1/chat/completions", chat, headers=_with(mine))
            assert status == 401
            assert gateway.request("GET", "/v1/models", headers=_with(other))[0] == 200
        finally:
            said = gateway.stop()
        assert "Traceback" not in said and mine not in said and other not in said, said
    finally:
        box.cleanup()
