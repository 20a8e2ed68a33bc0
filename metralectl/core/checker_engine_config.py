"""A recipe's `engine-config:` section: the keys its engine's generated config file knows (core/engine_config.py).

Every key is checked against the engine file's `config-file.keys` (file:line:key, with a suggestion): a key the
engine takes on the command line belongs under `serve:` (the file would silently override the flag), and a key
metralectl sets from another recipe key (`config-file.owned`) is refused with that key named.
"""

from __future__ import annotations

from typing import Any

from metralectl.core.contract import EngineContract
from metralectl.core.schema import Checker, did_you_mean, type_name

SECTION = "engine-config"


def check_engine_config(check: Checker, top: dict[str, Any], contract: EngineContract | None) -> dict[str, Any]:
    raw = top.get(SECTION)
    if raw is None or contract is None:
        return {}
    config = contract.config_file
    if config is None:
        check.error((SECTION,), f"the {contract.display_name} engine reads no generated config file",
                    f"remove `{SECTION}:` (its settings are `serve:` flags)")
        return {}
    body = check.mapping(raw, (SECTION,), SECTION)
    for key, value in body.items():
        where = (SECTION, key)
        if key in contract.flags:
            check.error(where, f"{key} is a {contract.display_name} serve flag, not a config-file key",
                        f"set it as `serve.{key}` (the file would override the flag without saying so)")
        elif key in config.owned:
            check.error(where, f"{key} is set by metralectl from {config.owned[key]}", f"set {config.owned[key]}")
        elif key not in config.keys:
            guess = did_you_mean(str(key), config.keys)
            check.error(where, f"unknown {contract.display_name} config key {key!r}",
                        f"did you mean `{guess}`?" if guess else f"known keys: {', '.join(config.keys)}")
        elif config.keys[key] is not None:
            _sub_keys(check, where, value, config.keys[key] or (), config.owned)
    return dict(body) if check.ok else {}


def _sub_keys(check: Checker, where: tuple[str, ...], value: Any, known: tuple[str, ...],
              owned: dict[str, str]) -> None:
    if not isinstance(value, dict):
        check.error(where, f"{where[-1]} is a mapping of {', '.join(known)}, not {type_name(value)}")
        return
    for sub in value:
        dotted = f"{where[-1]}.{sub}"
        if dotted in owned:
            check.error(where + (sub,), f"{dotted} is set by metralectl from {owned[dotted]}", f"set {owned[dotted]}")
        elif sub not in known:
            guess = did_you_mean(str(sub), known)
            check.error(where + (sub,), f"unknown key {sub!r} in {where[-1]}",
                        f"did you mean `{guess}`?" if guess else f"known keys: {', '.join(known)}")
