"""The served engine over HTTP: health, models, metrics, serve-config, tokenize — over the one HTTP client
(seams/httpclient.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from metralectl.errors import MetralError


@dataclass(frozen=True)
class Health:
    status: int | None  # HTTP status, None when nothing answered
    body: str
    error: str | None = None

    @property
    def ready(self) -> bool:
        return self.status == 200


def base_url(bind: str, port: int) -> str:
    """How to reach a host-network engine from this machine (0.0.0.0 means: any, so loopback works)."""
    host = "127.0.0.1" if bind in ("0.0.0.0", "") else ("[::1]" if bind == "::" else bind)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def health_once(url: str, timeout: float, path: str = "/health", headers: dict[str, str] | None = None) -> Health:
    """One GET of the engine's health, as EngineClient(url, timeout).health() answers it (status, first 500
    characters of the body), for `ps`: a plain http:// URL goes through httpclient.get_once (http.client), since
    importing httpx costs `ps` more than all its other work. Anything else (https://) goes through
    EngineClient. When nothing answers, `error` names the socket's error (httpx would name its own exception
    for it). The URL is a container's label, anyone's on a shared daemon: one that is no http(s) URL is an
    answer that says so, and no more of the body than PEEK_LIMIT is read. `headers`: added to the request (the
    engine token, when the engine asks it)."""
    from urllib.parse import urlsplit

    from metralectl.safetext import clean
    from metralectl.seams.bounded import PEEK_LIMIT
    from metralectl.seams.httpclient import Failed, get_once

    try:
        parts = urlsplit(url.rstrip("/") + path)
        port = parts.port
    except ValueError as exc:  # an unclosed [IPv6, a port that is no number or out of range
        return Health(None, "", f"{clean(url, 120)!r} is not a URL ({exc})")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return Health(None, "", f"{clean(url, 120)!r} is not an http(s) URL")
    if parts.scheme != "http":
        with EngineClient(url, timeout=timeout, headers=headers) as client:
            return client.health(path)
    try:  # only the first 500 characters are kept
        reply = get_once(parts.hostname, port or 80, parts.path + (f"?{parts.query}" if parts.query else ""),
                         timeout, limit=PEEK_LIMIT, headers={"Accept": "*/*", "Connection": "close", **(headers or {})})
    except Failed as exc:
        if exc.bad_url:  # a control character or a space in the host or the path
            return Health(None, "", f"{clean(url, 120)!r} is not a URL ({clean(exc.detail, 120)})")
        return Health(None, "", f"{exc.kind}: {exc.detail}")
    try:  # httpx: the declared charset, else UTF-8
        text = reply.body.decode(reply.charset or "utf-8", "replace")
    except LookupError:
        text = reply.body.decode("utf-8", "replace")
    return Health(reply.status, text[:500])


class EngineClient:
    """A small synchronous client for the engine's control endpoints (not the benchmark hot path), over the one
    HTTP client (seams/httpclient.py). Every body is read streamed and capped (seams/bounded.py): a health or a
    first request's answer to its first characters, JSON to CONTROL_LIMIT (more is unreadable: None), /metrics
    to METRICS_LIMIT (more is an error). A URL that cannot be used (a label that is no URL) is an answer that
    says so, never an exception."""

    def __init__(self, url: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> None:
        from metralectl.seams.httpclient import Client

        self.url = url.rstrip("/")
        self._http = Client(timeout=timeout, headers=headers)

    def _peek(self, method: str, path: str, **kw: Any) -> Health:
        with self._http.stream(method, self.url + path, **kw) as reply:
            text = reply.peek().decode(reply.encoding, "replace")
            return Health(reply.status, text[:500])

    def _json(self, method: str, path: str, **kw: Any) -> object:
        from metralectl.seams.bounded import CONTROL_LIMIT, TooLarge
        from metralectl.seams.httpclient import Failed

        try:
            with self._http.stream(method, self.url + path, **kw) as reply:
                if reply.status != 200:
                    return None
                return json.loads(reply.body(CONTROL_LIMIT, f"{self.url}{path}"))
        except (Failed, ValueError, TooLarge, RecursionError):
            return None

    def health(self, path: str = "/health") -> Health:
        from metralectl.seams.httpclient import Failed

        try:
            return self._peek("GET", path)
        except Failed as exc:
            return Health(None, "", f"{exc.kind}: {exc.detail}")

    def served_model(self) -> str | None:
        data = self.get_json("/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        if isinstance(models, list) and models and isinstance(models[0], dict):
            return str(models[0].get("id"))
        return None

    def metrics_text(self) -> str:
        from metralectl.seams.bounded import METRICS_LIMIT
        from metralectl.seams.httpclient import Failed

        try:
            with self._http.stream("GET", self.url + "/metrics") as reply:
                reply.raise_for_status()
                data = reply.body(METRICS_LIMIT, f"{self.url}/metrics")
                return data.decode(reply.encoding, "replace")
        except Failed as exc:
            raise MetralError(f"cannot read {self.url}/metrics: {exc}") from None

    def serve_config(self) -> dict[str, Any]:
        data = self.get_json("/serve-config")
        return data if isinstance(data, dict) else {}

    def answer_one(self, timeout_s: float, model: str | None = None) -> Health:
        """A real request: one chat completion of max_tokens 1. status None = no answer in time (or refused).

        A healthy multi-rank head whose worker is missing keeps answering /health but hangs every
        request (its first collective waits for the worker); only a request tells them apart.
        """
        from metralectl.seams.httpclient import Failed

        body = {"model": model or "metralectl-check", "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 1, "temperature": 0}
        try:
            return self._peek("POST", "/v1/chat/completions", json=body, timeout=timeout_s)
        except Failed as exc:
            if exc.timed_out:
                return Health(None, "", f"no answer within {timeout_s:g} s")
            return Health(None, "", f"{exc.kind}: {exc.detail}")

    def get_json(self, path: str) -> object:
        """The JSON a GET answers with 200 (callers check its shape), else None (not offered, not ready,
        not JSON, more than CONTROL_LIMIT)."""
        return self._json("GET", path)

    def tokenize_messages(self, model: str, messages: list[dict[str, str]]) -> int | None:
        """Prompt tokens of a chat as the engine counts them; None when it cannot say.

        `/tokenize` with `messages` where the engine takes them (Metrale, vLLM). An engine that reads only
        `content` there answers no tokens for a non-empty chat (llama.cpp): then its own chat template is
        applied (`/apply-template`) and the prompt it gives is tokenized with special tokens parsed, which is
        what its usage counts (25 = 25 on llama-server 11434.0.0)."""
        count = self._token_count("/tokenize", {"model": model, "messages": messages})
        if count or not any(m.get("content") for m in messages):
            return count
        # `model` too, which llama-server ignores: a gateway in front of several engines routes by it
        template = self._post_json("/apply-template", {"model": model, "messages": messages})
        prompt = template.get("prompt") if isinstance(template, dict) else None
        if not isinstance(prompt, str) or not prompt:
            return None
        return self._token_count("/tokenize", {"model": model, "content": prompt, "add_special": True,
                                               "parse_special": True}) or None

    def _post_json(self, path: str, body: dict[str, Any]) -> object:
        return self._json("POST", path, json=body)

    def _token_count(self, path: str, body: dict[str, Any]) -> int | None:
        data = self._post_json(path, body)
        if not isinstance(data, dict):
            return None
        count, tokens = data.get("count"), data.get("tokens")
        if isinstance(count, int):
            return count
        return len(tokens) if isinstance(tokens, list) else None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def requests_active(metrics_text: str, names: tuple[str, ...]) -> float | None:
    """The requests in flight from Prometheus text: the first of the engine's series `names` present
    (its metrics mapping's requests-active; None when none is)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {family.name: family for family in text_string_to_metric_families(metrics_text)}
    for name in names:
        if name in found:
            return sum(s.value for s in found[name].samples)
    return None
