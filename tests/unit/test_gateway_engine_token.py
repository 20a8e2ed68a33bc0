"""The gateway in front of engines that ask metralectl's engine token (docs/gateway.md, "Engines behind the
gateway"): the scan reads it for an engine of ours whose labels say it asks it (and asks /v1/models with it), and
every request upstream carries it in place of the client's own Authorization, which is never passed on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from metralectl.core.labels import (ENGINE_AUTH_TOKEN, LABEL_ENDPOINT, LABEL_ENGINE_AUTH, LABEL_MANAGED, LABEL_OWNER,
                                    LABEL_RECIPE, owner)
from metralectl.gateway import http1
from metralectl.gateway.dispatch import Routed
from metralectl.gateway.routes import Route, Scanner
from metralectl.gateway.server import Gateway
from metralectl.lifecycle import engine_token
from metralectl.seams.docker.containers import ContainerInfo
from tests.fakes.runtime import FakeRuntime


class Engine:
    """A stub engine on loopback that answers 200 to whoever shows the token, 401 to anyone else."""

    def __init__(self, token: str) -> None:
        self.token, self.seen = token, []  # type: str, list[str | None]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        await reader.readexactly(int(fields.get("content-length", "0")))
        self.seen.append(fields.get("authorization"))
        ok = fields.get("authorization") == f"Bearer {self.token}"
        body = json.dumps({"data": [{"id": "tiny", "owned_by": "llamacpp"}]} if ok else {"error": "no"}).encode()
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (200 if ok else 401, len(body), body))
        await writer.drain()
        writer.close()


class Client:
    """What the gateway's relay uses of a client's connection and its transport."""

    def __init__(self) -> None:
        self.data = b""
        self.transport = self

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    async def drain(self) -> None:
        return None


def _engine_record(url: str, labels: dict[str, str]) -> ContainerInfo:
    return ContainerInfo(id="e1", name="metralectl-tiny", image="img", status="running", exit_code=None,
                         oom_killed=False, started_at=None, finished_at=None,
                         labels={LABEL_MANAGED: "true", LABEL_OWNER: owner(), LABEL_RECIPE: "tiny", LABEL_ENDPOINT: url,
                                 **labels})


def test_the_scan_and_every_request_upstream_carry_the_engine_token_never_the_clients_key() -> None:
    engine_token.ensure()
    token = engine_token.read()

    async def go() -> tuple[Route, bytes, Engine]:
        engine = Engine(token)
        server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        runtime = FakeRuntime()
        runtime.seed(_engine_record(url, {LABEL_ENGINE_AUTH: ENGINE_AUTH_TOKEN}))
        scanner = Scanner(runtime_factory=lambda: runtime)
        try:
            table = await asyncio.to_thread(scanner.scan)
            route = table.find("tiny")
            assert route is not None
            gw = Gateway(scanner)
            request = http1.Request("POST", "/v1/chat/completions", "HTTP/1.1",
                                    [("Authorization", "Bearer mk-the-clients-own"), ("Content-Type", "application/json")],
                                    b'{"model": "tiny"}')
            client = Client()
            routed = Routed(request, "/v1/chat/completions", {"model": "tiny"}, "tiny")
            await gw._forward(route, routed, client)  # type: ignore[arg-type]
            gw.pool.close()
            return route, client.data, engine
        finally:
            server.close()

    route, answered, engine = asyncio.run(go())
    assert route.names == ("tiny",) and route.models == ("tiny",)  # /v1/models asked with the token
    assert answered.startswith(b"HTTP/1.1 200")
    assert engine.seen == [f"Bearer {token}", f"Bearer {token}"]  # the scan's, then the request's: never mk-...
    assert token not in repr(route)  # a route is shown in logs and status lines


def test_an_engine_that_does_not_ask_it_gets_no_token() -> None:
    engine_token.ensure()
    record = _engine_record("http://127.0.0.1:9", {})
    runtime = FakeRuntime()
    runtime.seed(record)
    scanner = Scanner(runtime_factory=lambda: runtime)
    scanner._models[("e1", "http://127.0.0.1:9")] = ((), None)  # asked already: no request here
    route: Any = scanner.scan().find("tiny")
    assert route is not None and route.upstream == ()
