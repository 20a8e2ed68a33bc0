"""How an engine is handed metralectl's own engine token as a file (`token-file:` in engine/<name>.yaml).

With gateway keys configured, the engines behind the gateway ask for a token too, so that reaching an engine's
port does not bypass the keys (docs/gateway.md, "Engines behind the gateway"). Only a *file* is used: a token
on the command line shows in `ps` and `docker inspect`. The section names the serve flags that turn it on, one
of them valued `{file}` (the path the engine reads), each a declared flag of the engine (so checked against its
pinned option dump like every other flag), and where a container gets the file mounted read-only. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from metralectl.core.engine_flags import FlagSpec
from metralectl.core.schema import Checker

FILE_WORD = "{file}"
_KEYS = ("flags", "container-path", "source")


@dataclass(frozen=True)
class TokenFile:
    flags: tuple[tuple[str, Any], ...]  # (flag, value) in order; one value is FILE_WORD
    container_path: str  # where a container gets the file, read-only
    source: str = ""

    def flag_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.flags)

    def words(self, flags: dict[str, FlagSpec], path: str) -> list[str]:
        """The serve words that hand the engine the token file at `path`."""
        out: list[str] = []
        for name, value in self.flags:
            out += flags[name].render_value(path if value == FILE_WORD else value)
        return out


def parse_token_file(check: Checker, raw: Any, flags: dict[str, FlagSpec]) -> TokenFile | None:
    if raw is None:
        return None
    where = ("token-file",)
    body = check.mapping(raw, where, "token-file")
    check.known_keys(body, where, _KEYS, "token-file")
    pairs = check.mapping(body.get("flags", {}), where + ("flags",), "token-file flags")
    out: list[tuple[str, Any]] = []
    for name, value in pairs.items():
        spec = flags.get(str(name))
        if spec is None:
            check.error(where + ("flags", name), f"names {name!r}, which is not a flag of this engine")
            continue
        if value == FILE_WORD:
            if spec.type not in ("path", "string"):
                check.error(where + ("flags", name), f"--{name} takes no path (it is a {spec.type})")
        else:
            problem = spec.check_value(value)
            if problem:
                check.error(where + ("flags", name), f"--{name} {problem}")
        out.append((spec.name, value))
    if sum(1 for _, value in out if value == FILE_WORD) != 1:
        check.error(where + ("flags",), f"exactly one flag must be valued {FILE_WORD!r} (the token file's path)")
    target = str(body.get("container-path", ""))
    if not target.startswith("/"):
        check.error(where + ("container-path",), f"must be an absolute path in the container, not {target!r}")
    return TokenFile(tuple(out), target, str(body.get("source", "")))
