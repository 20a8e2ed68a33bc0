"""metralectl's own engine token: what the engines behind the gateway ask for once gateway keys exist.

The gateway keys file keeps only hashes, which no engine can check, so metralectl hands the engines a token of
its own (docs/gateway.md, "Engines behind the gateway"): one random token, made on first need, in the state
dir's engine-auth/ (0700; the file 0644, since a container's engine may run as another uid and gets the file
bind-mounted read-only), never written or read through a symlink (ownedfs), and read back only when it matches
its grammar exactly (it goes into an Authorization header: a CR or LF would add headers).

Whether a launch turns it on is decided here (`token_path_for`), by the launch layer, and handed to the pure
render as the file's path; whoever talks to a served engine directly builds its headers with
`engine_headers(labels)`, from the label the render set.
"""

from __future__ import annotations

import errno
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from metralectl import paths
from metralectl.core.labels import ENGINE_AUTH_TOKEN, LABEL_ENGINE_AUTH, LABEL_OWNER, owner
from metralectl.errors import ExitCode, MetralError
from metralectl.ownedfs import Owned

if TYPE_CHECKING:
    from metralectl.core.contract import EngineContract
    from metralectl.core.recipe import Recipe

DIR = "engine-auth"
FILE = "token"
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
_LIMIT = 256


class EngineTokenError(MetralError):
    exit_code = ExitCode.DATA


def _owned() -> Owned:
    return Owned(paths.metrale_home() / "state", "metralectl's state directory")


def token_path() -> Path:
    return _owned().path(f"{DIR}/{FILE}")


def token_path_for(recipe: Recipe, contract: EngineContract, *, keys_present: bool | None = None) -> str | None:
    """The token file's host path when this launch turns engine auth on, else None: gateway keys exist (clients
    must show a key anyway), the engine takes a token file, and the recipe sets none of its auth flags itself."""
    if contract.token_file is None:
        return None
    own = set(contract.auth_flags) | set(contract.token_file.flag_names())
    if any(rank.serve.get(flag) not in (None, False) for rank in recipe.resources.ranks for flag in own):
        return None
    if keys_present is None:
        from metralectl.core.gateway_keys import load

        keys_present = bool(load())
    return str(token_path()) if keys_present else None


def ensure() -> Path:
    """The token file, made when missing (0644 in a 0700 directory); its token checked."""
    owned = _owned()
    owned.make_root()
    owned.make_dirs(DIR, mode=0o700)
    owned.chmod(DIR, 0o700)
    if owned.lstat(f"{DIR}/{FILE}") is None:
        owned.put(f"{DIR}/{FILE}", secrets.token_urlsafe(32) + "\n", mode=0o644)
    read()
    return owned.path(f"{DIR}/{FILE}")


def read() -> str:
    """The token, read with O_NOFOLLOW all the way; one that is not exactly its grammar is refused."""
    owned = _owned()
    where = owned.path(f"{DIR}/{FILE}")
    fix = f"remove {paths.display(where)} and restart the engines that ask it (the next launch makes a new one)"
    try:
        raw = owned.read_bytes(f"{DIR}/{FILE}", _LIMIT)
    except FileNotFoundError:
        raise EngineTokenError(f"metralectl's engine token ({paths.display(where)}) is missing",
                               "restart the engine (`metralectl run RECIPE --replace`): a launch makes it") from None
    except MetralError as exc:  # a link on the way, not a regular file, too long
        raise EngineTokenError(f"metralectl's engine token: {exc.message}", fix) from None
    except OSError as exc:  # ELOOP: the file itself is a symlink (O_NOFOLLOW); EACCES
        why = "a symlink, not followed" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise EngineTokenError(f"metralectl's engine token ({paths.display(where)}) cannot be read: {why}",
                               fix) from None
    text = raw.decode("ascii", "replace").removesuffix("\n")
    if not TOKEN_RE.fullmatch(text):
        raise EngineTokenError(f"{paths.display(where)} is not metralectl's engine token (43 URL-safe characters "
                               "and a newline)", fix)
    return text


def engine_headers(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The headers a direct request to a served engine carries: the token when its labels say it asks one. Only
    an engine of this user's is sent it (`top` and the gateway see every owner's engines on a shared daemon)."""
    if not labels or labels.get(LABEL_ENGINE_AUTH) != ENGINE_AUTH_TOKEN or labels.get(LABEL_OWNER) != owner():
        return {}
    return {"Authorization": f"Bearer {read()}"}
