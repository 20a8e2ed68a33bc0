"""An engine that crashes under the gateway, and Ctrl-C of the gateway (issue 32, "Must show"), with two REAL
llama-server host processes beside each other on one box (the memory budget lets them), through the real CLI.

- SIGKILL of one engine while clients stream to it: its answer in progress ends cut (the chunked stream stops
  without its end: the client sees it, never a hang); the request it had not begun answering gets 502 in
  OpenAI's shape; requests sent for it afterwards get an answer at once (never left waiting to the stall
  deadline); the gateway's JSON status line names the engine that went and /metrics counts it; a client loop on
  the OTHER model sees nothing but 200 throughout.
- Ctrl-C of the gateway while streams are in flight: exit 130 within seconds, the clients' connections closed,
  every engine still serving (those `run` started and the one the gateway loaded on demand: it never stops an
  engine on its way out), its `ps` record gone.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_client import Gateway
from tests.integration.test_budget_llamacpp import _long_recipe, hf_three  # noqa: F401
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


def _engine_of(box: ProcBox, alias: str) -> int:
    [pid] = [pid for pid in box.engines()
             if alias in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")]
    return pid


def _loop(url: str, model: str, stop: threading.Event, results: list[int]) -> None:
    """A client that keeps asking `model`; each status (-1: no answer at all)."""
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            try:
                results.append(client.post(f"{url}/v1/chat/completions", json={
                    "model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}).status_code)
            except httpx.HTTPError:
                results.append(-1)


def _stream(url: str, model: str, out: list[str], first: threading.Event,
            live: threading.Event | None = None) -> None:
    """A long streamed answer; what its end was: done, cut (the stream stopped short) or the status it got. Nearly the
    slot's whole context: 4000 tokens of the tiny model took ~1 s on a quiet box. With `live`: an answer that ends
    whole is asked again at once, and `live` is set while one is streaming, so a test can act only while both of its
    streams are in flight however fast the engine is (a first stream once ended before the second had begun)."""
    body = {"model": model, "prompt": "Once", "max_tokens": 16000, "stream": True, "ignore_eos": True}
    try:
        with httpx.Client(timeout=httpx.Timeout(60, connect=10)) as client:
            while True:
                with client.stream("POST", f"{url}/v1/completions", json=body) as got:
                    if got.status_code != 200:
                        got.read()
                        out.append(f"{got.status_code} {got.text}")
                        first.set()
                        return
                    whole = False
                    for line in got.iter_lines():
                        if line.startswith("data: "):
                            first.set()
                            if live is not None:
                                live.set()
                            if line == "data: [DONE]":
                                whole = True
                                break
                    if live is not None:
                        live.clear()
                    if not whole:
                        out.append("ended without [DONE]")
                        return
                    if live is None:
                        out.append("done")
                        return
    except httpx.RemoteProtocolError as exc:
        out.append(f"cut: {exc}")
    except httpx.HTTPError as exc:
        out.append(f"error: {type(exc).__name__} {exc}")


def test_a_killed_engine_fails_its_requests_at_once_and_the_other_model_keeps_answering(box: ProcBox) -> None:
    alpha = _long_recipe(box, "alpha", TINY, box.own_port())  # one slot: a second request waits in the engine
    beta = box.recipe("beta", SECOND, box.own_port(), alias="tiny-beta")
    box.cli("run", alpha, check=True, timeout=300)
    box.cli("run", beta, check=True, timeout=300)
    gateway = Gateway(box.env)
    url = f"http://127.0.0.1:{gateway.port}"
    stop, other = threading.Event(), []  # type: ignore[var-annotated]
    loop = threading.Thread(target=_loop, args=(url, "tiny-beta", stop, other), daemon=True)
    loop.start()
    try:
        answering: list[str] = []
        waiting: list[str] = []
        first, second = threading.Event(), threading.Event()
        streams = [threading.Thread(target=_stream, args=(url, alpha, answering, first), daemon=True)]
        streams[0].start()
        assert first.wait(120), answering
        streams.append(threading.Thread(target=_stream, args=(url, "tiny-alpha", waiting, second), daemon=True))
        streams[1].start()
        time.sleep(1.0)  # sent, and waiting for the engine's only slot
        assert not second.is_set() and not waiting, waiting
        before = len(other)

        os.kill(_engine_of(box, "tiny-alpha"), signal.SIGKILL)  # the engine crashes mid-answer
        killed = time.monotonic()
        for stream in streams:
            stream.join(30)
            assert not stream.is_alive(), "a client of the killed engine was left hanging"
        assert time.monotonic() - killed < 30
        [cut] = answering
        assert cut.startswith("cut: ") or cut == "ended without [DONE]", answering  # never a clean end
        [refused] = waiting
        status, _, text = refused.partition(" ")
        assert status == "502", waiting
        error = json.loads(text)["error"]
        assert error["code"] == "upstream_gone" and alpha in error["message"], error

        gone = gateway.wait_line(lambda line: line.get("gone"), timeout=30)  # the status line names it
        assert gone["gone"] == [alpha] and [m["recipe"] for m in gone["models"]] == [beta, beta], gone
        asked = time.monotonic()
        late = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": alpha, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        assert time.monotonic() - asked < 10 and late.status_code in (404, 502), late.text  # at once, never queued
        assert late.json()["error"]["code"] in ("model_not_found", "upstream_gone"), late.text
        assert gateway.metric("metralectl_gateway_engines_gone_total", model=alpha) == 1
        assert gateway.metric("metralectl_gateway_errors_total", model=alpha, reason="upstream") >= 1
        assert gateway.metric("metralectl_gateway_errors_total", model="tiny-alpha", reason="upstream") == 1

        deadline = time.monotonic() + 60
        while len(other) < before + 5:  # and the other model goes on answering after the crash
            assert time.monotonic() < deadline, other
            time.sleep(0.1)
    finally:
        stop.set()
        loop.join(60)  # its last request answered before the gateway stops
        said = gateway.stop()
    assert other and set(other) == {200}, sorted(set(other))
    assert "Traceback" not in said, said


def test_ctrl_c_of_the_gateway_with_streams_in_flight(box: ProcBox) -> None:
    alpha = _long_recipe(box, "alpha", TINY, box.own_port())
    beta = _long_recipe(box, "beta", SECOND, box.own_port())
    box.cli("run", alpha, check=True, timeout=300)
    port = box.own_port()
    gateway = box.popen("gateway", "--listen", f"127.0.0.1:{port}", "--json")  # loading on: beta on demand
    assert gateway.stdout is not None and gateway.stderr is not None
    while json.loads(gateway.stdout.readline())["event"] != "listening":  # a `models` line may come first
        pass
    threading.Thread(target=gateway.stdout.read, daemon=True).start()  # its status lines, never left to block it
    url = f"http://127.0.0.1:{port}"
    records = box.home / "metrale" / "state" / "gateways"
    assert [p.name for p in records.iterdir()] == [f"{gateway.pid}.json"]
    try:
        loaded = httpx.post(f"{url}/v1/completions", timeout=300, json={"model": "tiny-beta", "prompt": "a",
                                                                        "max_tokens": 2})
        assert loaded.status_code == 200, loaded.text
        ends: list[str] = []
        started = [threading.Event(), threading.Event()]
        live = [threading.Event(), threading.Event()]
        streams = [threading.Thread(target=_stream, args=(url, model, ends, ready, now), daemon=True)
                   for model, ready, now in zip((alpha, beta), started, live)]
        for stream in streams:
            stream.start()
        for ready in started:
            assert ready.wait(120), ends
        deadline = time.monotonic() + 120
        while not all(now.is_set() for now in live):  # both in the middle of an answer (one that ended is asked again)
            assert time.monotonic() < deadline and not ends, ends
            time.sleep(0.001)
        gateway.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        assert gateway.wait(15) == 130, gateway.stderr.read()
        assert time.monotonic() - interrupted < 6  # the clients' tasks get 5 s at most
        for stream in streams:
            stream.join(15)
            assert not stream.is_alive(), "a client was left hanging after the gateway stopped"
        assert sorted(ends) and all(e.startswith("cut: ") or e == "ended without [DONE]" for e in ends), ends
        said = gateway.stderr.read()
        assert "Traceback" not in said, said[:3000]
        assert list(records.iterdir()) == []  # its `ps` record gone
        serving = box.json("ps", "--json")
        assert sorted((s["recipe"], s["health"]) for s in serving["serving"]) == [(alpha, "ok"), (beta, "ok")]
        assert serving.get("gateways", []) == [], serving
        for s in serving["serving"]:  # each engine still answers, directly
            answer = httpx.post(f"{s['endpoint']}/v1/completions", timeout=60, json={"prompt": "a", "max_tokens": 2})
            assert answer.status_code == 200, answer.text
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()


def test_with_loading_on_a_request_for_a_crashed_engine_loads_it_again(box: ProcBox) -> None:
    alpha = box.recipe("alpha", TINY, box.own_port(), alias="tiny-alpha")
    port = box.own_port()
    gateway = box.popen("gateway", "--listen", f"127.0.0.1:{port}", "--json")
    assert gateway.stdout is not None and gateway.stderr is not None
    while json.loads(gateway.stdout.readline())["event"] != "listening":
        pass
    threading.Thread(target=gateway.stdout.read, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    body = {"model": "tiny-alpha", "prompt": "a", "max_tokens": 2}
    try:
        assert httpx.post(f"{url}/v1/completions", timeout=300, json=body).status_code == 200  # loaded on demand
        first = _engine_of(box, "tiny-alpha")
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while f'metralectl_gateway_engines_gone_total{{model="{alpha}"}} 1.0' not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline, "the gateway never saw the engine go"
            time.sleep(0.1)
        again = httpx.post(f"{url}/v1/completions", timeout=300, json=body)  # loaded again, as on first use
        assert again.status_code == 200, again.text
        assert _engine_of(box, "tiny-alpha") != first
        metrics = httpx.get(f"{url}/metrics").text
        assert f'metralectl_gateway_loads_total{{model="{alpha}",outcome="loaded"}} 2.0' in metrics, metrics
    finally:
        gateway.send_signal(signal.SIGINT)
        assert gateway.wait(30) == 130
