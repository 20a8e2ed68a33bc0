"""The engines behind the gateway ask metralectl's own token once gateway keys exist (docs/gateway.md, "Engines
behind the gateway"), with the REAL llama-server run as a host process, and in a container, all through the real
CLI.

With one gateway key: `run` starts llama-server with `--api-key-file` naming the token file (0644 in a 0700
directory; the token never on the command line nor in `run --print`); a request straight to the engine's port
without the token is a 401 (/metrics too), with it 200; metralectl's own readiness, `ps` health, `chat`, a short
`bench run`, `top --once` and the gateway (a client with its gateway key) all work; `stop` leaves no engine
process and no listener. With no key nothing changes: no flag, no label, no token file, the engine open. In a
container the file is bind-mounted read-only and the flag points at the mount; `docker inspect` shows no token.
"""

from __future__ import annotations

import http.client
import json
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import TEST_HARDWARE, Box
from tests.integration.test_budget_llamacpp import _gateway
from tests.integration.gateway_client import Gateway
from tests.integration.test_llamacpp_lifecycle import _install_models, _llama_recipe, llama_image  # noqa: F401
from tests.integration.test_llamacpp_lifecycle import _requests as _lifecycle_requests
from tests.integration.test_llamacpp_process import (SECOND, TINY, ProcBox, _requests, box, hf_home,  # noqa: F401
                                                     llama_server)

pytestmark = [pytest.mark.integration]
LABEL = "ai.metrale.metralectl.engine-auth"


def _direct(port: int, method: str, path: str, token: str | None = None) -> int:
    """A client that reaches the engine's port itself, past the gateway."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}) if method == "POST" else None
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_with_a_gateway_key_the_engine_asks_the_token_and_everything_of_ours_sends_it(box: ProcBox) -> None:  # noqa: F811
    port = box.own_port()
    served = box.recipe("auth", TINY, port, alias="tiny-auth")
    key = box.cli("gateway", "keys", "add", "mine", "--model", served, check=True).stdout.strip()
    token_file = box.home / "metrale" / "state" / "engine-auth" / "token"

    printed = box.cli("run", served, "--print", check=True).stdout
    assert f"--api-key-file {token_file}" in printed, printed
    spec = box.json("run", served, "--print", "--json")
    assert spec["labels"][LABEL] == "metralectl-token", spec["labels"]

    run = box.cli("run", served, timeout=300)  # its readiness polls /health and asks /v1/models with the token
    assert run.returncode == 0, run.stderr
    token = token_file.read_text().strip()
    assert len(token) == 43 and token not in printed and token not in run.stdout + run.stderr
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o644
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    [engine] = box.engines()
    words = _cmdline(engine)
    assert words[words.index("--api-key-file") + 1] == str(token_file) and token not in words

    # past the gateway: nothing without the token
    assert _direct(port, "POST", "/v1/chat/completions") == 401
    assert _direct(port, "POST", "/v1/chat/completions", "mk-" + "x" * 43) == 401
    assert _direct(port, "GET", "/metrics") == 401
    assert _direct(port, "POST", "/v1/chat/completions", token) == 200
    assert box.cli("gateway", "keys", "engine-token", check=True).stdout.strip() == token  # for an operator who must

    ps = box.json("ps", "--json")
    [row] = ps["serving"]
    assert (row["recipe"], row["health"]) == (served, "ok"), row
    second = box.recipe("auth2", SECOND, port, alias="tiny-auth2")  # a swap drains (/metrics) and starts with it
    swapped = box.json("swap", second, "--json", timeout=300)
    assert swapped["outcome"] == "swapped" and swapped["model"] == "tiny-auth2", swapped
    back = box.json("swap", served, "--json", timeout=300)
    assert back["outcome"] == "swapped" and back["model"] == "tiny-auth", back
    [engine] = box.engines()
    assert "--api-key-file" in _cmdline(engine) and _direct(port, "POST", "/v1/chat/completions") == 401
    chat = box.cli("chat", served, "Hello", "--max-tokens", "4", timeout=120)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
    bench = box.cli("bench", "run", "decode", "-p", "repeats=1", "-p", "max_tokens=8", "-p", "client_bound=warn",
                    "--format", "json", timeout=600)
    record = json.loads(bench.stdout)
    assert bench.returncode == 0 and record["status"] == "completed", bench.stderr
    lines = _requests(box, record)
    assert lines and all(r["ok"] for r in lines), [(r["error_kind"], r["error"]) for r in lines if not r["ok"]]
    top = box.json("top", "--once", "--json", "--interval", "0.5", timeout=60)
    [watched] = [e for e in top["engines"] if e["url"] == f"http://127.0.0.1:{port}"]
    assert watched["state"] == "ok" and watched["totals"]["generation_tokens"] > 0, watched
    # named by its URL, the engine of this box gets its token as well (before: 401 for both)
    chat = box.cli("chat", "--url", f"http://127.0.0.1:{port}/v1", "Hello", "--max-tokens", "4", timeout=120)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
    top = box.json("top", "--once", "--json", "--interval", "0.5", "--url", f"http://127.0.0.1:{port}", timeout=60)
    [watched] = top["engines"]
    assert watched["state"] == "ok" and watched["totals"]["generation_tokens"] > 0, watched

    gateway = Gateway(box.env)
    try:
        chat_body = {"model": served, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
        status, _, body = gateway.request("POST", "/v1/chat/completions", chat_body,
                                          headers={"Authorization": f"Bearer {key}"})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, body
        _, _, body = gateway.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert sorted(m["id"] for m in json.loads(body)["data"]) == [served, "tiny-auth"]  # asked with the token
    finally:
        said = gateway.stop()
    assert "Traceback" not in said and token not in said and key not in said, said

    stopped = box.json("stop", "--json", timeout=120)
    assert [r["removed"] for r in stopped] == [True], stopped
    assert box.engines() == [] and box.supervisors() == [] and not box.listening(port)
    written = [p for p in (box.home / "metrale").rglob("*") if p.is_file() and p != token_file]
    assert written and not [p for p in written if token.encode() in p.read_bytes()]  # no record, log or state keeps it


def test_with_no_key_nothing_changes(box: ProcBox) -> None:  # noqa: F811
    port = box.own_port()
    served = box.recipe("open", TINY, port, alias="tiny-open")
    spec = box.json("run", served, "--print", "--json")
    assert "--api-key-file" not in spec["command"] and LABEL not in spec["labels"]
    run = box.cli("run", served, timeout=300)
    assert run.returncode == 0, run.stderr
    [engine] = box.engines()
    assert "--api-key-file" not in _cmdline(engine)
    assert _direct(port, "POST", "/v1/chat/completions") == 200
    assert not (box.home / "metrale" / "state" / "engine-auth").exists()
    stopped = box.json("stop", "--json", timeout=120)
    assert [r["removed"] for r in stopped] == [True], stopped
    assert box.engines() == [] and not box.listening(port)


@pytest.fixture()
def docker_box(tmp_path: Path, docker_daemon: None) -> Iterator[Box]:
    """A Docker box with no engine double (none is run here): the llama-server image only."""
    machine = Box(tmp_path, {})
    try:
        yield machine
    finally:
        machine.cleanup()


@pytest.mark.docker
def test_a_container_gets_the_token_file_mounted_read_only(docker_box: Box, llama_image: str) -> None:  # noqa: F811
    box = docker_box
    (box.config / "images" / "llama-test.yaml").write_text(
        f"schema: 1\nid: llama-test\nref: {llama_image}\nengine: llama-cpp\nhardware: [{TEST_HARDWARE}]\n"
        "platform: linux/amd64\nrevision-label: org.opencontainers.image.version\n")
    model = _install_models(box)
    port = box.own_port()
    served = _llama_recipe(box, "auth", model["repo"], port)
    box.cli("gateway", "keys", "add", "mine", "--all-models", check=True)
    token_file = box.home / "metrale" / "state" / "engine-auth" / "token"

    run = box.cli("run", served, timeout=300)
    assert run.returncode == 0, run.stderr
    token = token_file.read_text().strip()
    [name] = box.containers()
    inspect = subprocess.run(["docker", "inspect", name], capture_output=True, text=True, check=True).stdout
    assert token not in inspect  # `docker inspect` shows the path, never the token
    [info] = json.loads(inspect)
    args = info["Args"]
    assert args[args.index("--api-key-file") + 1] == "/run/metralectl/engine-token", args
    [mount] = [m for m in info["Mounts"] if m["Destination"] == "/run/metralectl/engine-token"]
    assert mount["Source"] == str(token_file) and mount["RW"] is False, mount
    assert info["Config"]["Labels"][LABEL] == "metralectl-token"

    assert _direct(port, "POST", "/v1/chat/completions") == 401
    assert _direct(port, "POST", "/v1/chat/completions", token) == 200  # the engine in the container read the file
    [row] = json.loads(box.cli("ps", "--json", check=True).stdout)["serving"]
    assert row["health"] == "ok", row
    url = f"http://127.0.0.1:{port}"
    bench = box.cli("bench", "run", "decode", "--url", url, "-p", "repeats=1", "-p", "max_tokens=8",
                    "-p", "client_bound=warn", "--format", "json", timeout=600)
    record = json.loads(bench.stdout)
    assert bench.returncode == 0 and record["status"] == "completed", bench.stderr
    lines = _lifecycle_requests(box, record)
    assert lines and all(r["ok"] for r in lines), [(r["error_kind"], r["error"]) for r in lines if not r["ok"]]
    top = json.loads(box.cli("top", "--once", "--json", "--interval", "0.5", check=True, timeout=60).stdout)
    [watched] = [e for e in top["engines"] if e["url"] == url]
    assert watched["state"] == "ok", watched

    box.cli("stop", "--json", check=True, timeout=120)
    assert box.containers(all_=True) == []


def test_a_model_the_gateway_loads_on_demand_asks_the_token_too(box: ProcBox) -> None:  # noqa: F811
    """The gateway's loader starts engines through `run`'s own path: with a key, the engine it loads asks the token,
    and the gateway's request to it carries the token, never the client's key."""
    port = box.own_port()
    served = box.recipe("loaded", TINY, port, alias="tiny-loaded")
    key = box.cli("gateway", "keys", "add", "mine", "--all-models", check=True).stdout.strip()
    proc, url = _gateway(box)
    try:
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=300, headers={"Authorization": f"Bearer {key}"},
                           json={"model": served, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert reply.status_code == 200, reply.text
        [engine] = box.engines()
        assert "--api-key-file" in _cmdline(engine)
        assert _direct(port, "POST", "/v1/chat/completions") == 401
        assert _direct(port, "POST", "/v1/chat/completions", key) == 401  # a gateway key is no engine token
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    box.cli("stop", "--all", "--json", timeout=120)
    assert box.engines() == [] and not box.listening(port)


@pytest.fixture()
def double_box(tmp_path: Path, engine_images: dict[str, str]) -> Iterator[Box]:
    """A Docker box with the Metrale engine double's images (conftest's `box`, under another name: this module's
    `box` is the host-process one)."""
    machine = Box(tmp_path, engine_images)
    try:
        yield machine
    finally:
        machine.cleanup()


@pytest.mark.docker
def test_metrale_is_handed_require_auth_and_the_tokens_file(double_box: Box) -> None:
    """Metrale's way (engine/metrale.yaml `token-file:`), against the engine double, which holds --require-auth
    --auth-tokens-file as the engine does (POST routes ask the token; /health and /metrics stay open)."""
    box = double_box
    box.weights_complete()
    port = box.own_port()
    served = box.recipe("auth", port=port)
    key = box.cli("gateway", "keys", "add", "mine", "--all-models", check=True).stdout.strip()
    printed = box.cli("run", served, "--print", check=True).stdout
    assert "--require-auth" in printed and "--auth-tokens-file /run/metralectl/engine-token" in printed, printed

    run = box.cli("run", served, timeout=300)
    assert run.returncode == 0, run.stderr
    token = (box.home / "metrale" / "state" / "engine-auth" / "token").read_text().strip()
    assert _direct(port, "POST", "/v1/chat/completions") == 401
    assert _direct(port, "POST", "/v1/chat/completions", token) == 200
    chat = box.cli("chat", served, "Hello", "--max-tokens", "4", timeout=120)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
    gateway = Gateway(box.env)
    try:
        status, _, body = gateway.request("POST", "/v1/chat/completions", {
            "model": served, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3},
            headers={"Authorization": f"Bearer {key}"})
        assert status == 200, body
    finally:
        gateway.stop()
    box.cli("stop", "--json", check=True, timeout=120)
    assert box.containers(all_=True) == []
