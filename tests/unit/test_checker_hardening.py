"""Issue 19 item 13: the classes of bad recipe an independent set found, each refused in words with its line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from metralectl.core.catalog import load_catalog
from metralectl.core.yamlsrc import YamlSyntax, load_text
from metralectl.errors import RecipeInvalid
from tests.unit.recipe_helpers import FLAGSHIP, REPO, check, errors, flagship_data, one_error

EP2 = REPO / "recipes" / "qwen3.5-122b-a10b-ep2.yaml"


def _rendered(problems: list[Any]) -> str:
    return "\n".join(p.render() for p in errors(problems))


@pytest.mark.parametrize(("text", "value"), [("port: 010000", "4096"), ("n: 0100", "64"), ("t: 1:30", "90")])
def test_yaml_1_1_octal_and_sexagesimal_numbers_are_refused_not_guessed(text: str, value: str) -> None:
    with pytest.raises(YamlSyntax) as caught:
        load_text(text + "\n", "r.yaml")
    problem = caught.value.problem
    assert (problem.line, problem.column) == (1, text.index(":") + 3)
    assert f"YAML 1.1 reads it as {value}" in problem.message


def test_quoted_or_plain_decimal_numbers_still_read() -> None:
    assert load_text("a: 10000\nb: '010000'\nc: 0\nd: 0x10\n", "r.yaml").data == {"a": 10000, "b": "010000", "c": 0,
                                                                                  "d": 16}


@pytest.mark.parametrize("word", [".inf", "-.inf", ".nan", "1.0e+309"])
def test_non_finite_numbers_are_refused(word: str) -> None:
    with pytest.raises(YamlSyntax) as caught:
        load_text(f"memory-utilization: {word}\n", "r.yaml")
    assert caught.value.problem.line == 1 and "is not a finite number" in caught.value.problem.message


def test_nul_and_invalid_utf8_are_reported_by_line_with_the_right_hint() -> None:
    with pytest.raises(YamlSyntax) as nul:
        load_text(b"a: 1\nb: x\x00y\n", "r.yaml")
    assert (nul.value.problem.line, nul.value.problem.column) == (2, 5)
    assert "NUL byte" in nul.value.problem.message and "UTF-8" not in (nul.value.problem.hint or "")
    with pytest.raises(YamlSyntax) as bad:
        load_text(b"a: 1\nb: \xff\n", "r.yaml")
    assert (bad.value.problem.line, bad.value.problem.column) == (2, 4)
    assert "0xff is not UTF-8" in bad.value.problem.message


def test_a_boolean_is_not_a_rank_count(tmp_path: Path) -> None:
    data = flagship_data()
    data["resources"]["ranks"] = True
    problem = one_error(check(tmp_path, data), "resources.ranks")
    assert "not the boolean true" in problem.message


def test_a_flag_given_twice_through_its_alias_is_refused(tmp_path: Path) -> None:
    data = flagship_data()
    data["serve"] = {"served-model-name": "x", **data["serve"]}
    problem = one_error(check(tmp_path, data), "serve.model-name")
    assert "given twice, as `served-model-name` and as `model-name`" in problem.message


def test_an_invalid_value_is_not_also_reported_missing(tmp_path: Path) -> None:
    data = flagship_data()
    data["serve"]["max-seq-len"] = "lots"
    text = _rendered(check(tmp_path, data))
    assert "must be an integer" in text and "missing --max-seq-len" not in text


def test_hints_never_propose_a_value_the_next_rule_refuses(tmp_path: Path) -> None:
    """Under a revision that refuses `false` on a presence-only flag, a missing one is not hinted as `false`."""
    from metralectl.core.checker import _add_hint
    from metralectl.core.engine_flags import FlagSpec

    spec = FlagSpec("check-kernels", "flag", "setting", default=False)
    assert "false" not in _add_hint(spec, false_allowed=False)
    assert "false" in _add_hint(spec, false_allowed=True)


def test_ep2_master_port_must_differ_from_the_ranks_ports(tmp_path: Path) -> None:
    text = EP2.read_text().replace("master-port: 29500", "master-port: 8888")
    problem = one_error(check(tmp_path, text, EP2.name), "resources.master-port")
    assert "also a rank's HTTP port" in problem.message


def test_nodes_must_hold_the_ranks(tmp_path: Path) -> None:
    text = EP2.read_text().replace("nodes: 2", "nodes: 3")
    problem = one_error(check(tmp_path, text, EP2.name), "resources.nodes")
    assert "3 nodes cannot hold 2 ranks" in problem.message and "nodes: 2" in (problem.hint or "")


def _user_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    user = tmp_path / "config" / "recipes"
    user.mkdir(parents=True)
    for name, text in files.items():
        (user / name).write_text(text)
    return user


def test_an_extends_cycle_is_named_as_one(tmp_path: Path) -> None:
    user = _user_dir(tmp_path, {"a.yaml": "extends: b\nname: a\ndescription: x\n",
                                "b.yaml": "extends: a\nname: b\ndescription: y\n"})
    catalog = load_catalog(user_dir=user, use_cache=False)
    messages = [p.message for r in catalog.refused for p in r.problems]
    assert any("forms a cycle: a → b → a" in m for m in messages), messages
    assert not any("unknown recipe" in m for m in messages)


def test_a_broken_user_recipe_named_like_a_shipped_one_hides_it(tmp_path: Path) -> None:
    broken = FLAGSHIP.read_text().replace("  max-seq-len: 8192", "  max-seq-len: lots")
    assert broken != FLAGSHIP.read_text()
    user = _user_dir(tmp_path, {"my-flagship.yaml": broken})
    catalog = load_catalog(user_dir=user, use_cache=False)
    with pytest.raises(RecipeInvalid):
        catalog.recipe("qwen3.5-35b-a3b")  # never the shipped one the user meant to replace


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "METRALECTL_CONFIG_DIR": str(home / "config"), "METRALECTL_CACHE_DIR": str(home / "cache"),
           "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def test_run_print_of_a_shadowed_recipe_fails_and_says_each_problem_once(tmp_path: Path) -> None:
    _user_dir(tmp_path, {"my-flagship.yaml": FLAGSHIP.read_text().replace("  max-seq-len: 8192",
                                                                          "  max-seq-len: lots")})
    out = _cli(tmp_path, "run", "qwen3.5-35b-a3b", "--print")
    assert out.returncode == 65 and out.stdout == "", out.stdout
    assert out.stderr.count("must be an integer, not str 'lots'") == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_the_catalog_cache_sees_a_same_size_edit_with_the_mtime_put_back(tmp_path: Path) -> None:
    recipe = FLAGSHIP.read_text().replace("name: qwen3.5-35b-a3b\n", "name: mine\n")
    user = _user_dir(tmp_path, {"mine.yaml": recipe})
    path = user / "mine.yaml"
    assert _cli(tmp_path, "show", "mine").returncode == 0  # cached now
    stat = path.stat()
    edited = recipe.replace("  max-seq-len: 8192", "  max-seq-len: 9999")
    assert len(edited) == len(recipe)
    path.write_text(edited)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    out = _cli(tmp_path, "show", "mine", "--json")
    assert out.returncode == 0, out.stderr
    assert '"max-seq-len": 9999' in out.stdout
