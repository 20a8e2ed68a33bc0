"""A recipe's spec for this machine: core/render.py's, with a host process's program found here first.

A container's spec needs nothing of the machine; a `runtime: process` one starts with the absolute path of
its program (seams/engine_programs.py: the user's engines.yaml, else PATH), found when the spec is made, so
what `run --print` shows and what `run` starts are the same argv. Every launch, swap, repair, plan and `show`
renders through here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metralectl.core.render import ContainerSpec, spec_for

if TYPE_CHECKING:
    from metralectl.core.catalog import Catalog
    from metralectl.core.recipe import Recipe
    from metralectl.seams.engine_programs import Program


def program_of(catalog: Catalog, recipe: Recipe) -> Program:
    """Where this machine has the program of a `runtime: process` recipe's engine (ProgramMissing: where it
    looked, and the fix)."""
    from metralectl.errors import MetralError
    from metralectl.seams.engine_programs import locate

    contract = catalog.engines[recipe.engine]
    if contract.process is None:  # the checker refuses this; a catalog built before the engine file changed
        raise MetralError(f"{recipe.name}: the {contract.display_name} engine file does not say how to start it as "
                          "a host process",
                          f"add a `process:` section to engine/{contract.name}.yaml (docs/engines.md)")
    return locate(contract.name, contract.process, tuple(catalog.engines))


def spec_here(catalog: Catalog, recipe: Recipe, **options: Any) -> ContainerSpec:
    """spec_for(), with the program of a host-process recipe located on this machine, and engine auth decided
    here (gateway keys exist and the engine takes a token file: lifecycle/engine_token.py)."""
    from metralectl.lifecycle.engine_token import token_path_for

    if recipe.runtime == "process" and "program" not in options:
        options["program"] = program_of(catalog, recipe).path
    if "engine_token" not in options:
        options["engine_token"] = token_path_for(recipe, catalog.engines[recipe.engine])
    return spec_for(catalog, recipe, **options)


def engine_environment(spec: ContainerSpec) -> dict[str, str]:
    """Every variable a host process of `spec` gets, as the host-process runtime builds it: its fixed allow-list
    from this environment (PATH, HOME, LANG, ...), then exactly the spec's."""
    from metralectl.seams.process.state import engine_environment as built

    return built(spec.engine_env)


def command_text(spec: ContainerSpec) -> str:
    """The exact start of `spec` as a shell line: its `docker run`, or for a host process `env -i` with every
    variable it gets, then its argv (what `run --print`, `show` and the dashboard's plan show)."""
    from metralectl.core.engine_config import files_text
    from metralectl.core.render import _shell_path, docker_run_command, process_command

    from metralectl.core.labels import LABEL_ENGINE_AUTH

    start = process_command(spec, engine_environment(spec)) if spec.is_process else docker_run_command(spec)
    token = ""
    if LABEL_ENGINE_AUTH in spec.labels:  # its path only, never the token: `run` makes the file when missing
        from metralectl.lifecycle.engine_token import token_path

        token = (f"# {_shell_path(str(token_path()))}: metralectl's engine token, made by `metralectl run` "
                 "(`metralectl gateway keys engine-token` prints it)\n")
    return files_text(spec.files, _shell_path) + token + start


def write_spec_files(spec: ContainerSpec) -> None:
    """Write the files a spec's engine reads (its generated config) where the spec says, just before it starts:
    inside the state dir's engine-config/ only, atomically, 0644 (the engine in the container may run as another
    user), never through a symlink (ownedfs: a link on the way is refused, not followed out). An engine that asks
    metralectl's engine token gets it made here when missing (lifecycle/engine_token.py)."""
    from pathlib import Path

    from metralectl.core.engine_config import CONFIG_DIR
    from metralectl.core.labels import LABEL_ENGINE_AUTH
    from metralectl.lifecycle import engine_token
    from metralectl.ownedfs import Owned

    if LABEL_ENGINE_AUTH in spec.labels:
        engine_token.ensure()

    for file in spec.files:
        path = Path(file.host_path)
        owned = Owned(path.parent.parent, "metralectl's state directory")
        owned.make_root()
        owned.put(f"{CONFIG_DIR}/{path.name}", file.text, mode=0o644)
