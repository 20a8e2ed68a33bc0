"""`runtime: docker | process` in a recipe, the engine file's `process:` section, and the process-mode spec
core/render.py makes of them (docs/serving.md, "Running engines without Docker"; docs/engines.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metralectl.core.overrides import apply_sets
from metralectl.core.render import ContainerSpec, process_command, spec_for
from metralectl.errors import MetralError, RecipeInvalid
from tests.unit.recipe_helpers import catalog, check, errors, flagship_data, one_error, write
from tests.unit.test_engine_schema import _llama_copy

LLAMA = "qwen3.5-35b-a3b-llamacpp"
PROGRAM = "/opt/llama.cpp/bin/llama-server"


def test_a_recipe_runs_in_docker_unless_it_says_process(tmp_path: Path) -> None:
    assert catalog().recipe("demo-cpu").runtime == "docker"
    data = flagship_data()
    data["runtime"] = "process"
    assert not errors(check(tmp_path, data))


def test_a_misspelt_runtime_is_refused_with_its_line_and_a_suggestion(tmp_path: Path) -> None:
    text = write(tmp_path, flagship_data()).read_text() + "runtime: procss\n"
    path = tmp_path / "qwen3.5-35b-a3b.yaml"
    path.write_text(text)
    problem = one_error(check(tmp_path, text), "runtime")
    assert problem.line == len(text.splitlines()) and problem.column > 0
    assert "unknown runtime" in problem.message and "procss" in problem.message
    assert problem.hint == "did you mean `process`?"


def test_a_runtime_that_is_no_word_is_refused(tmp_path: Path) -> None:
    data = flagship_data()
    data["runtime"] = True
    problem = one_error(check(tmp_path, data), "runtime")
    assert "the boolean true" in problem.message and "runtime: docker" in (problem.hint or "")


def test_a_multi_rank_recipe_cannot_run_as_a_host_process(tmp_path: Path) -> None:
    data = flagship_data()
    data.update(extends="qwen3.5-122b-a10b-ep2", runtime="process")
    for key in list(data):
        if key not in ("extends", "runtime"):
            del data[key]
    data["name"] = "ep2-proc"
    problem = one_error(check(tmp_path, data, "ep2-proc.yaml"), "runtime")
    assert "multi-rank" in problem.message and "runtime: docker" in (problem.hint or "")


def test_runtime_process_needs_the_engine_file_to_say_how() -> None:
    from dataclasses import replace

    from metralectl.core.checker import _runtime
    from metralectl.core.schema import Checker
    from metralectl.core.yamlsrc import load_text

    doc = load_text("name: x\nruntime: process\n", "x.yaml")
    check = Checker(doc)
    contract = replace(catalog().engines["llama-cpp"], process=None)
    assert _runtime(check, doc.data, contract, None) == "process"
    [problem] = check.problems
    assert problem.location() == "x.yaml:2:1" and "does not say how to start it as a host process" in problem.message
    assert "add a `process:` section to engine/llama-cpp.yaml" in (problem.hint or "")


@pytest.mark.parametrize("body, says", [
    ("  executable: llama-server\n  module: x.y", "exactly one of `executable:`"),
    ("  interpreter: python3", "exactly one of `executable:`"),
    ("  executable: bin/llama-server", "executable must be a command name or an absolute path"),
    ("  executable: -rf", "executable must be a command name or an absolute path"),
    ("  module: not a module", "module must be a dotted Python module name"),
    ("  executable: llama-server\n  interpreter: python3", "an interpreter runs a `module:`"),
    ("  executable: llama-server\n  exectuable: x", "exectuable"),
])
def test_the_process_section_is_schema_checked(tmp_path: Path, body: str, says: str) -> None:
    contract, problems = _llama_copy(tmp_path, ("  executable: llama-server        # looked up on PATH, unless "
                                                "engines.yaml in the config dir names it", body))
    assert contract is None and any(says in p for p in problems), problems
    assert any("llama-cpp.yaml:" in p for p in problems)  # located in the file


def test_a_module_engine_starts_with_its_interpreter(tmp_path: Path) -> None:
    contract, problems = _llama_copy(tmp_path, ("  executable: llama-server        # looked up on PATH, unless "
                                                "engines.yaml in the config dir names it",
                                                "  module: vllm.entrypoints.openai.api_server"))
    assert contract is not None and not problems
    assert contract.process is not None and contract.process.program == "python3"
    from metralectl.core.render import process_argv

    recipe = catalog().recipe(LLAMA)
    argv = process_argv(recipe, contract, "/usr/bin/python3")
    assert argv[:3] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]


def _process(name: str = LLAMA) -> ContainerSpec:
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe(name), ["runtime=process"])
    return spec_for(cat, recipe, program=PROGRAM)


def test_a_process_spec_is_the_full_argv_with_host_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    spec = _process()
    docker = spec_for(catalog(), catalog().recipe(LLAMA))
    assert spec.is_process and not docker.is_process
    assert spec.image == "process:" + PROGRAM and spec.command[0] == PROGRAM
    assert list(spec.command[1:]) == list(docker.command)  # what the image's entrypoint would have been given
    assert spec.mounts == () and spec.gpus is None
    assert spec.port == 8080 and "--port" in spec.command and "8080" in spec.command
    assert spec.env["HF_HOME"] == str(tmp_path / "hf") and spec.env["HF_HUB_CACHE"] == str(tmp_path / "hf" / "hub")
    assert spec.env["HF_HUB_OFFLINE"] == "1"  # the engine file's offline env: never a download at start
    assert "/root/.cache" not in " ".join(spec.env.values())  # no container path reaches a host process
    assert spec.labels["ai.metrale.metralectl.recipe"] == LLAMA
    assert spec.spec_hash() != docker.spec_hash()


def test_a_process_spec_takes_the_recipes_env_and_nothing_of_the_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGML_SECRET_SOMETHING", "from the shell")
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe(LLAMA), ["runtime=process", "env.CUDA_VISIBLE_DEVICES=1"])
    spec = spec_for(cat, recipe, program=PROGRAM)
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "1" and "GGML_SECRET_SOMETHING" not in spec.env
    assert "PATH" not in spec.env  # the runtime adds its allow-list, the spec states only its own


@pytest.mark.parametrize(("gpus", "visible"), [("1", "0"), ("2", "0,1"), ("none", "")])
def test_a_process_sees_the_gpus_its_recipe_allows_as_a_container_would(gpus: str, visible: str) -> None:
    cat = catalog()
    spec = spec_for(cat, apply_sets(cat, cat.recipe(LLAMA), ["runtime=process", f"resources.gpus={gpus}"]),
                    program=PROGRAM)
    assert spec.env["CUDA_VISIBLE_DEVICES"] == visible
    if visible:  # Docker's count takes the first devices by NVML's order, which is the PCI bus's, not CUDA's default
        assert spec.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    printed = process_command(spec, dict(spec.env))  # what --print shows the operator
    assert f"CUDA_VISIBLE_DEVICES={visible}" in printed if visible else "CUDA_VISIBLE_DEVICES= " in printed, printed


def test_all_gpus_or_a_class_without_one_sets_no_visibility_and_the_recipes_own_env_wins() -> None:
    cat = catalog()
    every = spec_for(cat, apply_sets(cat, cat.recipe(LLAMA), ["runtime=process", "resources.gpus=all"]), program=PROGRAM)
    assert "CUDA_VISIBLE_DEVICES" not in every.env and "CUDA_DEVICE_ORDER" not in every.env
    chosen = spec_for(cat, apply_sets(cat, cat.recipe(LLAMA), ["runtime=process", "resources.gpus=1",
                                                               "env.CUDA_VISIBLE_DEVICES=3"]), program=PROGRAM)
    assert chosen.env["CUDA_VISIBLE_DEVICES"] == "3"  # the operator's choice of device, not the first
    cpu = next(r for r in cat.recipes.values() if not cat.hardware[r.hardware].has_accelerator)
    spec = spec_for(cat, apply_sets(cat, cpu, ["runtime=process"]), program=PROGRAM)
    assert "CUDA_VISIBLE_DEVICES" not in spec.env


def test_a_process_spec_needs_an_absolute_program() -> None:
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe(LLAMA), ["runtime=process"])
    with pytest.raises(MetralError, match="absolute path"):
        spec_for(cat, recipe, program="llama-server")


def test_the_printed_process_command_is_env_minus_i_then_the_argv() -> None:
    spec = _process()
    text = process_command(spec, {"PATH": "/usr/bin", "HOME": "/home/u", **spec.env})
    assert text.startswith("env -i \\\n  PATH=/usr/bin HOME=/home/u")
    assert f"\n  {PROGRAM} \\\n  --hf-repo unsloth/Qwen3.5-35B-A3B-GGUF:UD-Q4_K_XL" in text
    assert "HF_HUB_OFFLINE=1" in text and "--offline --metrics" in text


def test_runtime_is_a_set_and_a_deviation_from_docker(tmp_path: Path) -> None:
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe(LLAMA), ["runtime=process"])
    assert recipe.runtime == "process" and ("runtime", "docker", "process") in recipe.deviations
    with pytest.raises(RecipeInvalid) as refused:
        apply_sets(cat, cat.recipe(LLAMA), ["runtime=podman"])
    assert refused.value.exit_code == 64 and "unknown runtime" in refused.value.message


def test_metrale_starts_as_met_serve() -> None:
    cat = catalog()
    recipe = apply_sets(cat, cat.recipe("qwen3.5-35b-a3b"), ["runtime=process"])
    spec = spec_for(cat, recipe, program="/usr/local/bin/met")
    assert spec.command[:3] == ("/usr/local/bin/met", "serve", recipe.checkpoint.repo)
    assert os.path.isabs(spec.command[0])
