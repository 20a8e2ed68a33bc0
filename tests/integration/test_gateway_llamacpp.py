"""`metralectl gateway` in front of REAL llama-server processes (host processes, the tiny GGUFs of
tests/real_llamacpp/build_tiny_gguf.py, CI's cached binary), all through the real CLI, on loopback.

- Two models, each found the way `ps` finds it: each request goes to the engine serving the name it asks for
  (recipe name or the engine's alias), as the engines' own token counters show; /v1/models lists them; an
  unknown name is a 404 listing them; streams arrive whole, event by event.
- A client that goes away mid-stream: the engine stops generating (its own requests-processing series drops to 0
  long before the answer would have ended), and the first events reached the client long before the end
  (relayed as they came, not gathered).
- `metralectl swap` of the served model while clients keep sending: every request answered 200.

Until the memory budget lands (issue 32, item 2) `run` refuses a second model on a box, so the second engine is
started by `metralectl run` on a second box and its host-process state put beside the first's, exactly as the
runtime wrote it: `ps` on the first box then shows both, which is what the gateway reads.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from metralectl.gateway.pool import SPARES
from tests.integration.gateway_client import Gateway
from tests.integration.test_llamacpp_process import (SECOND, TINY, ProcBox, big_model, hf_home,  # noqa: F401
                                                     llama_server)

pytestmark = [pytest.mark.integration]


def _engine_metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not on the engine's /metrics")


def _to_engine(gateway: Gateway, port: int) -> int:
    """The gateway's open connections to the engine's port (its own process's sockets, as the kernel lists them)."""
    import psutil

    process = psutil.Process(gateway.proc.pid)
    listed = process.net_connections("tcp") if hasattr(process, "net_connections") else process.connections("tcp")
    return sum(1 for c in listed
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


@pytest.fixture()
def two(tmp_path: Path, hf_home: Path, llama_server: Path) -> Iterator[tuple[ProcBox, ProcBox]]:  # noqa: F811
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = ProcBox(tmp_path / "a", hf_home, llama_server), ProcBox(tmp_path / "b", hf_home, llama_server)
    try:
        yield a, b
    finally:
        b.cleanup()
        a.cleanup()


def test_each_request_goes_to_the_engine_serving_its_model(two: tuple[ProcBox, ProcBox]) -> None:
    a, b = two
    port_a, port_b = a.own_port(), b.own_port()
    first = a.recipe("first", TINY, port_a, alias="tiny-first")
    second = b.recipe("second", SECOND, port_b, alias="tiny-second")
    a.cli("run", first, check=True, timeout=300)
    b.cli("run", second, check=True, timeout=300)
    shutil.copy(b.states / f"metralectl-{second}.json", a.states)  # the second engine, as a second run leaves it
    assert sorted(s["recipe"] for s in a.json("ps", "--json")["serving"]) == [first, second]
    gateway = Gateway(a.env)
    try:
        names = [m["name"] for m in gateway.first["models"]]
        assert names == [first, second, "tiny-first", "tiny-second"], gateway.first
        status, _, body = gateway.request("GET", "/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == names
        for model, port, other in (("tiny-first", port_a, port_b), (second, port_b, port_a),
                                   ("tiny-second", port_b, port_a), (first, port_a, port_b)):
            before, untouched = (_engine_metric(port, "llamacpp:tokens_predicted_total"),
                                 _engine_metric(other, "llamacpp:tokens_predicted_total"))
            status, _, body = gateway.chat(model, max_tokens=7)
            assert status == 200, body
            answer = json.loads(body)
            assert answer["usage"]["completion_tokens"] == 7 and answer["model"].startswith("tiny-"), answer
            assert _engine_metric(port, "llamacpp:tokens_predicted_total") == before + 7, model
            assert _engine_metric(other, "llamacpp:tokens_predicted_total") == untouched, model
        status, _, body = gateway.request("POST", "/v1/completions", {"model": second, "prompt": "Hi", "max_tokens": 3})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, body
        status, headers, body = gateway.chat("tiny-second", max_tokens=5, stream=True)
        events = [e for e in body.decode().split("\n\n") if e.strip()]
        assert status == 200 and headers["content-type"].startswith("text/event-stream"), headers
        assert events[-1] == "data: [DONE]" and len(events) >= 7, events
        status, _, body = gateway.request("POST", "/tokenize", {"content": "Hello"})  # two engines: which?
        assert status == 400 and json.loads(body)["error"]["code"] == "model_missing", body
        status, _, body = gateway.request("POST", "/tokenize", {"content": "Hello", "model": second})
        assert status == 200 and json.loads(body)["tokens"], body
        chat = [{"role": "user", "content": "Hello"}]
        status, _, body = gateway.request("POST", "/apply-template", {"model": first, "messages": chat})
        assert status == 200 and "Hello" in json.loads(body)["prompt"], body
        # bench through the gateway sizes its prompts with the engine's own counters, as it does direct
        for url in (f"http://127.0.0.1:{gateway.port}", f"http://127.0.0.1:{port_b}"):
            record = a.json("bench", "run", "concurrency-sweep", "--url", url, "-p", "concurrencies=1", "-p", "isls=48",
                            "-p", "osl=2", "-p", "duration_s=0.3", "-p", "warmup_s=0", "-p", "model=tiny-second",
                            "-p", "client_bound=warn", "--format", "json", timeout=300)
            assert record["prompt_sizing"]["48"]["method"] == "tokenize", (url, record["prompt_sizing"])
        status, _, body = gateway.chat("no-such-model")
        error = json.loads(body)["error"]
        assert status == 404 and error["code"] == "model_not_found" and error["served"] == names, body
        assert gateway.metric("metralectl_gateway_requests_total", model="tiny-first", status="200") == 1
        assert gateway.metric("metralectl_gateway_errors_total", reason="unknown-model") == 1
        # clients that stop reading at `data: [DONE]` and close, before or after llama-server's last chunk came:
        # answered, every one, none client-gone (it writes `0\r\n` with [DONE] and the last CRLF apart)
        answered = gateway.metric("metralectl_gateway_requests_total", model="tiny-second", status="200")
        for _ in range(8):
            _stream_until_done(gateway.port, "tiny-second")
        deadline = time.monotonic() + 30
        while gateway.metric("metralectl_gateway_requests_total", model="tiny-second", status="200") < answered + 8:
            assert time.monotonic() < deadline, "a client that read its whole answer was not counted as answered"
            time.sleep(0.05)
        assert gateway.metric("metralectl_gateway_errors_total", reason="client-gone") == 0
        assert gateway.first["event_loop"] == "uvloop"  # a dependency on Linux: auto serves on it
    finally:
        said = gateway.stop()
    assert "Traceback" not in said, said
    on_asyncio = Gateway(a.env, "--event-loop", "asyncio")  # the other loop relays the same answers
    try:
        assert on_asyncio.first["event_loop"] == "asyncio"
        status, _, body = on_asyncio.chat("tiny-first", max_tokens=4)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, body
        status, _, body = on_asyncio.chat("tiny-second", max_tokens=5, stream=True)
        events = [e for e in body.decode().split("\n\n") if e.strip()]
        assert status == 200 and events[-1] == "data: [DONE]" and len(events) >= 7, events
    finally:
        said = on_asyncio.stop()
    assert "Traceback" not in said, said


def _stream_until_done(port: int, model: str) -> None:
    """A streamed chat whose client reads until `data: [DONE]` and closes (many do; gateway_paired.py too)."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": 3,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        seen = b""
        while b"data: [DONE]" not in seen:
            piece = raw.recv(65536)
            assert piece, seen
            seen += piece
    assert seen.startswith(b"HTTP/1.1 200 "), seen[:200]


def test_a_client_that_goes_away_cancels_its_request_in_the_engine(tmp_path: Path, hf_home: Path,  # noqa: F811
                                                                   llama_server: Path,  # noqa: F811
                                                                   big_model: str) -> None:  # noqa: F811
    box = ProcBox(tmp_path, hf_home, llama_server)
    try:
        port = box.own_port()
        big = box.recipe("big", big_model, port, alias="big")  # a 1B model: a long answer takes many seconds on a CPU
        box.cli("run", big, check=True, timeout=300)
        gateway = Gateway(box.env)
        try:
            body = json.dumps({"model": "big", "prompt": "Once", "max_tokens": 400, "stream": True}).encode()
            raw = socket.create_connection(("127.0.0.1", gateway.port), timeout=120)
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            began, arrivals, seen = time.monotonic(), [], b""
            while seen.count(b"data: ") < 4:
                piece = raw.recv(65536)
                assert piece, seen
                seen += piece
                arrivals.append(time.monotonic() - began)
            assert seen.startswith(b"HTTP/1.1 200 ") and b"data: [DONE]" not in seen
            assert len(arrivals) >= 2 and arrivals[-1] > arrivals[0], arrivals  # the events came one by one
            assert _engine_metric(port, "llamacpp:requests_processing") == 1
            raw.close()  # the client goes away mid-answer
            gone = time.monotonic()
            while _engine_metric(port, "llamacpp:requests_processing") != 0:
                assert time.monotonic() - gone < 10, "the engine kept generating for a client that had left"
                time.sleep(0.1)
            predicted = _engine_metric(port, "llamacpp:tokens_predicted_total")
            assert predicted < 400, predicted  # it stopped short of the answer it was asked for

            # not streamed: nothing is written to the client until the end, yet its leaving is seen at once and the
            # engine's connection closed (llama-server itself only stops a non-streamed answer when it ends)
            body = json.dumps({"model": "big", "prompt": "Once", "max_tokens": 400}).encode()
            raw = socket.create_connection(("127.0.0.1", gateway.port), timeout=120)
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            deadline = time.monotonic() + 60
            while _engine_metric(port, "llamacpp:requests_processing") != 1:
                assert time.monotonic() < deadline, "the engine never started the answer"
                time.sleep(0.05)
            during = _to_engine(gateway, port)  # the request's, and the spare opened as it was taken (pool.py)
            assert 1 <= during <= 1 + SPARES, during
            raw.close()
            gone = time.monotonic()
            while _to_engine(gateway, port) >= during:
                assert time.monotonic() - gone < 5, "the gateway kept the engine's connection for a client that had left"
                time.sleep(0.05)
            status, _, answer = gateway.chat("big", max_tokens=2)  # and the gateway still serves
            assert status == 200, answer
            assert gateway.metric("metralectl_gateway_requests_in_flight", model="big") == 0
            # the two that left mid-answer: client-gone, not answered; the last one answered
            assert gateway.metric("metralectl_gateway_errors_total", model="big", reason="client-gone") == 2
            assert gateway.metric("metralectl_gateway_requests_total", model="big") == 1
        finally:
            gateway.stop()
    finally:
        box.cleanup()


def test_a_swap_while_clients_send_loses_no_request(tmp_path: Path, hf_home: Path,  # noqa: F811
                                                    llama_server: Path) -> None:  # noqa: F811
    box = ProcBox(tmp_path, hf_home, llama_server)
    try:
        first = box.recipe("first", TINY, box.own_port(), alias="tiny-first")
        second = box.recipe("second", SECOND, box.own_port(), alias="tiny-second")
        box.cli("run", first, check=True, timeout=300)
        gateway = Gateway(box.env)
        status, _, body = gateway.request("POST", "/tokenize", {"content": "Hello"})  # one engine: it, unnamed
        assert status == 200 and json.loads(body)["tokens"], body
        results: list[tuple[str, int, bytes]] = []
        stop = threading.Event()

        def client(model: str, stream: bool) -> None:
            while not stop.is_set():
                status, _, body = gateway.chat(model, max_tokens=4, stream=stream, timeout=300)
                complete = body.rstrip().endswith(b"data: [DONE]") if stream else b'"completion_tokens":4' in body
                results.append((model, status if complete else -status, body[-300:]))

        try:
            workers = [threading.Thread(target=client, args=(model, stream), daemon=True)
                       for model in ("tiny-first", first) for stream in (False, True)]
            for worker in workers:
                worker.start()
            deadline = time.monotonic() + 120  # answered before the swap (a busy box: not a fixed sleep)
            while len(results) < 4:
                assert time.monotonic() < deadline, results
                time.sleep(0.05)
            before = len(results)
            swapped = box.json("swap", first, "--set", "serve.ctx-size=2048", "--json", timeout=300)  # new settings
            assert swapped["outcome"] == "swapped", swapped
            while len(results) < before + 4:  # and after it
                assert time.monotonic() < deadline + 300, (before, len(results))
                time.sleep(0.05)
            stop.set()
            for worker in workers:
                worker.join(timeout=120)
            assert before > 0 and len(results) > before, (before, len(results))
            failed = [r for r in results if r[1] != 200]
            assert not failed, failed[:5]
            assert gateway.metric("metralectl_gateway_queue_wait_seconds_count", model="tiny-first") >= 1

            # a swap to another model: its requests, sent once the swap began, wait for it and are answered
            asked: list[tuple[int, dict[str, str], bytes]] = []
            proc = box.popen("swap", second)
            deadline = time.monotonic() + 60
            while not (box.home / "metrale" / "state" / "swap-journal.json").exists():
                assert time.monotonic() < deadline and proc.poll() is None, "the swap never began"
                time.sleep(0.01)
            waiter = threading.Thread(target=lambda: asked.append(gateway.chat(second, max_tokens=3)))
            waiter.start()
            assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
            waiter.join(timeout=60)
            [(status, _, body)] = asked
            assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, body
        finally:
            stop.set()
            gateway.stop()
    finally:
        box.cleanup()


def test_a_kept_alive_client_keeps_its_connection_through_the_gateway_where_llama_server_closes_it(
        tmp_path: Path, hf_home: Path, llama_server: Path) -> None:  # noqa: F811
    """metralectl bench's own transport (kept alive, checked before reuse, a request the server closed under sent
    once more) sends streamed chats in turn to the gateway and to the engine behind it, as the paired overhead
    benchmark's `--connections keep-alive` does: every one is answered whole on both; through the gateway one
    connection serves them all, while llama-server closes its streamed connections (tests/real_llamacpp/README.md),
    so the same client talking to it directly opens more. docs/gateway.md says what that does to the figures."""
    import asyncio

    from metralectl.bench.sse import parse_stream
    from metralectl.bench.transport import RawTransport

    box = ProcBox(tmp_path, hf_home, llama_server)
    try:
        port = box.own_port()
        tiny = box.recipe("tiny", TINY, port, alias="tiny")
        box.cli("run", tiny, check=True, timeout=300)
        gateway = Gateway(box.env)
        try:
            async def send_in_turn() -> dict[str, tuple[RawTransport, list[str]]]:
                paths = {"gateway": f"http://127.0.0.1:{gateway.port}", "direct": f"http://127.0.0.1:{port}"}
                seen = {name: (RawTransport(url, "/v1/chat/completions", 1), []) for name, url in paths.items()}
                body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hello"}],
                                   "max_tokens": 8, "stream": True}).encode()
                for _ in range(8):
                    for transport, outcomes in seen.values():
                        raw = await transport.stream(body, 120)
                        parsed = parse_stream(raw.pieces)
                        outcomes.append("ok" if raw.status == 200 and parsed.done and parsed.events
                                        else f"{raw.status} {raw.error} {raw.end}")
                for transport, _ in seen.values():
                    await transport.close()
                return seen

            seen = asyncio.run(send_in_turn())
            for name, (transport, outcomes) in seen.items():
                assert outcomes == ["ok"] * 8, (name, outcomes)
            through, direct = seen["gateway"][0], seen["direct"][0]
            assert through.opened == 1 and through.idle_closed == 0, (through.opened, through.idle_closed)
            assert direct.opened > 1, direct.opened  # llama-server closed at least one streamed connection
        finally:
            gateway.stop()
    finally:
        box.cleanup()
