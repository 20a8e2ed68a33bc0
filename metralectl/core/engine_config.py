"""An engine's generated config file: a recipe's `engine-config:` section written as the YAML file the engine reads.

TensorRT-LLM takes its LLM-API options beyond the command line from a YAML file (`--extra_llm_api_options PATH`).
An engine file that says so has a `config-file:` section: the serve flag that names the file, where it is mounted
read-only in the container, and the keys metralectl knows (top-level keys, each with the keys it knows beneath).
A recipe's `engine-config:` is checked against those keys (core/checker_engine_config.py), rendered here into the
spec (core/render.py: the file's text, its host path under the state dir, the mount and the flag), and written by
the launch just before the container starts (lifecycle/specs.py write_spec_files), atomically, 0644, never through
a symlink. Pure: nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.core.schema import Checker, type_name

_KEYS = ("flag", "container-path", "keys", "owned", "source")
CONFIG_DIR = "engine-config"  # under the state dir (~/.metrale/state): a directory metralectl owns


@dataclass(frozen=True)
class ConfigFile:
    flag: str  # the serve flag that names the file (TensorRT-LLM's extra_llm_api_options)
    container_path: str  # where the file is mounted read-only inside the container
    keys: dict[str, tuple[str, ...] | None] = field(default_factory=dict)  # key -> its known sub-keys (None: a value)
    owned: dict[str, str] = field(default_factory=dict)  # "a.b" -> the recipe key that sets it instead
    source: str = ""


@dataclass(frozen=True)
class GeneratedFile:
    """A file the launch writes before the engine starts: where on this host, and its whole text."""

    host_path: str
    text: str


def parse_config_file(check: Checker, raw: Any, flags: dict[str, Any]) -> ConfigFile | None:
    if raw is None:
        return None
    body = check.mapping(raw, ("config-file",), "config-file")
    check.known_keys(body, ("config-file",), _KEYS, "config-file")
    flag = str(body.get("flag", ""))
    if flag not in flags:
        check.error(("config-file", "flag"), f"names {flag!r}, which is not a flag of this engine")
    target = str(body.get("container-path", ""))
    if not target.startswith("/"):
        check.error(("config-file", "container-path"), f"must be an absolute path in the container, not {target!r}")
    keys: dict[str, tuple[str, ...] | None] = {}
    for key, sub in check.mapping(body.get("keys", {}), ("config-file", "keys"), "config-file keys").items():
        if sub is not None and not (isinstance(sub, list) and all(isinstance(s, str) for s in sub)):
            check.error(("config-file", "keys", key), f"a key's known sub-keys are a list of names, not {type_name(sub)}")
            continue
        keys[str(key)] = None if sub is None else tuple(sub)
    owned = {str(k): str(v) for k, v in check.mapping(body.get("owned", {}), ("config-file", "owned"),
                                                        "config-file owned").items()}
    return ConfigFile(flag, target, keys, owned, str(body.get("source", "")))


def host_path(recipe_name: str) -> Path:
    """Where the launch writes a recipe's generated file: the state dir's engine-config/, one file a recipe."""
    return paths.metrale_home() / "state" / CONFIG_DIR / f"{recipe_name}.yaml"


def render_text(recipe_name: str, engine: str, values: dict[str, Any]) -> str:
    import yaml  # lazy: only a launch of such a recipe renders one

    head = f"# Written by metralectl from recipe {recipe_name}'s `engine-config:` for {engine}; rewritten at each launch.\n"
    body: str = yaml.safe_dump(values, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return head + body


def generated(recipe_name: str, engine: str, config: ConfigFile | None, values: dict[str, Any],
              process: bool) -> tuple[GeneratedFile, list[str], str] | None:
    """The file, the serve words that name it and the container path it is mounted at ("" for a host process,
    which reads it where it is written); None when the recipe has no engine-config."""
    if config is None or not values:
        return None
    path = str(host_path(recipe_name))
    file = GeneratedFile(path, render_text(recipe_name, engine, values))
    target = path if process else config.container_path
    return file, [f"--{config.flag}", target], "" if process else config.container_path


def files_text(files: tuple[GeneratedFile, ...], shell_path: Any) -> str:
    """The shell lines that write each file as the launch does (copy-pasteable before the `docker run`)."""
    lines = []
    for file in files:
        where = shell_path(file.host_path)
        parent = shell_path(str(Path(file.host_path).parent))
        lines.append(f"mkdir -p {parent} && cat > {where} <<'METRALECTL_EOF'\n{file.text}METRALECTL_EOF\n")
    return "".join(lines)
