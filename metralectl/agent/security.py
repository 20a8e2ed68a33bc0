"""The local API's gate: loopback Host allow-list, same-origin only, a bearer token for every change.

Threats (docs/agent.md): a web page in the operator's browser (cross-site requests, DNS rebinding:
evil.example resolving to 127.0.0.1), and other local users (loopback is open to every user on the
box). Defences, checked in this order on every request:

1. Host must be exactly 127.0.0.1:PORT, localhost:PORT or [::1]:PORT. A rebinding page's requests
   carry Host: evil.example:PORT and are refused (421); so are requests without a Host.
2. A request carrying Origin must come from the page's own origin (http:// + its Host); "null" and
   any other origin are refused (403). Sec-Fetch-Site cross-site/same-site (another port of
   localhost is same-site but not same-origin) is refused too. No Access-Control-* header is ever
   sent, and OPTIONS is not allowed: no preflight can succeed.
3. Every state-changing method needs `Authorization: Bearer <token>`, the token being the contents
   of `<config>/agent/token` (0600, created atomically), compared with hmac.compare_digest. Other
   users cannot read the file, so they cannot act; a cross-site page cannot read it either.
4. GET and HEAD never change anything (the router only maps them to read-only handlers).
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from metralectl import paths
from metralectl.errors import MetralError
from metralectl.peers.protocol import Headers

SAFE_METHODS = frozenset({"GET", "HEAD"})
CHANGING_METHODS = frozenset({"POST"})
DEFAULT_API_PORT = 8897


@dataclass(frozen=True)
class Denied:
    status: int
    reason: str


def agent_dir(base: Path | None = None) -> Path:
    return (base if base is not None else paths.config_dir()) / "agent"


def token_path(base: Path | None = None) -> Path:
    return agent_dir(base) / "token"


def load_or_create_token(base: Path | None = None) -> str:
    """The API token (43 url-safe characters), created 0600 on first use; a looser file is refused."""
    from metralectl.identity import create_exclusive

    path = token_path(base)
    if not os.path.lexists(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        create_exclusive(path, (secrets.token_urlsafe(32) + "\n").encode(), 0o600)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or mode & 0o077:
            raise MetralError(f"refusing the agent token {paths.display(path)}: mode {mode:04o} or owner is unsafe",
                              f"chmod 600 {paths.display(path)} (or delete it: a new token is made)")
        token = os.read(fd, 256).decode("ascii", errors="replace").strip()
    finally:
        os.close(fd)
    if len(token) < 32:
        raise MetralError(f"the agent token in {paths.display(path)} is too short", "delete it: a new token is made")
    return token


def allowed_hosts(port: int) -> frozenset[str]:
    return frozenset({f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"})


def check(method: str, headers: Headers, *, port: int, token: str) -> Denied | None:
    """None when the request may proceed to the router; else the refusal."""
    host = (headers.get("Host") or "").strip()
    if not host:
        return Denied(421, "a Host header is required")
    if host not in allowed_hosts(port):
        return Denied(421, f"Host {host!r} is not this agent (use http://127.0.0.1:{port}/)")
    origin = headers.get("Origin")
    if origin is not None and origin.strip() != f"http://{host}":
        return Denied(403, f"cross-origin request from {origin.strip()!r} refused")
    site = (headers.get("Sec-Fetch-Site") or "").strip().lower()
    if site in ("cross-site", "same-site"):
        return Denied(403, f"cross-origin request refused (Sec-Fetch-Site: {site})")
    if method in SAFE_METHODS:
        return None
    if method not in CHANGING_METHODS:
        return Denied(405, f"method {method} not allowed")
    auth = headers.get("Authorization") or ""
    scheme, _, given = auth.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return Denied(401, "a bearer token is required (`metralectl agent url` prints the page's address with it)")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return Denied(401, "wrong token")
    return None
