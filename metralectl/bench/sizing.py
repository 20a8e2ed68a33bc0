"""Prompts of exact lengths for a stage, sized with the engine's /tokenize (bench/prompts.py): a prompt, a context
at a depth ahead of it, or every request of a replayed trace. Cached per length for the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metralectl.bench.prompts import CountFn, Shaped, prefix_for, shape_prompt

if TYPE_CHECKING:
    from metralectl.bench.suites.base import Stage

Say = Callable[[str], None]
SESSION_KEY = 500_000  # the head of session k is prefix_for(nonce, SESSION_KEY + k): requests of one session share it


def size_stage(stage: Stage, seed: int, count: CountFn, sizing: dict[str, Any],
               cache: dict[tuple[int, int], Shaped], note: Say, warn: Say) -> tuple[Shaped, Shaped | None]:
    """The prompt (and, at a depth, the context ahead of it that brings the chat to isl + depth tokens)."""
    assert stage.isl is not None
    key = (stage.isl, 0)
    if key not in cache:
        note(f"sizing a {stage.isl}-token prompt with /tokenize")
        cache[key] = shape_prompt(stage.isl, count, seed=seed, with_prefix=stage.prefix != "none")
        s = cache[key]
        sizing[str(stage.isl)] = {"method": s.method, "tokens": s.tokens}
        if s.method == "estimated":
            warn("the engine offers no /tokenize: prompt lengths are estimates (checked against usage.prompt_tokens "
                 "afterwards)")
    prompt = cache[key]
    if not stage.depth:
        return prompt, None
    key = (stage.isl, stage.depth)
    if key not in cache:
        total = stage.isl + stage.depth
        note(f"sizing a {stage.depth}-token context with /tokenize ({total} prompt tokens in all)")
        shared = stage.prefix == "shared"  # one system prompt for every user: no head of its own, the user's has one
        user = (prefix_for(0, 0) if shared else "") + prompt.text
        cache[key] = shape_prompt(
            total, count, seed=seed + 1, with_prefix=not shared,
            wrap=lambda text: [{"role": "system", "content": text}, {"role": "user", "content": user}])
        s = cache[key]
        sizing[f"{stage.isl}@d{stage.depth}"] = {"method": s.method, "tokens": s.tokens}
    return prompt, cache[key]


def size_trace(stage: Stage, seed: int, count: CountFn, sizing: dict[str, Any],
               note: Say) -> tuple[tuple[str, int | None, int, int], ...]:
    """Every request of a trace: (text, prompt tokens, max_tokens, head key). Requests without a session get a head of
    their own; those of one session share a head and one filler (filler(n) is a prefix of filler(n + 1)), so a
    longer request of a session starts with a shorter one's prompt."""
    sessions: dict[str, int] = {}
    shaped: dict[tuple[int, int], Shaped] = {}
    out = []
    for i, (isl, osl, session) in enumerate(stage.trace):
        if session is not None:
            sessions.setdefault(session, len(sessions))
        s_seed = seed + 1000 + sessions[session] if session is not None else seed
        if (isl, s_seed) not in shaped:
            shaped[(isl, s_seed)] = shape_prompt(isl, count, seed=s_seed)
        s = shaped[(isl, s_seed)]
        out.append((s.text, s.tokens, osl, SESSION_KEY + sessions[session] if session is not None else i))
    methods = sorted({s.method for s in shaped.values()})
    sizing["trace"] = {"method": ",".join(methods), "prompts": len(shaped), "sessions": len(sessions)}
    note(f"sized {len(shaped)} trace prompts with /tokenize ({len(sessions)} sessions)")
    return tuple(out)
