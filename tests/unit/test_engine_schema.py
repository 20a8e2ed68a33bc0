"""One engine schema for every engine (engine/*.yaml): its enums refuse what the code cannot act on, the
llama.cpp file is held to its pinned --help, its flag types render as the binary wants, and engine-scoped
rules apply only to the engine that declares them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from metralectl.core import help_dump
from metralectl.core.catalog import load_catalog
from metralectl.core.contract import EngineContract, parse_contract
from metralectl.core.engine_flags import FlagSpec
from metralectl.core.render import spec_for
from metralectl.core.yamlsrc import load_file
from tests.unit.recipe_helpers import REPO

ENGINE = REPO / "engine"
LLAMA_HELP = ENGINE / "llama-cpp" / "11434.0.0" / "help.txt"


def _llama_copy(tmp_path: Path, edit: tuple[str, str] | None = None) -> tuple[EngineContract | None, list[str]]:
    engine = tmp_path / "engine"
    (engine / "llama-cpp" / "11434.0.0").mkdir(parents=True)
    shutil.copy(LLAMA_HELP, engine / "llama-cpp" / "11434.0.0" / "help.txt")
    text = (ENGINE / "llama-cpp.yaml").read_text()
    if edit is not None:
        assert edit[0] in text, edit[0]
        text = text.replace(edit[0], edit[1])
    (engine / "llama-cpp.yaml").write_text(text)
    contract, check = parse_contract(load_file(engine / "llama-cpp.yaml"), engine)
    return contract, [p.render() for p in check.problems if p.severity == "error"]


def test_both_engines_load_in_one_schema() -> None:
    engines = load_catalog(use_cache=False, include_user=False).engines
    assert {"metrale", "llama-cpp"} <= set(engines)
    metrale, llama = engines["metrale"], engines["llama-cpp"]
    assert metrale.readiness.style == llama.readiness.style == "health-when-loaded"
    assert metrale.model_argument.words("O/N", "nvfp4") == ["O/N"]
    assert llama.model_argument.words("O/N", "Q8_0") == ["--hf-repo", "O/N:Q8_0"]
    assert metrale.memory_meaning == "fraction-of-total" and llama.memory_meaning == "none"
    assert llama.metrics.names("requests-active") == ("llamacpp:requests_processing",)
    assert metrale.metrics.names("requests-active") == ("metrale_requests_active",)
    assert set(metrale.rules) == {"kernel-targets", "mtp-quant", "env-levers"} and llama.rules == ()
    assert llama.launcher_sets == {"offline": True, "metrics": True}


@pytest.mark.parametrize(("edit", "expected"), [
    (("style: health-when-loaded", "style: when-it-feels-ready"), "unknown readiness style 'when-it-feels-ready'"),
    (("  form: hf-repo-quant", "  form: templated"), "unknown model-argument form 'templated'"),
    (("memory-utilization: none ", "memory-utilization: some "), "unknown memory-utilization meaning 'some'"),
    (("memory-utilization: none ", "fit-roles: {context-length: ctx-sizes, sequences: parallel}\nmemory-utilization: none "),
     "fit role context-length names 'ctx-sizes', which is not a flag of this engine"),
    (("memory-utilization: none ", "fit-roles: {batch: parallel}\nmemory-utilization: none "), "unknown fit role 'batch'"),
    (("    requests-active: llamacpp:requests_processing", "    requests-activ: llamacpp:requests_processing"),
     "did you mean `requests-active`?"),
    (("rules: []", "rules: [kernel-targets, if-model-is-big]"), "unknown engine rule 'if-model-is-big'"),
    (("  format: gguf", "  format: onnx"), "unknown weights format 'onnx'"),
    (("  metrics: true                   # /metrics", "  # /metrics"), "list it under `launcher-sets:`"),
    (("  cont-batching: {type: negatable, negation: no-cont-batching, default: true}",
      "  cont-batching: {type: negatable, default: true}"), "a negatable flag names its `negation:`"),
])
def test_the_schema_refuses_what_the_code_cannot_act_on(tmp_path: Path, edit: tuple[str, str], expected: str) -> None:
    contract, errors = _llama_copy(tmp_path, edit)
    assert contract is None and any(expected in e for e in errors), errors


@pytest.mark.parametrize("old", ["marker-then-health", "port-closed-until-ready", "http-503-until-loaded"])
def test_an_engine_file_naming_a_merged_readiness_style_loads_as_health_when_loaded(tmp_path: Path, old: str) -> None:
    """The three words a launch waited on the same way are one style now; a file naming an old one still loads
    (the same wait) and its check says what to write instead."""
    engine = tmp_path / "engine"
    (engine / "llama-cpp" / "11434.0.0").mkdir(parents=True)
    shutil.copy(LLAMA_HELP, engine / "llama-cpp" / "11434.0.0" / "help.txt")
    text = (ENGINE / "llama-cpp.yaml").read_text()
    (engine / "llama-cpp.yaml").write_text(text.replace("style: health-when-loaded", f"style: {old}"))
    contract, check = parse_contract(load_file(engine / "llama-cpp.yaml"), engine)
    assert contract is not None and contract.readiness.style == "health-when-loaded"
    [warning] = [p.render() for p in check.problems]
    assert f"readiness style {old!r} is now 'health-when-loaded'" in warning
    assert "write `style: health-when-loaded`" in warning


def test_a_flag_the_pinned_help_lacks_is_refused_with_its_line(tmp_path: Path) -> None:
    contract, errors = _llama_copy(tmp_path, ("  batch-size: {type: int", "  batch-sise: {type: int"))
    assert contract is None
    assert any("flags.batch-sise" in e and "--batch-sise is not an option of the engine's pinned help" in e
               and "llama-cpp.yaml:" in e for e in errors), errors


def test_the_pinned_help_is_recorded_by_its_hash(tmp_path: Path) -> None:
    contract, errors = _llama_copy(tmp_path, ("sha256: 33f5", "sha256: 0000"))
    assert contract is None and any("the pinned help text has sha256 33f5" in e for e in errors), errors


def test_help_options_are_read_with_every_spelling() -> None:
    text = ("-c,    --ctx-size N                     size of the prompt context\n"
            "-kvo,  --kv-offload, -nkvo, --no-kv-offload\n"
            "                                        whether to enable KV cache offloading --not-an-option\n"
            "-fa,   --flash-attn [on|off|auto]       set Flash Attention use\n"
            "----- sampling params -----\n")
    assert help_dump.options_of(text) == {"-c", "--ctx-size", "-kvo", "--kv-offload", "-nkvo", "--no-kv-offload",
                                          "-fa", "--flash-attn"}


def test_negatable_and_json_flags_render_as_the_binary_reads_them() -> None:
    negatable = FlagSpec("cont-batching", "negatable", "setting", negation="no-cont-batching")
    assert negatable.render_value(True) == ["--cont-batching"]
    assert negatable.render_value(False) == ["--no-cont-batching"]
    assert negatable.check_value("yes") is not None and negatable.check_value(False) is None
    as_json = FlagSpec("chat-template-kwargs", "json", "setting")
    assert as_json.render_value({"b": 1, "a": [True]}) == ["--chat-template-kwargs", '{"a":[true],"b":1}']
    assert as_json.check_value("{}") is not None and as_json.check_value({"enable_thinking": False}) is None


def test_the_shipped_llama_recipe_renders_the_exact_docker_run() -> None:
    catalog = load_catalog(use_cache=False, include_user=False)
    recipe = catalog.recipe("qwen3.5-35b-a3b-llamacpp")
    assert recipe.engine == "llama-cpp" and recipe.checkpoint.format == "gguf"
    assert recipe.resources.memory_utilization == 0.0
    spec = spec_for(catalog, recipe)
    assert spec.command[:2] == ("--hf-repo", "unsloth/Qwen3.5-35B-A3B-GGUF:UD-Q4_K_XL")
    assert spec.command[-2:] == ("--offline", "--metrics")
    assert "--host" in spec.command and spec.command[spec.command.index("--port") + 1] == "8080"
    assert spec.env["HF_HUB_OFFLINE"] == "1" and spec.env["HF_HOME"] == spec.mounts[0].target


def test_metrale_rendering_is_unchanged_by_the_schema() -> None:
    catalog = load_catalog(use_cache=False, include_user=False)
    spec = spec_for(catalog, catalog.recipe("qwen3.5-35b-a3b"))
    assert spec.command[:2] == ("serve", catalog.recipe("qwen3.5-35b-a3b").checkpoint.repo)
    assert "HF_HUB_OFFLINE" not in spec.env and "--offline" not in spec.command
