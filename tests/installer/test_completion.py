"""install.sh's shell completion step: the script from the installed command, where the login shell
loads it by itself (bash-completion's and fish's user directories; .zshrc for zsh), proved by the
real bash, zsh and fish completing a word; nothing half-written when the command fails; --uninstall
takes back exactly what it made."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.installer.test_functions import MARKER, sh  # noqa: F401  (the fixture)
from tests.unit.recipe_helpers import REPO

STEP = 'VERSION=9.9; RECEIPT="$HOME/receipt"; : >"$RECEIPT"; BIN_LINK="$HOME/bin/metralectl"; setup_completion'


def installed_cli(sh, works: bool = True) -> Path:  # noqa: F811
    """The `metralectl` the install would have linked: this tree's, or one that fails."""
    bin_dir = sh.home / "bin"
    bin_dir.mkdir(exist_ok=True)
    cli = bin_dir / "metralectl"
    body = f'PYTHONPATH={REPO} exec {sys.executable} -m metralectl "$@"\n' if works else "echo broken >&2; exit 1\n"
    cli.write_text("#!/bin/sh\n" + body)
    cli.chmod(0o755)
    return bin_dir


def user_shell(sh, argv: list[str]) -> subprocess.CompletedProcess[str]:  # noqa: F811
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed here")
    env = {"HOME": str(sh.home), "PATH": f"{sh.home / 'bin'}:/usr/bin:/bin"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def receipt(sh) -> str:  # noqa: F811
    return (sh.home / "receipt").read_text()


def test_bash_completion_goes_where_bash_completion_loads_it_and_uninstall_takes_it_back(sh) -> None:  # noqa: F811
    installed_cli(sh)
    (sh.home / ".local/share").mkdir(parents=True)  # as on any desktop or DGX OS account
    done = sh(STEP)
    assert done.returncode == 0, done.stderr
    script = sh.home / ".local/share/bash-completion/completions/metralectl"
    assert f"Shell completion: {script}" in done.stdout
    assert f"completion={script}\n" in receipt(sh) and f"completion_dir={sh.home}/.local/share/bash-completion\n" \
        in receipt(sh)
    out = user_shell(sh, ["bash", "-c", f"source {script}; COMP_WORDS=(metralectl sea); COMP_CWORD=1; "
                                        "_metralectl_completion metralectl; echo \"[${COMPREPLY[*]}]\""])
    assert out.stdout == "[search]\n" and out.stderr == "", out.stderr
    gone = sh('RECEIPT="$HOME/receipt"; uninstall')
    assert gone.returncode == 0, gone.stderr
    assert f"removed {script}" in gone.stdout
    assert not (sh.home / ".local/share/bash-completion").exists(), "the directories it made go with it"
    assert (sh.home / ".local/share").is_dir(), "... and only those"


def test_uninstall_keeps_a_directory_the_user_put_things_in(sh) -> None:  # noqa: F811
    installed_cli(sh)
    sh(STEP)
    theirs = sh.home / ".local/share/bash-completion/completions/other-tool"
    theirs.write_text("complete -F _x other-tool\n")
    sh('RECEIPT="$HOME/receipt"; uninstall')
    assert theirs.exists() and not (theirs.parent / "metralectl").exists()


def test_fish_loads_it_from_its_completions_directory(sh) -> None:  # noqa: F811
    installed_cli(sh)
    done = sh(STEP, env={"SHELL": "/usr/bin/fish"})
    assert done.returncode == 0, done.stderr
    assert (sh.home / ".config/fish/completions/metralectl.fish").is_file()
    out = user_shell(sh, ["fish", "-c", "complete -C 'metralectl sea'"])  # autoloaded: nothing sourced by hand
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == ["search"], out.stderr


def test_zsh_sources_it_from_zshrc_after_compinit_once(sh) -> None:  # noqa: F811
    installed_cli(sh)
    (sh.home / ".zshrc").write_text("autoload -U compinit && compinit -u\n")
    first = sh(STEP, env={"SHELL": "/usr/bin/zsh"})
    second = sh('RECEIPT="$HOME/receipt"; BIN_LINK="$HOME/bin/metralectl"; setup_completion',
                env={"SHELL": "/usr/bin/zsh"})
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    zshrc = (sh.home / ".zshrc").read_text()
    script = sh.home / ".local/share/metralectl/completion/metralectl.zsh"
    assert zshrc.count(MARKER) == 1 and zshrc.startswith("autoload -U compinit && compinit -u\n" + MARKER)
    out = user_shell(sh, ["zsh", "-f", "-c", "source ~/.zshrc; print -r -- ${_comps[metralectl]}"])
    assert out.stdout == "_metralectl_completion\n" and out.stderr == "", out.stderr
    # A .zshrc without compinit: the guarded line does nothing, and says nothing.
    (sh.home / ".zshrc").write_text(zshrc.replace("autoload -U compinit && compinit -u\n", ""))
    bare = user_shell(sh, ["zsh", "-f", "-c", "source ~/.zshrc; print -r -- ok"])
    assert bare.stdout == "ok\n" and bare.stderr == "", bare.stderr
    sh('RECEIPT="$HOME/receipt"; uninstall')
    assert not script.exists() and MARKER not in (sh.home / ".zshrc").read_text()


def test_a_failing_command_writes_nothing_and_the_install_stands(sh) -> None:  # noqa: F811
    installed_cli(sh, works=False)
    done = sh(STEP)
    assert done.returncode == 0
    assert "shell completion not installed" in done.stderr
    assert not (sh.home / ".local/share").exists(), "no file, no directory left behind"
    assert "completion" not in receipt(sh)


@pytest.mark.parametrize("how", [{"METRALECTL_NO_COMPLETION": "1"}, {"ARGS": "--no-completion"}])
def test_no_completion_skips_it(sh, how: dict[str, str]) -> None:  # noqa: F811
    installed_cli(sh)
    env = dict(how)
    args = env.pop("ARGS", "")
    done = sh(f"parse_args {args}; {STEP}", env=env)
    assert "skipped (--no-completion)" in done.stdout and "metralectl completion bash" in done.stdout
    assert not (sh.home / ".local").exists()


def test_other_shells_get_nothing(sh) -> None:  # noqa: F811
    installed_cli(sh)
    done = sh(STEP, env={"SHELL": "/bin/dash"})
    assert done.returncode == 0 and done.stdout == "" and not (sh.home / ".local").exists()
