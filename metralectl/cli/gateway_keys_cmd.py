"""`metralectl gateway keys add|list|rm|engine-token`: the gateway's API keys (docs/gateway.md, "Keys").

A new key is printed once, on stdout (data: `KEY=$(metralectl gateway keys add ci --model qwen3-8b)`); the file
keeps only its SHA-256. A running gateway picks up a change within 50 ms.
"""

from __future__ import annotations

import json
import sys

import typer

from metralectl.cli.state import note

keys_app = typer.Typer(help="The gateway's API keys: each names the models it may use; none means loopback only.",
                       no_args_is_help=True, add_completion=False, rich_markup_mode=None)


@keys_app.command("add")
def add(name: str = typer.Argument(..., help="A name for the key (who or what uses it)."),
        model: list[str] = typer.Option([], "--model", "-m", help="A model the key may use: a recipe name or a served "
                                        "id (repeat for several)."),
        all_models: bool = typer.Option(False, "--all-models", help="The key may use every model."),
        as_json: bool = typer.Option(False, "--json", help="Print the key and its entry as JSON.")) -> None:
    """Make a key for the models named; print it once (only its hash is kept)."""
    from metralectl.errors import UsageError
    from metralectl.core import gateway_keys as keys

    if bool(model) == all_models:
        raise UsageError("name the models the key may use (`--model M`, repeatable) or give `--all-models`",
                         f"for example `metralectl gateway keys add {name} --model qwen3-8b`")
    token, entry = keys.add(name, ("*",) if all_models else tuple(model))
    if as_json:
        print(json.dumps({"key": token, **entry.to_json()}))
    else:
        print(token)
    note(f"key {entry.name} ({entry.prefix}…) may use {', '.join(entry.models) if not all_models else 'every model'}; "
         f"it is shown only now: keep it (clients send `Authorization: Bearer {entry.prefix}…`); saved as its "
         f"hash in {keys.keys_path()}")


@keys_app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The keys: name, prefix, models, when made (never the key: only its hash is kept)."""
    from metralectl.core import gateway_keys as keys
    from metralectl.safetext import clean

    ring = keys.load()
    if as_json:
        print(json.dumps({"keys": [{k: v for k, v in entry.to_json().items() if k != "sha256"}
                                   for entry in ring.keys], "file": str(keys.keys_path())}))
        return
    if not ring:
        note("no API key: the gateway answers loopback clients only (`metralectl gateway keys add NAME --model M`)")
        return
    print(f"{'NAME':<20} {'PREFIX':<12} {'CREATED':<21} MODELS")
    for entry in ring.keys:
        print(f"{clean(entry.name, 64):<20} {clean(entry.prefix, 16):<12} {clean(entry.created, 40):<21} "
              f"{clean(', '.join(entry.models), 2000)}")


@keys_app.command("rm")
def rm(name: str = typer.Argument(..., help="The key's name (`gateway keys list`)."),
       as_json: bool = typer.Option(False, "--json", help="Print the removed key's entry (never the key) as JSON.")) -> None:
    """Remove a key: a running gateway refuses it within 50 ms."""
    from metralectl.core import gateway_keys as keys

    gone = keys.remove(name)
    if as_json:
        print(json.dumps({"removed": {k: v for k, v in gone.to_json().items() if k != "sha256"},
                          "left": len(keys.load().keys)}))
    note(f"removed key {gone.name} ({gone.prefix}…)")
    if not keys.load():
        print("note: no API key is left: a gateway on loopback lets every local client in; one listening beyond "
              "loopback without --allow-remote lets nobody in", file=sys.stderr)


@keys_app.command("engine-token")
def engine_token(as_json: bool = typer.Option(False, "--json", help="Print the token and its file as JSON.")) -> None:
    """Print metralectl's own engine token: with keys, the engines behind the gateway ask it of direct clients."""
    from metralectl.lifecycle import engine_token as token

    value = token.read()
    # stdout is data: `TOKEN=$(metralectl gateway keys engine-token)`
    print(json.dumps({"token": value, "file": str(token.token_path())}) if as_json else value)
    note(f"the engines metralectl starts while gateway keys exist ask it (`Authorization: Bearer …`); it is kept in "
         f"{token.token_path()}: prefer the gateway, with a key of its own, for every client")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
