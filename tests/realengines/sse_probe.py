"""A deliberately literal SSE reader for characterising servers: it keeps the raw bytes and every
`data:` payload as sent, and parses nothing it does not have to (the client under test is
metralectl.bench; this is the measuring stick)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Stream:
    status: int
    headers: dict[str, str]
    raw: bytes
    data: list[str] = field(default_factory=list)  # each event's data payload, in order
    stamps: list[float] = field(default_factory=list)  # monotonic receive time of each payload

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(d) for d in self.data if d != "[DONE]"]

    @property
    def done_sentinel(self) -> bool:
        return "[DONE]" in self.data

    def body_json(self) -> Any:
        return json.loads(self.raw)

    def content_stamps(self, field_name: str = "content") -> list[float]:
        out = []
        for d, t in zip(self.data, self.stamps):
            if d == "[DONE]":
                continue
            choice = (json.loads(d).get("choices") or [{}])[0]
            text = (choice.get("delta") or {}).get(field_name) if field_name == "content" else choice.get("text")
            if text:
                out.append(t)
        return out


def _events(buf: bytes) -> tuple[list[str], bytes]:
    """Complete events' data payloads in buf, and the incomplete rest."""
    out: list[str] = []
    text = buf.replace(b"\r\n", b"\n")
    while b"\n\n" in text:
        block, text = text.split(b"\n\n", 1)
        lines = [ln[5:].lstrip(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
        if lines:
            out.append(b"\n".join(lines).decode())
    return out, text


def post_stream(client: httpx.Client, path: str, body: dict[str, Any]) -> Stream:
    with client.stream("POST", path, json=body) as resp:
        raw = b""
        pending = b""
        s = Stream(resp.status_code, dict(resp.headers), b"")
        for part in resp.iter_raw():
            now = time.monotonic()
            raw += part
            events, pending = _events(pending + part)
            s.data += events
            s.stamps += [now] * len(events)
        s.raw = raw
    return s


async def apost_stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Stream:
    async with client.stream("POST", path, json=body) as resp:
        raw = b""
        pending = b""
        s = Stream(resp.status_code, dict(resp.headers), b"")
        async for part in resp.aiter_raw():
            now = time.monotonic()
            raw += part
            events, pending = _events(pending + part)
            s.data += events
            s.stamps += [now] * len(events)
        s.raw = raw
    return s
