"""A change of what is served, as one frozen value: `run`, `swap` or `stop`, with everything it needs.

The CLI builds it from its flags, the dashboard from the chosen action, the agent from a POST body
(POST /api/run|swap|stop, from its page): `from_json()` reads that body strictly, a wrong type or an
unknown key a UsageError naming it. Each hands it to app/serving.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from metralectl.errors import UsageError
from metralectl.lifecycle.launch import LaunchOptions
from metralectl.wording import noun

KINDS = ("run", "swap", "stop")
SWAP_OPTIONS = ("stall_timeout_s", "boot_timeout_s", "check_weights", "pull")
RUN_OPTIONS = ("replace", "keep_failed", *SWAP_OPTIONS)
BODY_KEYS = {"run": ("recipe", "sets", "options", "runtime"),
             "swap": ("recipe", "sets", "drain_timeout_s", "options", "runtime"),
             "stop": ("recipe", "all", "timeout_s")}
DEFAULTS = LaunchOptions()


@dataclass(frozen=True)
class MultiRank:
    """`run RECIPE --worker NODE`: where the ranks of a multi-rank recipe go (the CLI's: the page's body has no
    such key, since the other node is reached with the operator's own Docker contexts)."""

    worker: str  # the worker node's Docker endpoint (a context name, ssh://user@host, tcp://host:2376)
    head: str | None = None  # default: this machine's endpoint
    roce_interface: str | None = None
    master_addr: str | None = None
    first_request_timeout_s: float = 120.0
    rdma: bool = True
    rdma_device: str | None = None


@dataclass(frozen=True)
class Change:
    kind: str  # run | swap | stop
    recipe: str | None = None  # run/swap: the recipe to serve; stop: whose container (None: the one served)
    sets: tuple[str, ...] = ()  # --set KEY=VALUE overrides (run/swap)
    options: LaunchOptions = field(default_factory=LaunchOptions)  # run: all; swap: the staging/boot ones
    drain_timeout_s: float = 60.0  # swap: the most to wait for in-flight requests
    all_: bool = False  # stop: every metralectl container (and every multi-rank deployment)
    stop_timeout_s: float = 30.0  # stop: SIGTERM → SIGKILL
    multi: MultiRank | None = None  # run: a multi-rank recipe's nodes
    runtime: str | None = None  # run/swap: `--runtime docker|process`, the recipe's `runtime:` overridden (a --set)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"a change is one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.runtime is not None:
            object.__setattr__(self, "sets", with_runtime(self.kind, self.runtime, tuple(self.sets)))
        if self.kind != "stop" and not self.recipe:
            raise UsageError(f"which recipe? a {self.kind} needs one")
        if not all(isinstance(s, str) for s in self.sets):
            raise UsageError("sets must be KEY=VALUE strings")
        object.__setattr__(self, "sets", tuple(self.sets))
        object.__setattr__(self, "options", replace(self.options, sets=self.sets))  # recorded on the container
        for name in ("drain_timeout_s", "stop_timeout_s"):
            _check_seconds(getattr(self, name), name)
        _check_seconds(self.options.stall_timeout_s, "options.stall_timeout_s")
        if self.options.boot_timeout_s is not None:
            _check_seconds(self.options.boot_timeout_s, "options.boot_timeout_s")
        if self.kind == "swap" and (self.options.replace or self.options.keep_failed):
            raise UsageError("a swap replaces the served model by itself and never keeps a failed one; "
                             "replace and keep_failed are for run")
        if self.kind == "stop" and (self.sets or replace(self.options, sets=()) != DEFAULTS):
            raise UsageError("a stop takes no sets or launch options")
        if self.multi is not None and self.kind != "run":
            raise UsageError("only a run places a multi-rank recipe on its nodes")

    # -- convenience constructors for the front ends ------------------------------------------------
    @classmethod
    def run(cls, recipe: str, sets: tuple[str, ...] | list[str] = (), options: LaunchOptions = DEFAULTS,
            multi: MultiRank | None = None, runtime: str | None = None) -> Change:
        return cls("run", recipe, tuple(sets), options, multi=multi, runtime=runtime)

    @classmethod
    def swap(cls, recipe: str, sets: tuple[str, ...] | list[str] = (), options: LaunchOptions = DEFAULTS,
             drain_timeout_s: float = 60.0, runtime: str | None = None) -> Change:
        return cls("swap", recipe, tuple(sets), options, drain_timeout_s=drain_timeout_s, runtime=runtime)

    @classmethod
    def stop(cls, recipe: str | None = None, *, all_: bool = False, timeout_s: float = 30.0) -> Change:
        return cls("stop", recipe, all_=all_, stop_timeout_s=timeout_s)

    # -- the agent's job body ------------------------------------------------------------------------
    @classmethod
    def from_json(cls, body: Any, *, kind: str | None = None) -> Change:
        """A job body, checked (`kind`: the route's, when the body came to POST /api/KIND)."""
        if not isinstance(body, dict):
            raise UsageError(f"a change must be a JSON object, not {json.dumps(body, default=str)}")
        body = dict(body)
        said = body.pop("kind", kind)
        kind = kind or said
        if kind not in KINDS or said != kind:
            raise UsageError(f"kind must be {kind if kind in KINDS else 'one of ' + ', '.join(KINDS)}, "
                             f"not {json.dumps(said)}")
        known_keys(body, BODY_KEYS[kind], f"the {kind} body")
        recipe = body.get("recipe")
        if recipe is not None and (not isinstance(recipe, str) or not recipe):
            raise UsageError(f"recipe must be a recipe name (a string), not {json.dumps(recipe)}")
        if kind == "stop":
            return cls.stop(recipe, all_=_flag(body, "all", "", False),
                            timeout_s=_seconds(body, "timeout_s", "", 30.0))
        if not recipe:
            raise UsageError("which recipe? send {\"recipe\": NAME}")
        sets = body.get("sets", [])
        if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
            raise UsageError(f"sets must be a list of \"KEY=VALUE\" strings, not {json.dumps(sets)}")
        raw = body.get("options", {})
        if not isinstance(raw, dict):
            raise UsageError(f"options must be an object, not {json.dumps(raw)}")
        known_keys(raw, RUN_OPTIONS if kind == "run" else SWAP_OPTIONS, f"the {kind} options")
        options: dict[str, Any] = {}
        for key in raw:
            if key.endswith("_s"):
                options[key] = _seconds_or_none(raw, key, "options.", None, nullable=key == "boot_timeout_s")
            else:
                options[key] = _flag(raw, key, "options.", False)
        launch = replace(DEFAULTS, **options)
        runtime = body.get("runtime")
        if runtime is not None and not isinstance(runtime, str):
            raise UsageError(f"runtime must be \"docker\" or \"process\", not {json.dumps(runtime)}")
        if kind == "run":
            return cls.run(recipe, sets, launch, runtime=runtime)
        return cls.swap(recipe, sets, launch, _seconds(body, "drain_timeout_s", "", 60.0), runtime=runtime)


def with_runtime(kind: str, runtime: str, sets: tuple[str, ...]) -> tuple[str, ...]:
    """`--runtime R` is the recipe's `runtime:` overridden: the set `runtime=R`, so it is checked, recorded with the
    engine's other --set overrides, and kept by a swap's rollback and by the repair."""
    from metralectl.core.recipe import RUNTIMES
    from metralectl.core.schema import did_you_mean

    if kind == "stop":
        raise UsageError("a stop takes no runtime: it stops what serves, wherever it runs")
    if runtime not in RUNTIMES:
        guess = did_you_mean(runtime, RUNTIMES)
        raise UsageError(f"unknown runtime {runtime!r}", f"did you mean `{guess}`?" if guess else
                         f"--runtime {' or --runtime '.join(RUNTIMES)}")
    wanted = f"runtime={runtime}"
    return sets if wanted in sets else (*[s for s in sets if not s.startswith("runtime=")], wanted)


def _check_seconds(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UsageError(f"{name} must be a number of seconds (>= 0), not {value!r}")


def known_keys(obj: dict[str, Any], valid: tuple[str, ...], where: str) -> None:
    """UsageError naming the keys of obj that are not valid (and the valid ones)."""
    unknown = sorted(set(obj) - set(valid))
    if unknown:
        raise UsageError(f"unknown {noun(len(unknown), 'key')} {', '.join(unknown)} in {where}; "
                         f"valid: {', '.join(valid)}")


def _seconds(obj: dict[str, Any], key: str, where: str, default: float) -> float:
    seconds = _seconds_or_none(obj, key, where, default)
    assert seconds is not None  # not nullable: None was refused
    return seconds


def _seconds_or_none(obj: dict[str, Any], key: str, where: str, default: float | None, *,
                     nullable: bool = False) -> float | None:
    value = obj.get(key, default)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UsageError(f"{where}{key} must be a number of seconds (>= 0){' or null' if nullable else ''}, "
                         f"not {json.dumps(value)}")
    return float(value)


def _flag(obj: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise UsageError(f"{where}{key} must be true or false, not {json.dumps(value)}")
    return value
