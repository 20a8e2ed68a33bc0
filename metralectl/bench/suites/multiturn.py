"""The multi-turn suite: conversations that grow over K turns, each turn resending the history with the answers the
engine gave (pure: the next turn is planned from what the last one measured)."""

from __future__ import annotations

import json
from typing import Any

from metralectl.bench.params import Param
from metralectl.bench.prompts import filler
from metralectl.bench.stats import percentile
from metralectl.bench.suites.base import Measured, Stage, Suite, base_load, flat


def _user(p: dict[str, Any], conversation: int, turn: int) -> str:
    return f"Conversation {conversation} turn {turn}: " + filler(p["turn_words"], p["seed"] * 7919 + conversation * 101 + turn)


def _turn(p: dict[str, Any], turn: int, turns: tuple[tuple[str, str], ...]) -> Stage:
    load = base_load(p, concurrency=p["users"], warmup_requests=0, requests=p["users"])
    return Stage(f"turn {turn}", load, p["osl"], prompt="", prefix="none", keep_content=True, turns=turns,
                 labels={"turn": turn, "users": p["users"], "osl": p["osl"]})


def _multi_stages(p: dict[str, Any]) -> list[Stage]:
    return [_turn(p, 1, tuple(("[]", _user(p, c, 1)) for c in range(p["users"])))]


def _more(p: dict[str, Any], runs: Measured) -> list[Stage]:
    stage, results, _ = runs[-1]
    turn = stage.labels["turn"]
    if turn >= p["turns"]:
        return []
    answers = {r.index: r.content for r in results if r.phase == "measure" and r.ok and r.index < p["users"]}
    if len(answers) < p["users"]:
        return []  # a conversation lost its answer: the run fails on it, no turn after it
    nxt = []
    for c, (said, text) in enumerate(stage.turns):
        history = json.loads(said) + [{"role": "user", "content": text},
                                      {"role": "assistant", "content": answers[c] or ""}]
        nxt.append((json.dumps(history), _user(p, c, turn + 1)))
    return [_turn(p, turn + 1, tuple(nxt))]


def _multi_summary(p: dict[str, Any], runs: Measured) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    for stage, results, agg in runs:
        key = f"turn{stage.labels['turn']}."
        headline.update(flat(key, agg, ("p50", "p95")))
        prompts = [r.prompt_tokens for r in results if r.phase == "measure" and r.ok and r.prompt_tokens is not None]
        headline[key + "prompt_tokens_p50"] = percentile(prompts, 50)
    headline["turns_run"] = len(runs)
    return {"headline": headline}


SUITE = Suite(
    "multi-turn", "conversations that grow over turns", "`users` conversations at once, `turns` turns each: every turn "
    "resends the whole conversation (its user turns and the answers the engine gave) plus a new user turn of "
    "`turn_words` words; per turn the prompt tokens, TTFT, TPOT and output tok/s (a prefix cache shows as a TTFT that "
    "grows slower than the prompt).", (
        Param("users", "int", 4, "conversations at once", 1, 1024),
        Param("turns", "int", 4, "turns per conversation", 1, 64),
        Param("turn_words", "int", 64, "words of each new user turn", 1),
        Param("osl", "int", 64, "output tokens per answer", 1),
        Param("temperature", "float", 0.0, "sampling temperature", 0, 2)),
    _multi_stages, _multi_summary, more=_more)
