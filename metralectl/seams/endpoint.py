"""The served engine over HTTP: health, models, metrics, serve-config. httpx lives here (lazily)."""

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


def health_once(url: str, timeout: float, path: str = "/health") -> Health:
    """One GET of the engine's health, as EngineClient(url, timeout).health() answers it (status, first 500
    characters of the body), for `ps`: a plain http:// URL goes through http.client, since importing httpx
    costs `ps` more than all its other work. Anything else (https://) goes through EngineClient. When nothing
    answers, `error` names the socket's error (httpx would name its own exception for it)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.rstrip("/") + path)
    if parts.scheme != "http" or not parts.hostname:
        with EngineClient(url, timeout=timeout) as client:
            return client.health(path)
    import http.client

    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                     headers={"Accept": "*/*", "Connection": "close"})
        reply = conn.getresponse()
        body = reply.read()
    except (OSError, http.client.HTTPException) as exc:
        return Health(None, "", f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    charset = reply.headers.get_content_charset() or "utf-8"  # httpx: the declared charset, else UTF-8
    try:
        text = body.decode(charset, "replace")
    except LookupError:
        text = body.decode("utf-8", "replace")
    return Health(reply.status, text[:500])


class EngineClient:
    """A small synchronous client for the engine's control endpoints (not the benchmark hot path)."""

    def __init__(self, url: str, timeout: float = 2.0, headers: dict[str, str] | None = None) -> None:
        import httpx

        self.url = url.rstrip("/")
        # trust_env=False: the engine is local or on the RoCE link, never behind the user's HTTP proxy
        self._http = httpx.Client(timeout=timeout, trust_env=False, headers=headers or {})

    def health(self, path: str = "/health") -> Health:
        import httpx

        try:
            response = self._http.get(self.url + path)
        except httpx.HTTPError as exc:
            return Health(None, "", f"{type(exc).__name__}: {exc}")
        return Health(response.status_code, response.text[:500])

    def served_model(self) -> str | None:
        data = self.get_json("/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        if isinstance(models, list) and models and isinstance(models[0], dict):
            return str(models[0].get("id"))
        return None

    def metrics_text(self) -> str:
        import httpx

        try:
            response = self._http.get(self.url + "/metrics")
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise MetralError(f"cannot read {self.url}/metrics: {exc}") from None
        return response.text

    def serve_config(self) -> dict[str, Any]:
        data = self.get_json("/serve-config")
        return data if isinstance(data, dict) else {}

    def answer_one(self, timeout_s: float, model: str | None = None) -> Health:
        """A real request: one chat completion of max_tokens 1. status None = no answer in time (or refused).

        A healthy multi-rank head whose worker is missing keeps answering /health but hangs every
        request (its first collective waits for the worker); only a request tells them apart.
        """
        import httpx

        body = {"model": model or "metralectl-check", "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 1, "temperature": 0}
        try:
            response = self._http.post(self.url + "/v1/chat/completions", json=body, timeout=timeout_s)
        except httpx.TimeoutException:
            return Health(None, "", f"no answer within {timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Health(None, "", f"{type(exc).__name__}: {exc}")
        return Health(response.status_code, response.text[:500])

    def get_json(self, path: str) -> object:
        """The JSON a GET answers with 200 (callers check its shape), else None (not offered, not ready,
        not JSON)."""
        import httpx

        try:
            response = self._http.get(self.url + path)
            if response.status_code != 200:
                return None
            return response.json()
        except (httpx.HTTPError, json.JSONDecodeError, ValueError):
            return None


    def tokenize_messages(self, model: str, messages: list[dict[str, str]]) -> int | None:
        """Prompt tokens of a chat as the engine counts them (`/tokenize`); None when it is not offered.

        Two dialects: vLLM and the Metrale engine tokenize `{"messages"}` with the chat template applied.
        llama.cpp's server tokenizes only `{"content"}` and answers a chat with `{"tokens": []}` (a
        count of 0 would have the prompt sizer grow the prompt without end): there the template is
        applied by its `/apply-template` and the text tokenized as a chat request's prompt is (special
        tokens parsed, BOS added when the model adds one)."""
        if not messages:
            return 0
        count = _token_count(self._post_json("/tokenize", {"model": model, "messages": messages}))
        if count:
            return count
        templated = self._post_json("/apply-template", {"messages": messages})
        prompt = templated.get("prompt") if isinstance(templated, dict) else None
        if not isinstance(prompt, str):
            return None
        count = _token_count(self._post_json("/tokenize", {"content": prompt, "add_special": True,
                                                           "parse_special": True}))
        return count or None

    def _post_json(self, path: str, body: dict[str, Any]) -> object:
        """The JSON a POST answers with 200, else None (not offered, refused, not JSON)."""
        import httpx

        try:
            response = self._http.post(self.url + path, json=body)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _token_count(data: object) -> int | None:
    """`count`, else the length of `tokens`, of a /tokenize answer."""
    if not isinstance(data, dict):
        return None
    count, tokens = data.get("count"), data.get("tokens")
    if isinstance(count, int):
        return count
    return len(tokens) if isinstance(tokens, list) else None


def requests_active(metrics_text: str) -> float | None:
    """`metrale_requests_active` from Prometheus text (None when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name == "metrale_requests_active":
            return sum(s.value for s in family.samples)
    return None
