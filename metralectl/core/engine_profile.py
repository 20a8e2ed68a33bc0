"""What differs between engines beyond their flags, as data with closed vocabularies (engine/<name>.yaml).

Each section is declarative; where an engine behaves differently, the data names one word of an enum
and the code that acts on it (readiness, rendering, telemetry, the checker) has one branch per word.
No templating and no expressions: RamaLama's YAML+Jinja engine specs grew `if:` expressions, which is
why this file refuses anything outside the enums below (docs/engines.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, cast, get_args

from metralectl.core.schema import Checker

# How an engine says it is ready; lifecycle/readiness.py has one branch per word. Each first waits for the
# health path to answer its ready status (a faulted body fails the start), then:
#   health-when-loaded  nothing more: health answers ready only once the model is loaded (503 or a closed port
#                       before; a ready log line, if any, is a hint) (Metrale, llama.cpp, vLLM, TRT-LLM)
#   warm-up-marker      health ready is not enough: a log line says the warm-up is done (SGLang)
#   lazy-load           health is ready at once, the model loads on the first request: one answer proves it
#                       (Ollama, `transformers serve`)
ReadinessStyleName = Literal["health-when-loaded", "warm-up-marker", "lazy-load"]
READINESS_STYLES: tuple[ReadinessStyleName, ...] = get_args(ReadinessStyleName)
# Words an engine file may still name, and the style each now is. They described how an engine looked while
# loading (a 503 with a ready line, a closed port, a 503 on every path); a launch waits the same on all three.
RENAMED_READINESS_STYLES: dict[str, ReadinessStyleName] = {"marker-then-health": "health-when-loaded", "port-closed-until-ready": "health-when-loaded",
                            "http-503-until-loaded": "health-when-loaded"}
# How the checkpoint reaches the engine's command line (core/render.py):
#   positional     `serve ORG/NAME` (Metrale)
#   flag           `--model ORG/NAME` (`model-flag:` names the flag; vLLM's --model, SGLang's --model-path)
#   hf-repo-quant  `--hf-repo ORG/NAME:QUANT`, the file picked by quant from the HF cache (llama.cpp)
ModelArgumentForm = Literal["positional", "flag", "hf-repo-quant"]
MODEL_ARGUMENT_FORMS: tuple[ModelArgumentForm, ...] = get_args(ModelArgumentForm)
# What `resources.memory-utilization` means to the engine, so a fit estimate can say which it used:
MemoryMeaning = Literal["fraction-of-total", "static-weights-and-kv", "fraction-of-free-after-weights", "none"]
MEMORY_MEANINGS: dict[MemoryMeaning, str] = {
    "fraction-of-total": "a fraction of the device's total memory (weights, KV and activations)",
    "static-weights-and-kv": "a fraction of total memory for the weights and the KV pool only",
    "fraction-of-free-after-weights": "a fraction of the memory left free once the weights are loaded",
    "none": "the engine takes no memory fraction: it sizes the KV cache from the context and slots",
}
# The flags that play the fit estimate's roles (core/fit.py): in the generic KV pool (kv_part), context length ×
# sequences tokens in the KV dtype (an engine without them sizes its cache itself: its class's kv_pool, or unknown);
# and the GPUs one engine spreads a model over (parallel_sizes), tensor × pipeline parallel: the estimate is per GPU.
FitRole = Literal["context-length", "sequences", "kv-dtype", "tensor-parallel", "pipeline-parallel"]
FIT_ROLES: tuple[FitRole, ...] = get_args(FitRole)


@dataclass(frozen=True)
class FitRoles:
    context_length: str | None = None
    sequences: str | None = None
    kv_dtype: str | None = None
    tensor_parallel: str | None = None
    pipeline_parallel: str | None = None

    @property
    def sized(self) -> bool:
        return self.context_length is not None and self.sequences is not None


def parse_fit_roles(check: Checker, raw: object, flags: dict[str, Any]) -> FitRoles:
    if raw is None:
        return FitRoles()
    if not isinstance(raw, dict):
        check.error(("fit-roles",), "fit-roles is a mapping of role to flag", f"roles: {', '.join(FIT_ROLES)}")
        return FitRoles()
    found: dict[str, str] = {}
    for role, flag in raw.items():
        if role not in FIT_ROLES:
            check.error(("fit-roles", str(role)), f"unknown fit role {role!r}", f"roles: {', '.join(FIT_ROLES)}")
        elif not isinstance(flag, str) or flag not in flags:
            check.error(("fit-roles", role), f"fit role {role} names {flag!r}, which is not a flag of this engine")
        else:
            found[role.replace("-", "_")] = flag
    return FitRoles(**found)


# Checkpoint formats, for the weights a recipe needs from the HF cache (seams/hf/weights.py):
#   safetensors  the repository's files (a snapshot)
#   gguf         only the .gguf file(s) whose name holds the recipe's quant (a GGUF repo holds many quants)
WeightFormat = Literal["safetensors", "gguf"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = get_args(WeightFormat)
# Engine-specific checker rules (core/checker.py runs a rule only where the engine lists it):
#   kernel-targets   the image ships a kernel target for (hardware, model, quant) (kernels/)
#   mtp-quant        the MTP head's quant matches the checkpoint's (`must-match: checkpoint-quant`)
#   env-levers       env keys are checked against the engine's lever table (METRALE_*)
# (Which flags a recipe must state is each revision's `policy:`: Metrale's explicit-keys rule, or a `listed` set.)
RuleName = Literal["kernel-targets", "mtp-quant", "env-levers"]
RULES: tuple[RuleName, ...] = get_args(RuleName)
# The canonical engine metrics the dashboard, `top`, swap's drain and bench read (telemetry/engine_metrics.py);
# each engine maps them to its own series, first name present wins (renames across versions).
COUNTER_METRICS = ("requests-total", "prompt-tokens-total", "generation-tokens-total", "decoded-tokens-total",
                   "prefix-cache-hits-total", "prefix-cache-misses-total", "prefix-cache-queries-total",
                   "tool-calls-total", "spec-draft-tokens-total", "spec-accepted-tokens-total")
GAUGE_METRICS = ("requests-active", "requests-waiting", "prefix-cache-hit-rate", "kv-cache-usage",
                 "stream-tokens-per-s")
HISTOGRAM_METRICS = ("ttft-seconds", "itl-seconds")  # time to first token; between tokens of one stream
LABELLED_METRICS = ("spec-verify-total",)  # {k, outcome} counts
CANONICAL_METRICS = COUNTER_METRICS + GAUGE_METRICS + HISTOGRAM_METRICS + LABELLED_METRICS



def unreachable(value: NoReturn) -> NoReturn:
    """The end of a branch over a closed vocabulary: mypy refuses a call here if a word has no branch."""
    raise AssertionError(f"no branch for {value!r}")


_READINESS_STYLE_KEYS = ("style", "marker")
_MODEL_KEYS = ("form", "flag", "quant-separator")
_METRICS_KEYS = ("path", "enabled-by", "series", "source")
_WEIGHTS_KEYS = ("format", "container-hf-home", "offline-env", "source")
_PROCESS_KEYS = ("executable", "module", "interpreter", "serve-command", "source")
_PROGRAM = re.compile(r"^(?:/[^\x00-\x1f\x7f]+|[A-Za-z0-9_][A-Za-z0-9._+-]*)$")  # a command name, or an absolute path
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


@dataclass(frozen=True)
class ModelArgument:
    form: ModelArgumentForm = "positional"
    flag: str | None = None  # for `flag` and `hf-repo-quant`: the flag that carries it
    quant_separator: str = ":"

    def words(self, repo: str, quant: str) -> list[str]:
        """The argv words that name the checkpoint."""
        if self.form == "positional":
            return [repo]
        if self.form == "flag":
            return [f"--{self.flag}", repo]
        if self.form == "hf-repo-quant":
            return [f"--{self.flag}", f"{repo}{self.quant_separator}{quant}"]
        unreachable(self.form)


@dataclass(frozen=True)
class MetricsMap:
    """Canonical metric → the engine's series names, in the order tried."""

    path: str = "/metrics"
    enabled_by: str | None = None  # the flag that turns /metrics on (llama.cpp --metrics), set by the launcher
    series: dict[str, tuple[str, ...]] = field(default_factory=dict)
    engine: str = ""

    def names(self, canonical: str) -> tuple[str, ...]:
        return self.series.get(canonical, ())

    @property
    def all_series(self) -> frozenset[str]:
        return frozenset(name for names in self.series.values() for name in names)


@dataclass(frozen=True)
class Weights:
    format: WeightFormat = "safetensors"
    container_hf_home: str = "/root/.cache/huggingface"
    offline_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessStart:
    """How the engine starts as a host process (`runtime: process`): its server executable, looked up on PATH
    unless the user's engines.yaml names it, or a Python module run by an interpreter (`python3 -m MODULE`).
    The argv after it is the container's command (serve-command, the model argument, the flags)."""

    executable: str | None = None  # `llama-server`, `met`
    module: str | None = None  # `vllm.entrypoints.openai.api_server`
    interpreter: str = "python3"  # for a module: the Python that imports it
    serve_command: tuple[str, ...] | None = None  # the words after the program, when not the image's serve-command

    @property
    def program(self) -> str:
        """What is looked up on PATH (or named in engines.yaml): the executable, or the module's interpreter."""
        return self.executable or self.interpreter

    @property
    def config_key(self) -> str:
        """The key of engines.yaml that names it for one engine: `executable`, or `interpreter` for a module."""
        return "executable" if self.executable else "interpreter"


@dataclass(frozen=True)
class ReadinessStyle:
    style: ReadinessStyleName = "health-when-loaded"
    marker: re.Pattern[str] | None = None  # warm-up-marker: the line that says warm-up is done


def parse_model_argument(check: Checker, raw: Any) -> ModelArgument:
    if isinstance(raw, str) or raw is None:  # `model-argument: positional`
        body: dict[str, Any] = {"form": raw or "positional"}
    else:
        body = check.mapping(raw, ("model-argument",), "model-argument")
    check.known_keys(body, ("model-argument",), _MODEL_KEYS, "model-argument")
    form = cast(ModelArgumentForm, str(body.get("form", "positional")))
    if form not in MODEL_ARGUMENT_FORMS:
        check.error(("model-argument", "form"), f"unknown model-argument form {form!r}",
                    f"use one of {', '.join(MODEL_ARGUMENT_FORMS)}")
        return ModelArgument()
    flag = body.get("flag")
    if form != "positional" and not flag:
        check.error(("model-argument",), f"the {form} form names its `flag:`")
    return ModelArgument(form, str(flag) if flag else None, str(body.get("quant-separator", ":")))


def parse_readiness_style(check: Checker, body: dict[str, Any]) -> ReadinessStyle:
    style = cast(ReadinessStyleName, str(body.get("style", "health-when-loaded")))
    if style in RENAMED_READINESS_STYLES:  # an older engine file: it still loads, and says what to write now
        check.warn(("readiness", "style"), f"readiness style {style!r} is now {RENAMED_READINESS_STYLES[style]!r} "
                   "(the same wait)", f"write `style: {RENAMED_READINESS_STYLES[style]}`")
        style = RENAMED_READINESS_STYLES[style]
    if style not in READINESS_STYLES:
        check.error(("readiness", "style"), f"unknown readiness style {style!r}",
                    f"use one of {', '.join(READINESS_STYLES)}")
        return ReadinessStyle()
    marker = None
    if style == "warm-up-marker":
        if not body.get("marker"):
            check.error(("readiness",), "the warm-up-marker style names its `marker:` (a regular expression)")
        else:
            try:
                marker = re.compile(str(body["marker"]))
            except re.error as exc:
                check.error(("readiness", "marker"), f"not a valid regular expression: {exc}")
    elif "marker" in body:
        check.error(("readiness", "marker"), f"a `marker:` is read only by the warm-up-marker style, not {style}")
    return ReadinessStyle(style, marker)


def parse_metrics(check: Checker, raw: Any, engine: str) -> MetricsMap:
    body = check.mapping(raw if raw is not None else {}, ("metrics",), "metrics")
    check.known_keys(body, ("metrics",), _METRICS_KEYS, "metrics")
    series: dict[str, tuple[str, ...]] = {}
    table = check.mapping(body.get("series", {}), ("metrics", "series"), "metrics series")
    for key, names in table.items():
        where = ("metrics", "series", key)
        if key not in CANONICAL_METRICS:
            from metralectl.core.schema import did_you_mean
            guess = did_you_mean(str(key), CANONICAL_METRICS)
            check.error(where, f"unknown canonical metric {key!r}",
                        f"did you mean `{guess}`?" if guess else f"use one of {', '.join(CANONICAL_METRICS)}")
            continue
        listed = [names] if isinstance(names, str) else names
        if not isinstance(listed, list) or not listed or not all(isinstance(n, str) for n in listed):
            check.error(where, "maps to a series name or a list of them (first present wins)")
            continue
        for name in listed:
            if not _METRIC_NAME.match(name):
                check.error(where, f"{name!r} is not a Prometheus metric name")
        series[str(key)] = tuple(listed)
    enabled_by = body.get("enabled-by")
    return MetricsMap(str(body.get("path", "/metrics")), str(enabled_by) if enabled_by else None, series, engine)


def parse_weights(check: Checker, raw: Any) -> Weights:
    body = check.mapping(raw if raw is not None else {}, ("weights",), "weights")
    check.known_keys(body, ("weights",), _WEIGHTS_KEYS, "weights")
    fmt = cast(WeightFormat, str(body.get("format", "safetensors")))
    if fmt not in WEIGHT_FORMATS:
        check.error(("weights", "format"), f"unknown weights format {fmt!r}", f"use one of {', '.join(WEIGHT_FORMATS)}")
        fmt = "safetensors"
    env = check.mapping(body.get("offline-env", {}), ("weights", "offline-env"), "offline-env")
    return Weights(fmt, str(body.get("container-hf-home", "/root/.cache/huggingface")),
                   {str(k): str(v) for k, v in env.items()})


def parse_process(check: Checker, raw: Any) -> ProcessStart | None:
    """`process:` — exactly one of `executable:` (a command name or an absolute path) and `module:` (with an
    optional `interpreter:`, default python3)."""
    if raw is None:
        return None
    where = ("process",)
    body = check.mapping(raw, where, "process")
    check.known_keys(body, where, _PROCESS_KEYS, "process")
    executable, module = body.get("executable"), body.get("module")
    if (executable is None) == (module is None):
        check.error(where, "names exactly one of `executable:` (the server's program) and `module:` (a Python module "
                    "run by `interpreter:`)", "e.g. `executable: llama-server`")
        return None
    for key, value, grammar, what in (("executable", executable, _PROGRAM, "a command name or an absolute path"),
                                      ("module", module, _MODULE, "a dotted Python module name"),
                                      ("interpreter", body.get("interpreter", "python3"), _PROGRAM,
                                       "a command name or an absolute path")):
        if value is not None and (not isinstance(value, str) or not grammar.match(value)):
            check.error(where + (key,), f"{key} must be {what}, not {value!r}")
            return None
    if executable is not None and "interpreter" in body:
        check.error(where + ("interpreter",), "an interpreter runs a `module:`; an executable runs by itself",
                    "remove `interpreter:`, or name a `module:` instead of the executable")
        return None
    command = None
    if "serve-command" in body:  # vLLM: its image is given `vllm serve`, its API server module no subcommand
        command = tuple(check.string_list(body, where, "serve-command"))
        if any(not w or w.startswith("-") for w in command):
            check.error(where + ("serve-command",), "serve-command is the words before the model argument, none "
                        "empty or an option", "e.g. `serve-command: []` or `[serve]`")
            return None
    return ProcessStart(executable, module, str(body.get("interpreter", "python3")), command)


def parse_rules(check: Checker, top: dict[str, Any]) -> tuple[RuleName, ...]:
    rules: list[RuleName] = []
    for rule in check.string_list(top, (), "rules"):
        if rule not in RULES:
            check.error(("rules",), f"unknown engine rule {rule!r}", f"use any of {', '.join(RULES)}")
        else:
            rules.append(cast(RuleName, rule))
    return tuple(rules)


def parse_memory_meaning(check: Checker, top: dict[str, Any]) -> MemoryMeaning:
    meaning = cast(MemoryMeaning, str(top.get("memory-utilization", "fraction-of-total")))
    if meaning not in MEMORY_MEANINGS:
        check.error(("memory-utilization",), f"unknown memory-utilization meaning {meaning!r}",
                    f"use one of {', '.join(MEMORY_MEANINGS)}")
        return "fraction-of-total"
    return meaning
