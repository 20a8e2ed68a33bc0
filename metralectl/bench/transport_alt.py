"""The comparison transports behind the same seam: httpx (the project's HTTP library) and aiohttp (only if
installed). Each stamps every raw read as it is handed over; the start stamp is taken when the request
is handed to the library, as a user of that library would. benchmarks/bench_client.py measures them
against `raw`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from metralectl.bench.sse import END_CANCELLED, END_COMPLETE, END_LOST, END_OVERSIZE, END_TIMEOUT, RawResponse
from metralectl.bench.transport import perf_ns
from metralectl.errors import UsageError


class HttpxTransport:
    """For comparison (and the brief's default): httpx's pool, each raw read stamped. httpcore checks an
    idle connection for EOF before reusing it; a request that a reused connection then answers with
    nothing at all is sent once more on a fresh connection, as the raw transport does (its `stream`)."""

    def __init__(self, url: str, path: str, pool: int, headers: Mapping[str, str] | None = None) -> None:
        import httpx

        self.url = url.rstrip("/") + path
        self.base = url.rstrip("/")
        limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
        common: dict[str, Any] = {"timeout": None, "trust_env": False,
                                  "headers": {"Content-Type": "application/json", **(headers or {})}}
        self._client = httpx.AsyncClient(limits=limits, **common)
        # the second sends: a connection of their own, closed after the response (nothing kept alive)
        fresh = httpx.Limits(max_connections=pool, max_keepalive_connections=0)
        self._fresh = httpx.AsyncClient(limits=fresh, **common)
        self._httpx = httpx

    async def open(self, prewarm: int) -> None:
        # fill the pool now (concurrent requests each take a connection), as the raw transport does
        await asyncio.gather(*(self._client.get(self.base + "/health") for _ in range(prewarm)), return_exceptions=True)

    async def stream(self, body: bytes, timeout_s: float, raw: RawResponse | None = None) -> RawResponse:
        raw = raw if raw is not None else RawResponse(perf_ns())
        connected: list[str] = []  # httpcore's trace names a connection it opens for this request

        async def trace(name: str, info: Mapping[str, Any]) -> None:
            if name.startswith("connection.connect_"):
                connected.append(name)

        def go(client: Any, extensions: dict[str, Any]) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                async with client.stream("POST", self.url, content=body, extensions=extensions) as resp:
                    raw.t_headers, raw.status = perf_ns(), resp.status_code
                    async for data in resp.aiter_raw():
                        if _cut(raw, data):
                            return
            return run

        httpx = self._httpx
        error = await _collect(go(self._client, {"trace": trace}), raw, timeout_s, httpx.HTTPError)
        # Nothing came back on a connection the pool reused: httpcore says "Server disconnected without
        # sending a response" (EOF) or a read/write error (a reset) before any response head. httpx does not
        # tell whether part of a head arrived before a reset; h11 needs a whole head to say it did.
        unanswered = raw.status is None and (
            isinstance(error, (httpx.ReadError, httpx.WriteError))
            or (isinstance(error, httpx.RemoteProtocolError) and "without sending a response" in str(error)))
        if unanswered and not connected:
            raw.restart(raw.error or "the server closed the kept-alive connection before answering")
            await _collect(go(self._fresh, {}), raw, timeout_s, httpx.HTTPError)
        return raw

    async def close(self) -> None:
        await self._client.aclose()
        await self._fresh.aclose()


class AiohttpTransport:
    """For comparison: aiohttp (not a dependency; only when installed). It does not send a request again
    (aiohttp retries only idempotent methods on a reused connection that closed; POST is not one)."""

    def __init__(self, url: str, path: str, pool: int, headers: Mapping[str, str] | None = None) -> None:
        try:
            import aiohttp
        except ImportError:
            raise UsageError("the aiohttp transport needs aiohttp installed", "pip install aiohttp, or use transport=raw") from None
        self._aiohttp = aiohttp
        self.url = url.rstrip("/") + path
        self.base = url.rstrip("/")
        self.pool = pool
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self._session: object | None = None

    async def open(self, prewarm: int) -> None:
        aiohttp = self._aiohttp
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.pool),
                                        timeout=aiohttp.ClientTimeout(total=None), headers=self.headers)
        self._session = session

        async def warm() -> None:
            async with session.get(self.base + "/health") as resp:
                await resp.read()

        await asyncio.gather(*(warm() for _ in range(prewarm)), return_exceptions=True)

    async def stream(self, body: bytes, timeout_s: float, raw: RawResponse | None = None) -> RawResponse:
        raw = raw if raw is not None else RawResponse(perf_ns())
        session = self._session
        assert session is not None

        async def go() -> None:
            async with session.post(self.url, data=body) as resp:  # type: ignore[attr-defined]
                raw.t_headers, raw.status = perf_ns(), resp.status
                async for data in resp.content.iter_any():
                    if _cut(raw, data):
                        return

        await _collect(go, raw, timeout_s, self._aiohttp.ClientError)
        return raw

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()  # type: ignore[attr-defined]


def _cut(raw: RawResponse, data: bytes) -> bool:
    """Keep one read; past an event's or the body's limit the response ends failed there (the library closes
    the connection as the reader leaves its `async with`)."""
    cut = raw.keep(perf_ns(), data)
    if cut is not None:
        raw.error, raw.end = cut, END_OVERSIZE
        return True
    return False


async def _collect(go: Callable[[], Awaitable[None]], raw: RawResponse, timeout_s: float,
                   client_error: type[BaseException]) -> BaseException | None:
    """Run one request's reader under the timeout; a timeout or the library's own error lands in raw.error
    (the library's error is returned too, for the caller to judge)."""
    raw.t_send = perf_ns()
    caught: BaseException | None = None
    try:
        await asyncio.wait_for(go(), timeout_s)
        raw.end = raw.end or END_COMPLETE  # END_OVERSIZE when the reader cut it
    except asyncio.TimeoutError:
        raw.error, raw.end = f"timed out after {timeout_s:g} s", END_TIMEOUT
    except client_error as exc:
        raw.error, raw.end, caught = f"{type(exc).__name__}: {exc}", END_LOST, exc
    except asyncio.CancelledError:
        raw.error, raw.end = "cancelled", END_CANCELLED
        raw.t_done = perf_ns()
        raise
    raw.t_done = perf_ns()
    return caught
