"""Who may use the gateway, and which models (docs/gateway.md, "Keys"): the client's bearer key against the key
file's hashes, and the key's models against the model a request names (its recipe and served ids included)."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metralectl.core.gateway_keys import ApiKey, KeyWatch
    from metralectl.gateway.routes import Route


class Unauthorized(Exception):
    """No valid key where one is needed: answered 401."""


def authorize(keys: KeyWatch | None, require_key: bool, header: str | None,
              monitor: str | None = None) -> ApiKey | None:
    """The client's key when keys are in force; None when they are not (no key configured, loopback only), or when
    the header carries `monitor` (the gateway's own credential for its /metrics, in its 0600 state record)."""
    ring = keys.ring if keys is not None else None
    if not ring and not require_key:
        return None
    if monitor and hmac.compare_digest((header or "").encode(), f"Bearer {monitor}".encode()):
        return None
    if not ring:
        raise Unauthorized("the gateway listens beyond loopback and no API key is configured")
    scheme, _, token = (header or "").partition(" ")
    key = ring.check(token.strip()) if scheme.lower() == "bearer" else None
    if key is None:
        raise Unauthorized("a valid API key is needed: `Authorization: Bearer mk-...` "
                           "(`metralectl gateway keys add NAME --model M` makes one)")
    return key


def may_use(key: ApiKey | None, model: str, route: Route | None) -> bool:
    """Whether `key` may use `model` (named as asked, or by the recipe or ids of the engine serving it)."""
    if key is None or key.allows(model):
        return True
    return route is not None and key.allows(route.recipe, *route.names)
