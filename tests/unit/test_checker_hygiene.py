"""Issue 27 class 8, argument hygiene: what a recipe hands the engine's command line, the container and the
terminal. Written as an attacker would: a value that smuggles an option, a name with a newline or an escape,
through a user recipe, `extends:`, `--set` and a synced release alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.contract import parse_contract
from metralectl.core.yamlsrc import load_text
from metralectl.errors import ExitCode
from tests.unit.recipe_helpers import REPO, check, errors, flagship_data, one_error, read

LLAMA = REPO / "recipes" / "qwen3.5-35b-a3b-llamacpp.yaml"
HEX40 = "0123456789abcdef0123456789abcdef01234567"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1"}, cwd=REPO, timeout=120)


def _located(problem: Any) -> None:
    assert problem.file.endswith(".yaml") and problem.line > 0 and problem.column > 0 and problem.hint


# --- a value that begins with '-' -------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["--api-key=x", "-h", "--require-auth", " --dump=/tmp/x", "-"])
def test_a_string_flag_value_that_reads_as_an_option_is_refused(tmp_path: Path, value: str) -> None:
    data = flagship_data()
    data["serve"]["model-name"] = value
    problem = one_error(check(tmp_path, data), "serve.model-name")
    assert "begins with '-'" in problem.message and "another option" in problem.message
    assert "without the leading '-'" in (problem.hint or "")
    _located(problem)


def test_the_alias_spelling_and_a_rank_override_are_held_to_it_too(tmp_path: Path) -> None:
    data = flagship_data()
    del data["serve"]["model-name"]
    data["serve"]["served-model-name"] = "--auth-token=stolen"
    assert "begins with '-'" in one_error(check(tmp_path, data), "serve.served-model-name").message
    ep2 = read(REPO / "recipes" / "qwen3.5-122b-a10b-ep2.yaml")
    ep2["resources"]["ranks"][1]["serve"] = {"kernel-target": "--check-kernels"}
    problem = one_error(check(tmp_path, ep2, "qwen3.5-122b-a10b-ep2.yaml"), "resources.ranks[1].serve.kernel-target")
    assert "begins with '-'" in problem.message


def test_llama_cpp_string_flags_too_but_its_negative_numbers_are_numbers(tmp_path: Path) -> None:
    data = read(LLAMA)
    data["serve"]["alias"] = "--api-key-file=/etc/shadow"
    assert "begins with '-'" in one_error(check(tmp_path, data, LLAMA.name), "serve.alias").message
    data = read(LLAMA)
    data["serve"]["parallel"] = -1  # the engine file's range admits -1 (auto): a number, rendered as one
    assert errors(check(tmp_path, data, LLAMA.name)) == []
    data["serve"]["parallel"] = -2
    assert "at least -1" in one_error(check(tmp_path, data, LLAMA.name), "serve.parallel").message


def _contract_with(flag: str, **extra: object) -> Any:
    doc = load_text((REPO / "engine" / "metrale.yaml").read_text(), "engine/metrale.yaml")
    doc.data["flags"][flag].update(extra)
    return parse_contract(doc, REPO / "engine")


def test_an_engine_file_may_let_a_flag_take_a_leading_dash() -> None:
    contract, check_ = _contract_with("model-name", **{"leading-dash": "allowed"})
    assert check_.ok and contract is not None
    assert contract.flags["model-name"].check_value("-x") is None
    assert contract.flags["kernel-target"].check_value("-x") is not None  # only the flag it marks
    _, bad = _contract_with("max-seq-len", **{"leading-dash": "allowed"})
    assert any(p.key == "flags.max-seq-len.leading-dash" and "string or path flag" in p.message for p in bad.problems)
    _, word = _contract_with("model-name", **{"leading-dash": "yes"})
    assert any("leading-dash is one of allowed, refused" in p.message for p in word.problems)


def test_a_set_that_smuggles_an_option_is_a_usage_error() -> None:
    out = _cli("run", "qwen3.5-35b-a3b", "--print", "--set", "model-name=--api-key=x")
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert "begins with '-'" in out.stderr and "--api-key=x" not in out.stdout and "Traceback" not in out.stderr


def test_a_synced_recipe_that_smuggles_an_option_is_refused(tmp_path: Path, isolated_env: Path) -> None:
    from metralectl.app import recipe_sync
    from metralectl.core import synced_set
    from metralectl.core.catalog import load_catalog
    from metralectl.seams.sync_fetch import Source
    from tests.unit.release_fixture import fixture_recipes, write_release

    recipes = fixture_recipes()
    flagship = recipes["qwen3.5/qwen3.5-35b-a3b-nvfp4"]
    recipes["evil/dash"] = flagship.replace(b"  model_name: Sehyo/Qwen3.5-35B-A3B-NVFP4\n", b"  model_name: --api-key=x\n")
    assert recipes["evil/dash"] != flagship
    with pytest.raises(recipe_sync.RecipesRefused) as caught:  # one refused recipe refuses the release
        recipe_sync.sync(load_catalog(use_cache=False), Source(str(write_release(tmp_path / "b40", recipes))),
                         root=synced_set.synced_dir(), today="2026-12-01")
    assert synced_set.current(synced_set.synced_dir()) is None  # nothing was installed
    [refused] = caught.value.report.refused
    assert refused.name == "dash"
    assert any(p.key == "serve.model-name" and "begins with '-'" in p.message for p in refused.problems)


# --- names and text with control characters ------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "where"), [
    (("name",), "qwen3.5-35b-a3b\n", "name"),
    (("name",), "qwen\x1b[2Jx", "name"),
    (("checkpoint", "repo"), "Sehyo/Qwen3.5-35B-A3B-NVFP4\n", "checkpoint.repo"),
    (("checkpoint", "repo"), "Sehyo/Qwen3.5-35B\x1b]0;pwned\x07", "checkpoint.repo"),
    (("checkpoint", "repo"), "Qwen3.5-35B-A3B-NVFP4", "checkpoint.repo"),  # no organisation
    (("checkpoint", "revision"), HEX40 + "\n", "checkpoint.revision"),
    (("provenance", "commit"), "2735884296e66f284942540c1c0ad8a49cffed92\n", "provenance.commit"),
])
def test_names_are_matched_in_full_against_their_grammar(tmp_path: Path, key: tuple[str, ...], value: str,
                                                         where: str) -> None:
    data = flagship_data()
    node = data
    for part in key[:-1]:
        node = node[part]
    node[key[-1]] = value
    problem = one_error(check(tmp_path, data), where)
    _located(problem)
    assert repr(value) in problem.message  # shown escaped, never raw


def test_extends_names_a_recipe_in_the_same_grammar(tmp_path: Path) -> None:
    problem = one_error(check(tmp_path, "schema: 1\nname: mine\nextends: \"qwen3.5-35b-a3b\\n\"\n", "mine.yaml"),
                        "extends")
    assert "must be 1-64 lower-case letters" in problem.message and "did you mean" not in (problem.hint or "")
    assert (problem.line, problem.column) == (3, 1)


def test_an_environment_name_with_a_newline_is_refused(tmp_path: Path) -> None:
    data = flagship_data()
    data["env"] = {"NCCL_DEBUG\n": "INFO"}  # `$` matched before the newline, and fnmatch's NCCL_* took it
    problem = one_error(check(tmp_path, data), "env.NCCL_DEBUG\\n")  # the key is shown escaped
    assert "not a valid environment variable name" in problem.message


@pytest.mark.parametrize(("key", "value"), [
    (("serve", "model-name"), "qwen\x1b]0;owned\x07"),
    (("serve", "model-name"), "qwen\nINFO forged line"),
    (("serve", "kernel-target"), "sm_121\u202egnp.exe"),
    (("env", "METRALE_MTP_K_LADDER"), "1:3\x1b[2J"),
    (("description",), "the flagship\x1b[2J\x1b[H"),
    (("validated", "notes"), "fine\u202e"),
    (("tags",), ["mtp", "x\x9bm"]),
    (("image-tag",), "dev\n"),
])
def test_control_characters_in_a_value_are_refused(tmp_path: Path, key: tuple[str, ...], value: object) -> None:
    data = flagship_data()
    node = data
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = value
    bad = errors(check(tmp_path, data))
    assert bad and all(p.line > 0 for p in bad), [p.render() for p in bad]
    assert any("U+" in p.message or "not a Docker tag" in p.message for p in bad), [p.render() for p in bad]
    assert all("\x1b" not in p.render() and "\x9b" not in p.render() for p in bad)


def test_prose_keeps_its_line_breaks(tmp_path: Path) -> None:
    data = flagship_data()
    data["description"] = "first line\nsecond line\twith a tab, and an emoji 👩\u200d💻"
    data["validated"]["notes"] = "measured twice\nsame result"
    assert errors(check(tmp_path, data)) == []


def test_a_set_with_a_raw_escape_is_a_usage_error_shown_escaped() -> None:
    out = _cli("show", "qwen3.5-35b-a3b", "--set", "model-name=x\x1b]0;owned\x07")
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert "\x1b" not in out.stderr and "\x07" not in out.stderr and "U+001B" in out.stderr
