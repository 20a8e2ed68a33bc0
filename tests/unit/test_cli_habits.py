"""What users of docker, ollama and other launchers type by habit: `ls`, `version`, `search`, `completion`,
`info`/`paths`, and one "Did you mean" per typo. Real subprocesses; the completion scripts are sourced by
the real bash, zsh and fish and asked to complete."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.errors import ExitCode

from tests.unit.recipe_helpers import REPO
from tests.unit.test_cli_catalog import HEAVY, cli


@pytest.mark.parametrize("argv", [["ls"], ["version"], ["search", "qwen"], ["info"], ["paths", "--json"],
                                  ["completion", "bash"]])
def test_habit_commands_import_nothing_heavy(argv: list[str]) -> None:
    code = ("import sys, runpy\n"
            f"sys.argv = ['metralectl', *{argv!r}]\n"
            "try:\n    runpy.run_module('metralectl', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stderr.rstrip().endswith("HEAVY="), out.stderr


def test_a_typo_gets_one_suggestion() -> None:
    for argv, word in ((["lst"], "'list'"), (["bench", "rnu"], "'run'")):
        out = cli(*argv)
        assert out.returncode == ExitCode.USAGE
        assert out.stderr.count("Did you mean") == 1 and f"Did you mean {word}?" in out.stderr, out.stderr


def test_ls_and_version_are_list_and_dash_dash_version() -> None:
    assert cli("ls", "--json").stdout == cli("list", "--json").stdout
    # with a root option before the command too
    assert json.loads(cli("--debug", "ls", "--json").stdout) == json.loads(cli("list", "--json").stdout)
    version = cli("version")
    assert version.returncode == 0 and version.stdout == cli("--version").stdout
    assert cli("--debug", "version").stdout == version.stdout


def names(*words: str) -> list[str]:
    out = cli("search", *words, "--json")
    found = [r["name"] for r in json.loads(out.stdout)["recipes"]]  # a clean document, matches or not
    assert out.returncode == (0 if found else ExitCode.FAILED), out.stderr
    return found


def test_search_needs_every_word_in_any_case_over_names_models_descriptions_tags() -> None:
    every = json.loads(cli("list", "--json").stdout)["recipes"]
    llamacpp = names("LLAMACPP")
    assert llamacpp and set(llamacpp) == {r["name"] for r in every if "llamacpp" in r["name"]}
    both = names("qwen", "llamacpp")
    assert both and set(both) < set(llamacpp) and all("qwen" in n for n in both)
    assert names("ep2") == [r["name"] for r in every if "ep2" in r["tags"] or "ep2" in r["name"]]
    by_description = every[0]["description"].split()[-1]  # a word only its description may hold
    assert every[0]["name"] in names(by_description.upper())
    assert names("qwen", "no-such-word-anywhere") == []
    empty = cli("search", "no-such-word-anywhere")  # like grep: said on stderr, no table, exit 1
    assert (empty.returncode, empty.stdout) == (ExitCode.FAILED, ""), empty
    assert empty.stderr.splitlines() == ["no recipe matches all of: no-such-word-anywhere (`metralectl list` "
                                         "shows every recipe)"], empty.stderr
    table = cli("search", "qwen", "llamacpp")
    assert table.stdout.splitlines()[0].split()[:3] == ["RECIPE", "ENGINE", "MODEL"]
    assert sorted(line.split()[0] for line in table.stdout.splitlines()[1:]) == sorted(both)
    assert cli("search").returncode == ExitCode.USAGE


def test_list_help_describes_the_json_it_prints() -> None:
    help_text = " ".join(cli("list", "--help").stdout.split())
    assert '{"target":' in help_text and '"recipes":' in help_text
    assert set(json.loads(cli("list", "--json").stdout)) == {"target", "recipes"}


def test_info_lists_every_place_and_creates_none(tmp_path: Path) -> None:
    tmp_path = tmp_path / "places"  # (the suite's own isolation lives beside it)
    tmp_path.mkdir()
    env = {"METRALECTL_CONFIG_DIR": str(tmp_path / "cfg"), "METRALE_HOME": str(tmp_path / "home"),
           "METRALECTL_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    out = cli("info", "--json", env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    where = {p["name"]: p for p in data["paths"]}
    assert where["state"]["path"] == str(tmp_path / "home" / "state")
    assert where["bench records"]["path"] == str(tmp_path / "home" / "runs")
    assert where["agent"]["path"] == str(tmp_path / "cfg" / "agent")
    assert where["hf cache"]["path"] == str(tmp_path / "hub") and where["cache"]["env"] == "METRALECTL_CACHE_DIR"
    assert {"config", "logs", "identity", "peers"} <= set(where)
    assert not any(p["exists"] for p in data["paths"] if p["path"].startswith(str(tmp_path)))
    assert list(tmp_path.iterdir()) == [], "asking where things are created nothing"
    assert cli("paths", "--json", env=env).stdout == out.stdout
    text = cli("info", env=env)
    assert "(not yet)" in text.stdout and str(tmp_path / "home" / "runs") in text.stdout


@pytest.fixture()
def on_path(tmp_path: Path) -> dict[str, str]:
    """A `metralectl` on PATH that runs this tree (the scripts call the program by name on each TAB)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "metralectl"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m metralectl "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}


def shell(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed here")
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_bash_sources_the_script_and_completes(on_path: dict[str, str]) -> None:
    script = ('set -eu; source <(metralectl completion bash); '
              'COMP_WORDS=(metralectl sea); COMP_CWORD=1; _metralectl_completion metralectl; echo "[${COMPREPLY[*]}]"; '
              'COMP_WORDS=(metralectl bench hi); COMP_CWORD=2; _metralectl_completion metralectl; echo "[${COMPREPLY[*]}]"; '
              'COMP_WORDS=(metralectl run qwen3.5-35b-a3b-l); COMP_CWORD=2; _metralectl_completion metralectl; '
              'echo "[${COMPREPLY[*]}]"; '
              'COMP_WORDS=(metralectl show gemma-4-3); COMP_CWORD=2; _metralectl_completion metralectl; echo "[${COMPREPLY[*]}]"')
    out = shell(["bash", "-c", script], on_path)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    # commands, sub-commands, and recipe names wherever a command takes a RECIPE
    assert out.stdout.splitlines() == ["[search]", "[history]", "[qwen3.5-35b-a3b-llamacpp]",
                                       "[gemma-4-31b gemma-4-31b-llamacpp]"]


def test_zsh_sources_the_script_and_its_handler_answers(on_path: dict[str, str]) -> None:
    script = ('autoload -U compinit && compinit -u && source <(metralectl completion zsh) && '
              'print -r -- ${+functions[_metralectl_completion]} ${_comps[metralectl]} && '
              '_TYPER_COMPLETE_ARGS="metralectl sea" _METRALECTL_COMPLETE=complete_zsh metralectl')
    out = shell(["zsh", "-f", "-c", script], on_path)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    first, answer = out.stdout.splitlines()
    assert first == "1 _metralectl_completion"  # the function is defined and registered for metralectl
    assert answer.startswith("_arguments") and '"search":' in answer and '"list"' not in answer


def test_fish_sources_the_script_and_completes(on_path: dict[str, str]) -> None:
    out = shell(["fish", "--no-config", "-c", "metralectl completion fish | source; complete -C 'metralectl sea'; "
                 "complete -C 'metralectl bench hi'"], on_path)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == ["search", "history"]


def test_completion_refuses_an_unknown_shell() -> None:
    out = cli("completion", "tcsh")
    assert out.returncode == ExitCode.USAGE and "bash, zsh, fish" in out.stderr and out.stdout == ""


# Commands whose output is already a document in its own format, or a screen: no JSON form.
NO_JSON = {("logs",): "the engine's own log text", ("tui",): "a screen", ("completion",): "a shell script",
           ("bench", "export"): "CSV/JSONL by --csv", ("agent", "logs"): "the agent's own log text",
           ("export", "kube"): "YAML manifests", ("export", "compose"): "a YAML Compose file"}


def _leaf_commands() -> list[tuple[tuple[str, ...], set[str]]]:
    import click

    from metralectl.cli.main import build_command

    found: list[tuple[tuple[str, ...], set[str]]] = []

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
        else:
            found.append((path, {o for p in command.params for o in getattr(p, "opts", [])}))

    walk(build_command(), ())
    return found


def test_every_command_that_prints_data_has_json() -> None:
    leaves = _leaf_commands()
    assert len(leaves) > 30
    missing = [" ".join(path) for path, opts in leaves if "--json" not in opts and path not in NO_JSON]
    assert not missing, f"commands without --json: {missing}"


def test_version_json_names_the_distribution() -> None:
    out = cli("version", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"command": "metralectl", "version": cli("--version").stdout.split()[-1],
                                      "distribution": "metralectl-cockpit"}  # fmt: skip


def test_agent_url_json_without_an_agent() -> None:
    out = cli("agent", "url", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["agent_recorded"] is False and data["url"].startswith("http://127.0.0.1:")
    assert "no running agent recorded" in out.stderr


def test_peer_bench_config_json_is_the_yaml_keys() -> None:
    shown_yaml = cli("peer", "bench-config")
    out = cli("peer", "bench-config", "--json")
    assert out.returncode == 0 and shown_yaml.returncode == 0, out.stderr
    import yaml

    assert json.loads(out.stdout) == json.loads(json.dumps(yaml.safe_load(shown_yaml.stdout), default=str))


def test_peer_revoke_json_of_an_unknown_peer_is_an_error_not_json() -> None:
    out = cli("peer", "revoke", "--json", "SHA256:" + "A" * 43)
    assert out.returncode != 0 and out.stdout == "", out.stdout
    assert "Traceback" not in out.stderr
