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
        """Prompt tokens of a chat as the engine counts them (`/tokenize`); None when it is not offered."""
        import httpx

        try:
            response = self._http.post(self.url + "/tokenize", json={"model": model, "messages": messages})
            data = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
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


def requests_active(metrics_text: str) -> float | None:
    """`metrale_requests_active` from Prometheus text (None when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name == "metrale_requests_active":
            return sum(s.value for s in family.samples)
    return None
