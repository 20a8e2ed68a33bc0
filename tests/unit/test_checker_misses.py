"""Issue 27 class 9: faults the hidden recipe sets found the checker letting through, each refused with its file,
line, column, key, why and fix (or, for `--set`, a usage error that suggests the key meant)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.catalog import check_files, load_catalog
from metralectl.core.hardware import parse_hardware
from metralectl.core.model_info import parse_model
from metralectl.core.overrides import parse_set
from metralectl.core.yamlsrc import load_text
from metralectl.errors import ExitCode, UsageError
from tests.unit.recipe_helpers import FLAGSHIP, REPO, catalog, check, errors, flagship_data, one_error, read, write

QWEN36 = REPO / "recipes" / "qwen3.6-35b-a3b.yaml"
LLAMA = REPO / "recipes" / "qwen3.5-35b-a3b-llamacpp.yaml"
DEMO = REPO / "recipes" / "demo-cpu.yaml"
FINETUNE = """schema: 1
name: my-finetune
extends: qwen3.5-35b-a3b
description: our fine-tune of the flagship
checkpoint:
  repo: example/Qwen3.5-35B-A3B-NVFP4-ft
  model: qwen3.5-35b-a3b
"""


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(home / "config"), "METRALECTL_CACHE_DIR": str(home / "cache"),
           "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def _user(tmp_path: Path, files: dict[str, str]) -> Path:
    user = tmp_path / "config" / "recipes"
    user.mkdir(parents=True)
    for name, text in files.items():
        (user / name).write_text(text)
    return user


def _checked(tmp_path: Path, text: str, name: str = "my-finetune.yaml") -> tuple[Any, list[Any]]:
    [(_, recipe, problems)] = check_files(catalog(), [write(tmp_path, text, name)])
    return recipe, problems


# --- extends: another checkpoint under the parent's served name ------------------------------------------

def test_a_child_of_another_checkpoint_may_not_serve_under_the_parents_name(tmp_path: Path) -> None:
    recipe, problems = _checked(tmp_path, FINETUNE)
    assert recipe is None
    problem = one_error(problems, "serve.model-name")
    assert problem.file.endswith("my-finetune.yaml") and (problem.line, problem.column) == (6, 3)  # its repo line
    assert "'Sehyo/Qwen3.5-35B-A3B-NVFP4'" in problem.message and "example/Qwen3.5-35B-A3B-NVFP4-ft" in problem.message
    assert "model-name: example/Qwen3.5-35B-A3B-NVFP4-ft" in (problem.hint or "")


def test_stating_the_name_serves_it_without_the_parents_figures(tmp_path: Path) -> None:
    text = FINETUNE + "serve:\n  model-name: example/Qwen3.5-35B-A3B-NVFP4-ft\n"
    recipe, problems = _checked(tmp_path, text)
    assert errors(problems) == [] and recipe is not None
    assert recipe.serve["model-name"] == "example/Qwen3.5-35B-A3B-NVFP4-ft"
    assert recipe.validated.decode_tok_s is None and recipe.validated.source is None  # not the flagship's 133
    assert any("not inherited" in w for w in recipe.warnings)
    _user(tmp_path, {"my-finetune.yaml": text})
    listed = json.loads(_cli(tmp_path, "list", "--json").stdout)["recipes"]
    row = next(r for r in listed if r["name"] == "my-finetune")
    assert row["validated_tok_s"] is None


def test_a_child_on_other_hardware_does_not_inherit_the_figures_either(tmp_path: Path) -> None:
    text = "schema: 1\nname: mine-hopper\nextends: qwen3.5-35b-a3b\ndescription: x\nhardware: hopper\n" \
           "image: metrale-inference-hopper\n"
    recipe, problems = _checked(tmp_path, text, "mine-hopper.yaml")
    assert errors(problems) == [] and recipe is not None
    assert recipe.validated.decode_tok_s is None and recipe.validated.hardware is None
    same, _ = _checked(tmp_path, "schema: 1\nname: mine-long\nextends: qwen3.5-35b-a3b\ndescription: x\n"
                                 "serve:\n  max-seq-len: 4096\n", "mine-long.yaml")
    assert same.validated.decode_tok_s == 133  # same checkpoint, same class: its figures stand


# --- checkpoint facts that contradict kernels/ -----------------------------------------------------------

def test_a_quant_kernels_contradicts_is_refused(tmp_path: Path) -> None:
    data = read(QWEN36)  # nvidia/Qwen3.6-35B-A3B-NVFP4, an nvfp4 checkpoint; the model also has an fp8 target
    data["checkpoint"]["quant"] = "fp8"
    data["serve"]["mtp-quantization"] = "fp8"
    problem = one_error(check(tmp_path, data, QWEN36.name), "checkpoint.quant")
    assert "listed with quant nvfp4" in problem.message and "kernels/gb10/qwen3.6-35b-a3b/model.yaml" in problem.message
    assert problem.line > 0 and "quant: nvfp4" in (problem.hint or "")


def test_a_gguf_repository_holds_every_quant(tmp_path: Path) -> None:
    data = read(DEMO)  # kernels/ lists its repository with Q4_K_M; the repository has Q8_0 too
    data["checkpoint"]["quant"] = "Q8_0"
    assert errors(check(tmp_path, data, DEMO.name)) == []


def test_a_model_that_contradicts_the_checkpoint_is_refused(tmp_path: Path) -> None:
    data = flagship_data()
    data["checkpoint"]["model"] = "qwen3.5-27b"
    data["serve"]["speculative"] = False
    data["serve"]["num-drafts"] = 1
    problem = one_error(check(tmp_path, data), "checkpoint.model")
    assert "contradicts the checkpoint" in problem.message and "qwen3.5-35b-a3b" in problem.message
    llama = read(LLAMA)
    llama["checkpoint"]["repo"] = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"  # kernels/cpu lists it as qwen2.5-0.5b-instruct
    problem = one_error(check(tmp_path, llama, LLAMA.name), "checkpoint.model")
    assert "qwen2.5-0.5b-instruct" in problem.message and "model: qwen2.5-0.5b-instruct" in (problem.hint or "")


# --- booleans that are not booleans --------------------------------------------------------------------------

@pytest.mark.parametrize("value", [1, 1.0, "yes", "true", "on", 0])
def test_expose_acknowledged_is_true_or_absent(tmp_path: Path, value: object) -> None:
    data = flagship_data()
    data["resources"]["expose-acknowledged"] = value
    problem = one_error(check(tmp_path, data), "resources.expose-acknowledged")
    assert "boolean key is written `true`" in problem.message and problem.line > 0


@pytest.mark.parametrize(("key", "value"), [(("schema",), True), (("schema",), 1.0), (("resources", "ranks"), 1.0),
                                            (("resources", "ranks"), True)])
def test_a_number_the_schema_wants_is_not_a_boolean_or_a_float(tmp_path: Path, key: tuple[str, ...],
                                                               value: object) -> None:
    data = flagship_data()
    node = data
    for part in key[:-1]:
        node = node[part]
    node[key[-1]] = value
    one_error(check(tmp_path, data), ".".join(key))


@pytest.mark.parametrize("value", [True, False, "yes", "true", "on", 2, 1.0])
def test_a_switch_lever_takes_1_or_0(tmp_path: Path, value: object) -> None:
    data = flagship_data()
    data["env"] = {"METRALE_FP8_ROWWISE": value}
    problem = one_error(check(tmp_path, data), "env.METRALE_FP8_ROWWISE")
    assert "is a switch: write '1' (on) or '0' (off)" in problem.message


@pytest.mark.parametrize("value", ["1", "0", 1, 0])
def test_a_switch_lever_written_as_the_engine_reads_it_passes(tmp_path: Path, value: object) -> None:
    data = flagship_data()
    data["env"] = {"METRALE_FP8_ROWWISE": value}
    assert errors(check(tmp_path, data)) == []


def test_kernels_data_booleans_are_booleans() -> None:
    hw = (REPO / "kernels" / "gb10" / "hardware.yaml").read_text()
    assert "unified: true" in hw
    _, checked = parse_hardware(load_text(hw.replace("unified: true", "unified: 'yes'"), "hardware.yaml"), None)
    assert any(p.key == "memory.unified" for p in errors(checked.problems))
    cpu = (REPO / "kernels" / "cpu" / "hardware.yaml").read_text()
    assert "host-ram: true" in cpu
    _, checked = parse_hardware(load_text(cpu.replace("host-ram: true", "host-ram: 1"), "hardware.yaml"), None)
    assert any(p.key == "memory.host-ram" for p in errors(checked.problems))
    model = (REPO / "kernels" / "gb10" / "qwen3.5-35b-a3b" / "model.yaml").read_text()
    for old, new, key in (("vision: false", "vision: 'no'", "vision"), ("supported: true", "supported: 'yes'",
                                                                          "mtp.supported")):
        assert old in model
        _, checked = parse_model(load_text(model.replace(old, new), "model.yaml"), "gb10")
        assert any(p.key == key for p in errors(checked.problems)), key


# --- dates that never were -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["2026-02-30", "2026-13-01", "2026-00-10", "2026-1-5", "01/12/2026", "20261201",
                                   "2026-12-01\n", "2026-12-01T00:00"])
@pytest.mark.parametrize("key", [("validated", "date"), ("provenance", "taken")])
def test_an_impossible_or_non_iso_date_is_refused(tmp_path: Path, key: tuple[str, str], value: str) -> None:
    data = flagship_data()
    data[key[0]][key[1]] = value
    problem = one_error(check(tmp_path, data), ".".join(key))
    assert "date" in problem.message and problem.line > 0 and problem.hint


def test_a_real_date_passes_leap_day_included(tmp_path: Path) -> None:
    data = flagship_data()
    data["validated"]["date"] = "2028-02-29"
    assert errors(check(tmp_path, data)) == []


# --- --set with an unknown key ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "meant"), [("max-seq-lenn=4096", "max-seq-len"), ("--kv-cache-dtyp=fp8", "kv-cache-dtype"),
                                             ("resource.port=9000", "resources.port"), ("hardwar=hopper", "hardware"),
                                             ("served-model-nam=x", "served-model-name")])
def test_set_with_an_unknown_key_suggests_the_one_meant(text: str, meant: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_set(text, catalog(), "metrale")
    assert caught.value.hint == f"did you mean `{meant}`?"


def test_set_with_an_unknown_flag_on_the_command_line(tmp_path: Path) -> None:
    out = _cli(tmp_path, "show", "qwen3.5-35b-a3b", "--set", "max-seq-lenn=4096")
    assert out.returncode == ExitCode.USAGE and "did you mean `max-seq-len`?" in out.stderr, out.stderr


# --- extends: a parent hidden by a refused override ---------------------------------------------------------

def test_a_child_of_a_refused_override_says_why_its_parent_is_hidden(tmp_path: Path) -> None:
    broken = FLAGSHIP.read_text().replace("  max-seq-len: 8192", "  max-seq-len: lots")
    child = "schema: 1\nname: my-agents\nextends: qwen3.5-35b-a3b\ndescription: x\n"
    user = _user(tmp_path, {"qwen3.5-35b-a3b.yaml": broken, "my-agents.yaml": child})
    refused = {Path(r.path).name: r for r in load_catalog(user_dir=user, use_cache=False).refused}
    problem = one_error(refused["my-agents.yaml"].problems, "extends")
    assert "hidden because your override" in problem.message and str(user / "qwen3.5-35b-a3b.yaml") in problem.message
    assert "must be an integer, not str 'lots'" in problem.message and (problem.line, problem.column) == (3, 1)
    assert "did you mean" not in (problem.hint or "") and "recipes check" in (problem.hint or "")
    out = _cli(tmp_path, "show", "my-agents")
    assert out.returncode == ExitCode.DATA and "hidden because your override" in out.stderr, out.stderr
    assert "did you mean" not in out.stderr and "Traceback" not in out.stderr


def test_set_of_another_checkpoint_keeps_no_pinned_name(tmp_path: Path) -> None:
    out = _cli(tmp_path, "show", "qwen3.5-35b-a3b", "--set", "checkpoint.repo=example/Qwen3.5-35B-A3B-NVFP4-ft",
               "--set", "checkpoint.model=qwen3.5-35b-a3b")
    assert out.returncode == ExitCode.USAGE and "serve.model-name" in out.stderr, out.stderr
    both = _cli(tmp_path, "show", "qwen3.5-35b-a3b", "--set", "checkpoint.repo=example/Qwen3.5-35B-A3B-NVFP4-ft",
                "--set", "checkpoint.model=qwen3.5-35b-a3b", "--set", "model-name=example/Qwen3.5-35B-A3B-NVFP4-ft")
    assert both.returncode == 0, both.stderr


def test_figures_measured_on_another_hardware_class_are_refused(tmp_path: Path) -> None:
    data = flagship_data()  # validated on gb10 at 133 tok/s, moved to Hopper with the figures kept
    data["hardware"], data["image"] = "hopper", "metrale-inference-hopper"
    problem = one_error(check(tmp_path, data), "validated.hardware")
    assert "measured on gb10" in problem.message and "runs on hopper" in problem.message and problem.line > 0
