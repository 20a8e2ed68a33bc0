"""Engine-scoped checker rules: the Metrale-only checks apply to Metrale recipes, each engine's own required
keys and quant words to its own, and a llama.cpp recipe is judged by what llama.cpp is."""

from __future__ import annotations

from pathlib import Path

import pytest
from typing import Any

from tests.unit.recipe_helpers import REPO, check, errors, flagship_data, one_error, read

LLAMA = REPO / "recipes" / "qwen3.5-35b-a3b-llamacpp.yaml"


def _llama() -> dict[str, Any]:
    return read(LLAMA)


def _messages(problems: list[Any]) -> str:
    return "\n".join(p.render() for p in errors(problems))


def test_the_shipped_llama_recipe_is_clean(tmp_path: Path) -> None:
    assert errors(check(tmp_path, _llama(), "qwen3.5-35b-a3b-llamacpp.yaml")) == []


def test_each_engine_has_its_own_quant_words(tmp_path: Path) -> None:
    data = _llama()
    data["checkpoint"]["quant"] = "nvfp4"
    problem = one_error(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml"), "checkpoint.quant")
    assert "unknown llama.cpp server quantization 'nvfp4'" in problem.message
    metrale = flagship_data()
    metrale["checkpoint"]["quant"] = "Q4_K_M"
    problem = one_error(check(tmp_path, metrale), "checkpoint.quant")
    assert "unknown Metrale Engine quantization 'Q4_K_M'" in problem.message


def test_kernel_targets_bind_metrale_only(tmp_path: Path) -> None:
    data = _llama()
    data["checkpoint"]["quant"] = "Q8_0"  # qwen3.5-35b-a3b ships only an nvfp4 kernel target: not llama.cpp's concern
    assert errors(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml")) == []
    metrale = flagship_data()
    metrale["checkpoint"] = {"repo": "example/Qwen3.5-35B-A3B-FP8", "quant": "fp8", "model": "qwen3.5-35b-a3b"}
    assert "no kernel target for (gb10, qwen3.5-35b-a3b, fp8)" in _messages(check(tmp_path, metrale))


def test_a_llama_recipe_names_the_model_it_serves(tmp_path: Path) -> None:
    data = _llama()
    del data["checkpoint"]["model"]
    problem = one_error(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml"), "checkpoint")
    assert "names the model it serves" in problem.message and "qwen3.5-35b-a3b" in (problem.hint or "")


def test_llama_states_its_listed_keys_and_not_the_metrale_explicit_set(tmp_path: Path) -> None:
    data = _llama()
    del data["serve"]["parallel"]
    problem = one_error(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml"))
    assert "missing --parallel" in problem.message and "ctx-size, parallel, n-gpu-layers stated" in problem.message


def test_memory_utilization_means_nothing_to_llama(tmp_path: Path) -> None:
    data = _llama()
    data["resources"]["memory-utilization"] = 0.85
    problem = one_error(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml"), "resources.memory-utilization")
    assert "takes no memory fraction" in problem.message and "ctx-size" in (problem.hint or "")


def test_metrale_levers_and_multi_rank_are_not_llama_s(tmp_path: Path) -> None:
    data = _llama()
    data["env"] = {"METRALE_RATE_LIMIT_RPM": "10"}
    data["resources"]["ranks"] = [{"role": "head", "port": 8080}, {"role": "worker", "port": 8081}]
    text = _messages(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml"))
    assert "METRALE_RATE_LIMIT_RPM is not a runtime lever of llama.cpp server" in text
    assert "serves from one process" in text and "undeclared METRALE_*" not in text


def test_llama_auth_is_its_own_flag(tmp_path: Path) -> None:
    data = _llama()
    data["resources"]["bind"] = "0.0.0.0"
    problem = one_error(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml"), "resources.bind")
    assert "`api-key-file: ...`" in (problem.hint or "")
    data["serve"]["api-key-file"] = "/run/keys"
    assert errors(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml")) == []


def test_a_secret_on_the_command_line_is_refused_with_the_reason(tmp_path: Path) -> None:
    data = _llama()
    data["serve"]["api-key"] = "sk-123"
    problem = one_error(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml"), "serve.api-key")
    assert "shows in `ps`" in problem.message


def test_a_misspelt_llama_flag_gets_a_suggestion_and_the_help_command(tmp_path: Path) -> None:
    data = _llama()
    data["serve"]["flash-atn"] = "on"
    data["serve"]["zzz-unknown"] = 1
    probs = errors(check(tmp_path, data, "qwen3.5-35b-a3b-llamacpp.yaml"))
    by_key = {p.key: p for p in probs}
    assert by_key["serve.flash-atn"].hint == "did you mean `flash-attn`?"
    assert by_key["serve.zzz-unknown"].hint == "see `llama-server --help` for the flag list"
    assert by_key["serve.flash-atn"].line is not None


def test_the_fit_estimate_says_which_memory_meaning_it_used() -> None:
    import dataclasses

    from metralectl.core.fit import estimate
    from tests.unit.recipe_helpers import catalog

    cat = catalog()
    llama = cat.recipe("qwen3.5-35b-a3b-llamacpp")
    model, hw = cat.model_of(llama), cat.hardware["gb10"]
    est = estimate(llama, model, hw, memory_meaning="none")
    assert est.memory_meaning == "none" and est.budget.gb == hw.memory_gb(None)
    assert "takes no memory fraction" in est.budget.basis
    # 131072 ctx × 10 attention layers × 2 KV heads × 256 head dim × (2 + 2 bytes of f16)
    assert est.kv_pool.gb == pytest.approx(131072 * 10 * 2 * 256 * 4 / 1e9)
    q8 = dataclasses.replace(llama, checkpoint=dataclasses.replace(llama.checkpoint, quant="Q8_0"),
                             serve={**llama.serve, "cache-type-k": "q8_0", "cache-type-v": "q8_0"})
    est = estimate(q8, model, hw, memory_meaning="none")
    assert est.weights.gb == pytest.approx(35 * 8.5 / 8) and est.fits is True
    assert est.kv_pool.gb == pytest.approx(131072 * 10 * 2 * 256 * 2 * 34 / 32 / 1e9)
    assert estimate(llama, model, hw).weights.gb is None  # UD-Q4_K_XL: a per-model mix, no single bit width
    flagship = cat.recipe("qwen3.5-35b-a3b")
    after = estimate(flagship, cat.model_of(flagship), hw, memory_meaning="fraction-of-free-after-weights")
    assert after.budget.gb is not None and after.weights.gb is not None
    util = flagship.resources.memory_utilization
    assert after.budget.gb == pytest.approx(after.weights.gb + (hw.memory_gb(None) - after.weights.gb) * util)


def test_every_engines_unknown_flag_hint_names_its_serve_command_once(tmp_path: Path) -> None:
    """An engine whose image runs the command it is given has the whole command in serve-command; the hint put the
    binary before it again (`trtllm-serve trtllm-serve --help`, `vllm vllm serve --help`)."""
    from tests.unit.recipe_helpers import catalog

    seen, engines = 0, set()
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        data = read(path)
        data.setdefault("serve", {})["zzz-unknown-flag"] = 1
        hints = [p.hint for p in errors(check(tmp_path, data, path.name)) if p.key == "serve.zzz-unknown-flag"]
        assert len(hints) == 1, (path.name, hints)
        command = hints[0].removeprefix("see `").removesuffix(" --help` for the flag list").split()
        contract = catalog().engines[catalog().recipe(path.stem).engine]
        engines.add(contract.name)
        assert command[0] == contract.binary.split()[0] and command.count(command[0]) == 1, (path.name, hints[0])
        seen += 1
    assert len(engines) >= 5, engines
