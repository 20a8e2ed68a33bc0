"""`chat`: which endpoint answers, and one streamed chat completion from it (the CLI prints, this reads).

The target is `--url`, else the container serving RECIPE, else the one model metralectl serves (the
endpoint label `ps` reads). An answer is complete only when the stream says so (a `finish_reason`, or
`data: [DONE]`); a stream that ends before, an error event, an HTTP error and an engine that does not
answer are failures, each a MetralError with its exit code. The request goes through the one HTTP client
(seams/httpclient.py); it and docker are imported here, lazily.
What is read is bounded (docs/serving.md): one SSE event at most sse.EVENT_LIMIT, one answer's stream at
most sse.BODY_LIMIT, /v1/models and an error's body to their caps (seams/bounded.py); past one, the answer
fails (exit 65) rather than the client growing. A target URL that cannot be used (a label that is no URL) is a
clear error too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from metralectl.bench.sse import BODY_LIMIT, EventSplitter, EventTooLarge
from metralectl.errors import RUN_ONE, ExitCode, MetralError, UsageError
from metralectl.safetext import clean

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 300.0  # the most between two pieces of the stream (a long prompt's prefill comes first)


@dataclass(frozen=True)
class ChatTarget:
    url: str  # the engine's base URL (no /v1)
    recipe: str | None  # the recipe metralectl serves there, when it does
    # its engine's labels (for --url, those of this box's engine there, if one is): whether it asks metralectl's
    # engine token (lifecycle/engine_token.py)
    labels: dict[str, str] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class ChatOptions:
    system: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None


@dataclass
class Answer:
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    done: bool = False  # saw data: [DONE]
    pieces: list[str] = field(default_factory=list, repr=False)

    @property
    def complete(self) -> bool:
        return self.finish_reason is not None or self.done


def base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--url {url!r}: expected http://HOST:PORT (the engine's base URL)")
    return url.removesuffix("/v1")


def resolve(recipe: str | None, url: str | None) -> ChatTarget:
    """The endpoint to chat with: --url as given, else what the daemon's labelled containers say is served."""
    if url:
        endpoint = base_url(url)
        return ChatTarget(endpoint, recipe, served_labels(endpoint) or {})
    from metralectl.app.not_served import not_served

    engines = served_engines()
    served = [(name, u) for name, u, _ in engines]
    if recipe is not None:
        matches = [(u, labels) for name, u, labels in engines if name == recipe]
        if not matches:
            raise not_served(clean(recipe, 120), [clean(name, 120) for name, _ in served])
        return ChatTarget(matches[0][0], recipe, matches[0][1])
    if not served:
        raise not_served(None, [], f"{RUN_ONE}; `--url URL` chats with another endpoint")
    if len({u for _, u in served}) > 1:
        names = ", ".join(sorted(clean(name, 120) for name, _ in served))
        raise UsageError(f"{len(served)} models are served ({names}): which one?",
                         "name it: `metralectl chat RECIPE [PROMPT]`")
    name, endpoint, labels = engines[0]
    return ChatTarget(endpoint, name, labels)


def served_labels(url: str) -> dict[str, str] | None:
    """The labels of the engine this box serves at url (the same scheme, host and port, the host as written), so a
    `--url` that names one of them gets its engine token too; None for any other URL (the token goes nowhere else)
    and when what is served cannot be read."""
    from urllib.parse import urlsplit

    def origin(u: str) -> tuple[str, str, int | None] | None:
        try:
            parts = urlsplit(u)
            return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None

    want = origin(url)
    from metralectl.seams.sync_http import is_this_machine

    if want is None or not is_this_machine(want[1]):  # another host's engine is none of ours: no runtime to ask
        return None
    try:
        engines = served_engines()
    except MetralError:
        return None
    return next((labels for _, endpoint, labels in engines if origin(endpoint) == want), None)


def served_endpoints() -> list[tuple[str, str]]:
    """(recipe, endpoint URL) of every running metralectl engine (a container or a host process) that publishes an
    endpoint."""
    return [(name, url) for name, url, _ in served_engines()]


def served_engines() -> list[tuple[str, str, dict[str, str]]]:
    """served_endpoints(), with each engine's labels."""
    from metralectl.core.labels import LABEL_ENDPOINT, LABEL_RECIPE
    from metralectl.lifecycle.local_runtime import open_local
    with open_local(timeout=10.0) as runtime:  # containers and host processes
        containers = runtime.containers(mine=False)
    return [(c.labels.get(LABEL_RECIPE, "?"), c.labels[LABEL_ENDPOINT].rstrip("/"), dict(c.labels)) for c in containers
            if c.running and c.labels.get(LABEL_ENDPOINT)]


def is_served(name: str) -> bool:
    """Whether a recipe of this name is served now (False when Docker cannot say)."""
    try:
        return any(recipe == name for recipe, _ in served_endpoints())
    except MetralError:
        return False


class ChatClient:
    """One engine's chat endpoint; `ask` streams one answer."""

    def __init__(self, target: ChatTarget, headers: dict[str, str] | None = None) -> None:
        from metralectl.lifecycle.engine_token import engine_headers
        from metralectl.seams.httpclient import Client

        self.target = target
        headers = {**engine_headers(target.labels), **(headers or {})}  # the engine token, when it asks it
        self._http = Client(timeout=READ_TIMEOUT_S, connect_timeout=CONNECT_TIMEOUT_S, headers=headers)
        self.model: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def served_model(self) -> str | None:
        """The model id the engine serves (/v1/models), for the request's `model`; None when it names none."""
        from metralectl.seams.bounded import CONTROL_LIMIT, TooLarge
        from metralectl.seams.httpclient import Failed

        url = self.target.url
        data: Any = None
        try:
            with self._http.stream("GET", url + "/v1/models", timeout=CONNECT_TIMEOUT_S * 2) as reply:
                if reply.status == 200:
                    data = json.loads(reply.body(CONTROL_LIMIT, f"{url}/v1/models"))
        except Failed as exc:
            if exc.bad_url:
                raise _not_a_url(url, exc) from None
            raise MetralError(f"nothing answers at {clean(url, 200)}: {clean(exc.detail, 200) or exc.kind}",
                              "`metralectl ps` shows what is served and whether it is healthy",
                              exit_code=ExitCode.UNAVAILABLE) from None
        except (ValueError, RecursionError, TooLarge):  # not JSON, or more than a list of models: none named
            data = None
        models = data.get("data") if isinstance(data, dict) else None
        if isinstance(models, list) and models and isinstance(models[0], dict) and models[0].get("id"):
            self.model = str(models[0]["id"])
        return self.model

    def ask(self, messages: list[dict[str, str]], options: ChatOptions,
            on_content: Callable[[str], None] = lambda _: None,
            on_reasoning: Callable[[str], None] = lambda _: None) -> Answer:
        """Stream one answer, calling on_content / on_reasoning with each piece as it arrives. Raises
        MetralError when it fails or ends incomplete; KeyboardInterrupt closes the stream and passes on."""
        from metralectl.seams.httpclient import Failed

        body: dict[str, Any] = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
        if self.model:
            body["model"] = self.model
        if options.max_tokens is not None:
            body["max_tokens"] = options.max_tokens
        if options.temperature is not None:
            body["temperature"] = options.temperature
        url = self.target.url + "/v1/chat/completions"
        answer = Answer()
        try:
            with self._http.stream("POST", url, json=body) as reply:
                if reply.status != 200:
                    raise MetralError(f"the engine answered HTTP {reply.status}: {_error_text(reply.peek())}",
                                      "`metralectl logs` shows the engine's side")
                for event in _events(_capped(reply.chunks(), url)):
                    _take(event, answer, on_content, on_reasoning)
                    if answer.done:
                        break
        except EventTooLarge as exc:
            raise MetralError(f"{clean(url, 200)}: {exc}", "the engine sent an event without its end: it is not "
                              "streaming server-sent events as an OpenAI-compatible server does",
                              exit_code=ExitCode.DATA) from None
        except Failed as exc:
            if exc.bad_url:
                raise _not_a_url(self.target.url, exc) from None
            if exc.timed_out:
                raise MetralError(f"no answer from {url} within {READ_TIMEOUT_S:g} s"
                                  + (" (the answer stopped mid-way)" if answer.pieces else ""),
                                  "`metralectl logs` shows what the engine is doing") from None
            code = ExitCode.FAILED if answer.pieces else ExitCode.UNAVAILABLE
            raise MetralError(f"the connection to {url} failed: {clean(exc.detail, 200) or exc.kind}",
                              "`metralectl ps` shows whether the engine still runs", exit_code=code) from None
        if not answer.complete:
            raise MetralError("the stream ended before the answer finished (no finish_reason, no [DONE])",
                              "the engine stopped mid-answer: `metralectl logs` shows why")
        return answer


def _not_a_url(url: str, exc: BaseException) -> MetralError:
    return MetralError(f"{clean(url, 200)!r} is not a URL to reach an engine at ({clean(str(exc), 200)})",
                       "for a served recipe, its container's endpoint label says where it answers (`metralectl ps`); "
                       "--url takes http://HOST:PORT", exit_code=ExitCode.DATA)


def _capped(chunks: Iterator[bytes], url: str) -> Iterator[bytes]:
    """The stream's bytes, at most BODY_LIMIT of them (an answer never needs more)."""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > BODY_LIMIT:
            raise MetralError(f"{clean(url, 200)}: the answer's stream went past {BODY_LIMIT >> 20} MiB; it was cut "
                              "there", "ask for a shorter answer (--max-tokens)", exit_code=ExitCode.DATA)
        yield chunk


def _error_text(body: bytes) -> str:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return clean(body.decode("utf-8", "replace").strip(), 300) or "(no body)"
    err = data.get("error", data) if isinstance(data, dict) else data
    message = err.get("message", err) if isinstance(err, dict) else err
    return clean(str(message), 300)


def _events(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The `data:` payloads of an SSE stream, as each event completes (the benchmark's splitter, fed live)."""
    splitter = EventSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    last, _ = splitter.finish()
    if last is not None:  # a last event without its blank line
        yield last


def _take(data: bytes, answer: Answer, on_content: Callable[[str], None],
          on_reasoning: Callable[[str], None]) -> None:
    if data.strip() == b"[DONE]":
        answer.done = True
        return
    try:
        obj = json.loads(data)
    except ValueError:
        raise MetralError(f"the engine sent an unreadable event: {clean(data[:120].decode('utf-8', 'replace'))}") from None
    if not isinstance(obj, dict):
        return
    if obj.get("error") and not obj.get("choices"):
        err = obj["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raise MetralError(f"the engine stopped with an error: {clean(str(message), 300)}",
                          "`metralectl logs` shows the engine's side")
    if answer.model is None and isinstance(obj.get("model"), str):
        answer.model = obj["model"]
    if isinstance(obj.get("usage"), dict):
        answer.usage = obj["usage"]
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            answer.reasoning += reasoning
            answer.pieces.append(reasoning)
            on_reasoning(reasoning)
        content = delta.get("content")
        if isinstance(content, str) and content:
            answer.content += content
            answer.pieces.append(content)
            on_content(content)
        if choice.get("finish_reason"):
            answer.finish_reason = str(choice["finish_reason"])
