"""EngineClient.tokenize_messages in the two /tokenize dialects, and the prompt sizer over each.

vLLM and the Metrale engine tokenize `{"messages"}`; llama.cpp's llama-server tokenizes only
`{"content"}`, answers a chat with `{"tokens": []}`, and applies the chat template in `/apply-template`
(seen on the real server, tests/real_llamacpp/README.md). The fakes below answer as each does; the
real llama-server is held to it by tests/integration/test_llamacpp_real.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from metralectl.bench.prompts import filler, prefix_for, shape_prompt
from metralectl.seams.endpoint import EngineClient

TEMPLATE_TOKENS = 5  # "<|im_start|>", "user", "\n", ..., "<|im_end|>" etc.: a fixed overhead per chat


def _words(text: str) -> list[int]:
    return [len(w) for w in text.split()]  # one token per word


class _Engine(BaseHTTPRequestHandler):
    dialect = "llama.cpp"
    calls: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((self.path, body))
        if self.dialect == "llama.cpp":
            if self.path == "/tokenize":
                # llama-server: only `content` is read; a chat's messages tokenize as the empty string
                ids = _words(body.get("content", ""))
                return self._json(200, {"tokens": ids})
            if self.path == "/apply-template":
                text = "".join(f"<|im_start|> {m['role']} {m['content']} <|im_end|> " for m in body["messages"])
                return self._json(200, {"prompt": text + "<|im_start|> assistant"})
        elif self.dialect == "vllm" and self.path == "/tokenize":
            ids = [0] * TEMPLATE_TOKENS + [i for m in body["messages"] for i in _words(m["content"])]
            return self._json(200, {"count": len(ids), "tokens": ids, "max_model_len": 4096})
        self._json(404, {"detail": "Not Found"})

    def _json(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[type[_Engine]]:
    handler = type("Handler", (_Engine,), {"calls": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield handler
    server.shutdown()
    server.server_close()


CHAT = [{"role": "user", "content": "one two three four"}]


def test_llamacpp_counts_the_templated_prompt_not_the_empty_answer(engine: type[_Engine]) -> None:
    with EngineClient(engine.url) as client:  # type: ignore[attr-defined]
        count = client.tokenize_messages("m", CHAT)
    # "<|im_start|> user one two three four <|im_end|> <|im_start|> assistant": 9 words, not the 0 of {"tokens": []}
    assert count == 9
    assert [path for path, _ in engine.calls] == ["/tokenize", "/apply-template", "/tokenize"]
    # the templated text is tokenized as llama-server tokenizes a chat request's prompt
    assert engine.calls[2][1]["add_special"] is True and engine.calls[2][1]["parse_special"] is True


def test_vllm_dialect_is_asked_once(engine: type[_Engine]) -> None:
    engine.dialect = "vllm"
    with EngineClient(engine.url) as client:  # type: ignore[attr-defined]
        assert client.tokenize_messages("m", CHAT) == TEMPLATE_TOKENS + 4
    assert [path for path, _ in engine.calls] == ["/tokenize"]


def test_no_tokenize_at_all_is_none(engine: type[_Engine]) -> None:
    engine.dialect = "none"
    with EngineClient(engine.url) as client:  # type: ignore[attr-defined]
        assert client.tokenize_messages("m", CHAT) is None


def test_sizer_hits_the_target_against_llamacpp(engine: type[_Engine]) -> None:
    """The defect this guards: with {"tokens": []} read as 0 tokens, the sizer grew a 128-token prompt to
    ~5000 tokens (24 rounds of +128 words) and every request then overflowed the server's context."""
    with EngineClient(engine.url) as client:  # type: ignore[attr-defined]
        shaped = shape_prompt(128, lambda msgs: client.tokenize_messages("m", msgs), seed=0)
    assert shaped.method == "tokenize" and shaped.tokens == 128
    text = prefix_for(0, 0) + shaped.text
    assert len(f"<|im_start|> user {text} <|im_end|> <|im_start|> assistant".split()) == 128


def _counter(tokens_of_word: Any, overhead: int) -> Any:
    calls: list[int] = []

    def count(messages: list[dict[str, str]]) -> int:
        words = messages[0]["content"].split()
        calls.append(len(words))
        return overhead + sum(tokens_of_word(w) for w in words)

    count.calls = calls  # type: ignore[attr-defined]
    return count


@pytest.mark.parametrize("name, tokens_of_word, overhead", [
    ("one a word (a large vocabulary)", lambda w: 1, 9),
    ("two a word (the tiny GGUF's BPE)", lambda w: 2, 14),
    ("by length, 1 to 4", lambda w: 1 + len(w) // 2, 14),
    ("long words are many", lambda w: 1 if len(w) < 4 else 5, 30),
])
@pytest.mark.parametrize("target", [64, 96, 128, 1000, 4096])
def test_sizer_finds_the_longest_prompt_that_fits(name: str, tokens_of_word: Any, overhead: int,
                                                  target: int) -> None:
    count = _counter(tokens_of_word, overhead)
    shaped = shape_prompt(target, count, seed=3)
    asked = len(count.calls)
    # the best word count, found by trying every one (filler(n) is a prefix of filler(n + 1): running sums)
    words = filler(2 * target + 1, 3).split()
    assert filler(37, 3).split() == words[:37]
    fixed = overhead + sum(tokens_of_word(w) for w in prefix_for(0, 0).split())
    totals, running = [], fixed
    for w in words:
        running += tokens_of_word(w)
        totals.append(running)
    best = max(v for v in totals if v <= target)
    assert shaped.tokens == best, (name, target, shaped.tokens, best)
    assert count([{"role": "user", "content": prefix_for(0, 0) + shaped.text}]) == shaped.tokens
    assert asked <= 25  # the first measurement and at most max_rounds more
