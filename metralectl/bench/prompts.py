"""Requests with exact prompt lengths: sized with the engine's /tokenize, checked later against usage.

A unique prefix ("Request 4 8 2 1 0 0 0 0 1 2: ") opens every prompt so no request hits another's
prefix cache (a nonce per run also keeps runs apart). Digits are spaced because " 7" is one token
in every common tokenizer, so all prefixes of a run have the same length and one sizing fits all.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metralectl.bench.loadgen import Planned

WORDS = ["the", "of", "and", "to", "in", "is", "a", "that", "for", "it", "with", "as", "on", "be", "at", "by", "this", "from", "or", "have", "an", "are", "not", "but", "we", "you", "all", "can", "had", "her", "was", "one", "our", "out", "day", "get", "has", "him", "his", "how", "man", "new", "now", "old", "see", "two", "way", "who", "boy", "did", "its", "let", "put", "say", "she", "too", "use", "time", "year", "people", "good", "first", "well", "long", "make", "work", "world", "life", "hand", "part", "place"]
CountFn = Callable[[list[dict[str, str]]], "int | None"]
# The chat a body is measured in (default: one user message holding it).
WrapFn = Callable[[str], list[dict[str, str]]]
# The user turn of a context-load request (llama-benchy's CONTEXT_LOAD_USER_MESSAGE): the context is sent
# with this, then again with the real prompt, which then finds the context in the prefix cache.
CONTEXT_LOAD = "."


def filler(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(max(n_words, 0)))


def prefix_for(nonce: int, key: int) -> str:
    digits = f"{nonce % 10000:04d}{key % 1000000:06d}"
    return "Request " + " ".join(digits) + ": "


def unique_head(nonce: int, key: int) -> str:
    """prefix_for's digits backwards (the same tokens, as many): the fastest-changing digit first, so a prompt shares
    no more than "Request " with the one before it, and an engine's cache of the last prompt (llama-server's slot)
    saves nothing: the depth suite's prefill is over the whole prompt, as llama-benchy's random book offsets make it."""
    digits = f"{nonce % 10000:04d}{key % 1000000:06d}"[::-1]
    return "Request " + " ".join(digits) + ": "


@dataclass(frozen=True)
class Shaped:
    text: str  # the body after the prefix
    tokens: int | None  # prompt_tokens the engine should report (None: could not size it)
    method: str  # "tokenize" | "estimated" | "fixed"


def shape_prompt(target: int, count: CountFn | None, *, seed: int, with_prefix: bool = True,
                 max_rounds: int = 24, wrap: WrapFn | None = None) -> Shaped:
    """Body text such that prefix + body is exactly `target` prompt tokens (chat template included).

    filler(n) is a prefix of filler(n + 1), so the count grows with n: the search keeps the largest n known
    to fit and the smallest known to overshoot, and interpolates between them (tokens per word differ by
    tokenizer: ~1.3 for a large vocabulary, 2 and more for a small one). Where no n gives the target
    exactly (a word of two tokens straddles it), the longest prompt below it wins."""
    head = prefix_for(0, 0) if with_prefix else ""

    def measure(n: int) -> int | None:
        text = head + filler(n, seed)
        if count is None:
            return None
        return count(wrap(text) if wrap else [{"role": "user", "content": text}])

    n = max(target - 30, 1)
    got = measure(n)
    if got is None:
        overhead = 20 if with_prefix else 0
        return Shaped(filler(max(target - overhead - 10, 1), seed), None, "estimated")
    seen: dict[int, int] = {n: got}
    for _ in range(max_rounds):
        if got == target:
            return Shaped(filler(n, seed), target, "tokenize")
        fits = [k for k, v in seen.items() if v < target]
        over = [k for k, v in seen.items() if v > target]
        lo, hi = (max(fits) if fits else None), (min(over) if over else None)
        if lo is not None and hi is not None:
            if hi - lo <= 1:
                break
            guess = lo + round((target - seen[lo]) * (hi - lo) / (seen[hi] - seen[lo]))
            n = min(max(guess, lo + 1), hi - 1)
        elif lo is not None:  # all short so far: grow by the words the missing tokens are worth (at least 1)
            per_word = max(seen[lo] / lo, 1e-3)
            n = lo + max(1, round((target - seen[lo]) / per_word))
        else:  # all long: shrink in proportion, never below one word
            assert hi is not None
            if hi <= 1:
                break
            n = min(max(1, round(hi * target / seen[hi])), hi - 1)
        if n in seen:
            break
        got = measure(n)
        if got is None:
            break
        seen[n] = got
    below = [(v, k) for k, v in seen.items() if v <= target]
    v, k = max(below) if below else min((v, k) for k, v in seen.items())
    return Shaped(filler(k, seed), v, "tokenize")


@dataclass(frozen=True)
class RequestFactory:
    """Picklable (worker processes build their own bodies): request i -> Planned."""

    model: str
    max_tokens: int
    text: str
    expected_prompt_tokens: int | None = None
    # "unique" | "head" (unique_head) | "none" | "pairs" (i and i+1 share one: cold then warm) | "depth" (a unique context in a system
    # message, then the text as the user turn) | "ctxpairs" (i and i+1 share one context: loaded with
    # CONTEXT_LOAD, then the text asked after it) | "shared" (one context, the system prompt of every request, then
    # a unique head and the text as the user turn)
    prefix: str = "unique"
    nonce: int = 0
    temperature: float = 0.0
    seed: int | None = 0
    ignore_eos: bool = True
    continuous_usage: bool = True
    keep_content: bool = False
    min_tokens: bool | None = None  # send min_tokens = max_tokens (None: with ignore_eos, as before)
    include_usage: bool = True  # send stream_options.include_usage
    system: str | None = None
    context: str = ""  # the body of the system message at depth (prefix "depth"/"ctxpairs")
    # a replayed trace: request i is per_request[i] = (text, expected prompt tokens, max_tokens, head key)
    per_request: tuple[tuple[str, int | None, int, int], ...] = ()
    # a conversation per request index: (JSON of the messages so far, this turn's user text)
    turns: tuple[tuple[str, str], ...] = ()
    tools: str | None = None  # JSON text of the tools list
    tool_choice: str | None = None  # JSON text
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def __call__(self, i: int) -> Planned:
        system = self.system
        max_tokens, expected = self.max_tokens, self.expected_prompt_tokens
        if self.per_request:
            text, expected, max_tokens, key = self.per_request[i % len(self.per_request)]
            content, tag = prefix_for(self.nonce, key) + text, None
        elif self.prefix == "none":
            content, tag = self.text, None
        elif self.prefix == "head":  # as "unique", with the head whose first digit changes (unique_head)
            content, tag = unique_head(self.nonce, i) + self.text, None
        elif self.prefix == "depth":
            system, content, tag = unique_head(self.nonce, i) + self.context, self.text, None
        elif self.prefix == "shared":  # one system prompt for all, a user turn of each request's own
            system, content, tag = self.context, prefix_for(self.nonce, i) + self.text, None
        elif self.prefix == "ctxpairs":
            system = unique_head(self.nonce, i // 2) + self.context
            content, tag = (CONTEXT_LOAD, "ctx") if i % 2 == 0 else (self.text, "warm")
        elif self.prefix == "pairs":
            content, tag = prefix_for(self.nonce, i // 2) + self.text, ("cold" if i % 2 == 0 else "warm")
        else:
            content, tag = prefix_for(self.nonce, i) + self.text, None
        history: list[dict[str, str]] = []
        if self.turns:  # a conversation's next turn: what was said so far (the engine's answers too), then this
            said, content = self.turns[i % len(self.turns)]
            history, tag = json.loads(said), None
        messages = ([{"role": "system", "content": system}] if system else []) + history + [
            {"role": "user", "content": content}]
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "temperature": self.temperature,
        }
        if self.include_usage:
            body["stream_options"] = {"include_usage": True,
                                      **({"continuous_usage_stats": True} if self.continuous_usage else {})}
        if self.seed is not None:
            body["seed"] = self.seed
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.min_tokens or (self.min_tokens is None and self.ignore_eos):
            body["min_tokens"] = max_tokens
        if self.tools:
            body["tools"] = json.loads(self.tools)
            body["tool_choice"] = json.loads(self.tool_choice) if self.tool_choice else "auto"
        body.update(dict(self.extra))
        expected = None if tag == "ctx" else expected  # a context load: shorter by design
        return Planned(json.dumps(body, separators=(",", ":")).encode(), expected, tag,
                       self.keep_content, max_tokens)
