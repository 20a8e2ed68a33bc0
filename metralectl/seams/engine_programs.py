"""Where a host-process engine's program is (`runtime: process`): the user's engines.yaml, else PATH.

The engine file names the program (`process: {executable: llama-server}`, or a module's `interpreter:`);
`<config dir>/engines.yaml` may name another one for an engine, by the engine's name:

    llama-cpp:
      executable: /opt/llama.cpp/build/bin/llama-server
    some-python-engine:
      interpreter: ~/venvs/engine/bin/python

A bare name is looked up on PATH as the shell would; a path must be absolute (`~` expanded). The answer is an
absolute path to an executable regular file, or ProgramMissing saying where it looked and how to fix it. The
file is read capped (filecap) and checked like a recipe: an unknown engine or key is refused with its line.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from metralectl import paths
from metralectl.errors import ExitCode, MetralError, RecipeInvalid
from metralectl.safetext import clean

if TYPE_CHECKING:
    from metralectl.core.engine_profile import ProcessStart

CONFIG_FILE = "engines.yaml"
KEYS = ("executable", "interpreter")


class ProgramMissing(MetralError):
    """The engine's program is not on this machine (or not where engines.yaml says): nothing can start."""

    exit_code = ExitCode.UNAVAILABLE


@dataclass(frozen=True)
class Program:
    path: str  # absolute, executable
    how: str  # where it was found: "PATH" or "<config>/engines.yaml (llama-cpp.executable)"


def config_path() -> Path:
    return paths.config_dir() / CONFIG_FILE


def configured(engine: str, known: tuple[str, ...] = ()) -> dict[str, str]:
    """engines.yaml's keys for one engine ({} when the file or the engine's entry is absent). `known`: the
    catalog's engine names, so a misspelt one is refused with a suggestion rather than silently unused."""
    from metralectl.core.schema import Checker, did_you_mean
    from metralectl.core.yamlsrc import YamlSyntax, load_file

    path = config_path()
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        doc = load_file(path, paths.display(path))
    except YamlSyntax as exc:
        raise RecipeInvalid([exc.problem]) from None
    check = Checker(doc)
    top = check.mapping(doc.data if doc.data is not None else {}, (), CONFIG_FILE)
    for name, body in top.items():
        if known and name not in known:
            guess = did_you_mean(str(name), known)
            check.error((name,), f"unknown engine {name!r}",
                        f"did you mean `{guess}`?" if guess else f"engines: {', '.join(known)}")
            continue
        entry = check.mapping(body, (name,), f"the {name} entry")
        check.known_keys(entry, (name,), KEYS, f"the {name} entry")
        for key, value in entry.items():
            if not isinstance(value, str) or not value.strip() or not value.isprintable():
                check.error((name, key), f"{key} must be a program name or a path, not {value!r}")
    if not check.ok:
        raise RecipeInvalid(check.problems)
    mine = top.get(engine)
    return {str(k): str(v) for k, v in mine.items()} if isinstance(mine, dict) else {}


def locate(engine: str, start: ProcessStart, known: tuple[str, ...] = ()) -> Program:
    """The absolute path of the program that starts `engine` as a host process (its executable, or a module's
    interpreter): engines.yaml's `<engine>.<executable|interpreter>` when set, else the engine file's name on PATH."""
    key = start.config_key
    given = configured(engine, known).get(key)
    config = paths.display(config_path())
    if given is not None:
        found = _resolve(given)
        if found is None:
            raise ProgramMissing(
                f"{engine}: {config} names {key} {clean(given)!r}, which is not an executable file"
                + ("" if "/" in given else f" on PATH ({_path_shown()})"),
                f"fix `{engine}: {{{key}: /absolute/path}}` in {config}, or remove it to use "
                f"`{start.program}` from PATH")
        return Program(found, f"{config} ({engine}.{key})")
    found = _resolve(start.program)
    if found is None:
        raise ProgramMissing(
            f"{engine}: `{start.program}` is not on PATH ({_path_shown()}) and {config} names no {engine}.{key}",
            f"install it, or name it in {config}: `{engine}: {{{key}: /absolute/path/to/{Path(start.program).name}}}`")
    return Program(found, "PATH")


def _resolve(name: str) -> str | None:
    """An absolute path to an executable regular file, or None. A bare name goes through PATH."""
    if "/" not in name:
        found = shutil.which(name)
        return os.path.abspath(found) if found else None
    path = os.path.expanduser(name)
    if not os.path.isabs(path):
        return None  # relative to what? the engine starts in its own directory
    try:
        st = os.stat(path)
    except OSError:
        return None
    return path if stat.S_ISREG(st.st_mode) and os.access(path, os.X_OK) else None


def _path_shown() -> str:
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    shown = ", ".join(clean(d, 120) for d in dirs[:8]) + (f", … ({len(dirs)} in all)" if len(dirs) > 8 else "")
    return shown if dirs else "PATH is empty"
