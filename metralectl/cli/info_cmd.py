"""`info` (alias `paths`): where metralectl keeps its files, and whether each exists yet.

Asking creates nothing: the places are computed the way the code that writes them computes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from metralectl import __version__, paths


def places() -> list[dict[str, Any]]:
    """(what, path, the environment variable that moves it) for every place metralectl reads or writes."""
    from metralectl.bench.records import runs_root
    from metralectl.seams.agent_files import agent_dir

    home = paths.metrale_home()
    config = paths.config_dir()
    rows = [
        ("config", config, "METRALECTL_CONFIG_DIR", "your recipes, identity, peers, sync source"),
        ("user recipes", paths.user_data_dir("recipes"), "METRALECTL_CONFIG_DIR", "recipes that add to or override shipped ones"),
        ("identity", config / "identity", "METRALECTL_CONFIG_DIR", "this node's signing key"),
        ("peers", config / "peers", "METRALECTL_CONFIG_DIR", "nodes this box trusts"),
        ("agent", agent_dir(), "METRALECTL_CONFIG_DIR", "the agent's API token and where it listens"),
        ("home", home, "METRALE_HOME", "run state, logs, bench records"),
        ("state", home / "state", "METRALE_HOME", "what is served, last swap, the lifecycle lock"),
        ("logs", home / "logs", "METRALE_HOME", "launch and swap logs"),
        ("bench records", runs_root(), "METRALE_HOME", "signed benchmark runs"),
        ("campaigns", home / "campaigns", "METRALE_HOME", "benchmark campaigns"),
        ("cache", paths.cache_dir(), "METRALECTL_CACHE_DIR", "derived files (catalog, list, help); safe to delete"),
        ("hf cache", paths.hf_hub_cache(), "HF_HUB_CACHE / HF_HOME", "model weights (shared with the engine)"),
        ("shipped data", paths.data_root(), "", "recipes, engine facts, kernels, images shipped with metralectl"),
    ]
    return [{"name": name, "path": str(path), "exists": Path(path).exists(), "env": env, "holds": holds}
            for name, path, env, holds in rows]


def info(as_json: bool = typer.Option(False, "--json", help='Print JSON: {"version": "...", "paths": [{"name", '
                                                            '"path", "exists", "env", "holds"}, ...]}.')) -> None:
    """Show where metralectl keeps config, state, logs, bench records, caches and the HF cache (alias: paths)."""
    found = places()
    if as_json:
        print(json.dumps({"version": __version__, "paths": found}, indent=2))
        return
    from metralectl.present.table import render_table

    rows = [[p["name"], paths.display(Path(p["path"])) + ("" if p["exists"] else "  (not yet)"), p["env"] or "-"]
            for p in found]
    print(f"metralectl {__version__}")
    print(render_table(["WHAT", "WHERE", "MOVED BY"], rows))


def register(app: typer.Typer) -> None:
    app.command("info")(info)
    app.command("paths", hidden=True, help="Same as `info`.")(info)
