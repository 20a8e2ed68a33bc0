"""The local API's gate: loopback Host allow-list, same-origin only, a bearer token for every change.

Threats (docs/agent.md): a web page in the operator's browser (cross-site requests, DNS rebinding:
evil.example resolving to 127.0.0.1), and other local users (loopback is open to every user on the
box). Defences, checked in this order on every request:

1. Host must be exactly 127.0.0.1:PORT, localhost:PORT or [::1]:PORT. A rebinding page's requests
   carry Host: evil.example:PORT and are refused (421); so are requests without a Host. A repeated
   Host (or Origin, Authorization, Sec-Fetch-Site) never reaches this check: the server answers 400
   first (seams/httpserve.Handler.parse_request), so only one value is ever judged.
2. A request carrying Origin must come from the page's own origin (http:// + its Host); "null" and
   any other origin are refused (403). Sec-Fetch-Site cross-site/same-site (another port of
   localhost is same-site but not same-origin) is refused too. No Access-Control-* header is ever
   sent, and OPTIONS is not allowed: no preflight can succeed.
3. Every state-changing method needs `Authorization: Bearer <token>`, the token being the contents
   of `<config>/agent/token` (0600, created atomically), compared with hmac.compare_digest. Other
   users cannot read the file, so they cannot act; a cross-site page cannot read it either.
4. GET and HEAD never change anything (the router only maps them to read-only handlers).
5. The token goes only to a proven agent: GET /api/agent?challenge=N answers an HMAC of the challenge
   and the port keyed by the token (agent_files.agent_proof), which the CLI checks before it sends the
   token (app/agent_client.AgentClient.verify).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from metralectl.peers.protocol import Headers
from metralectl.seams.agent_files import DEFAULT_API_PORT, agent_dir, load_or_create_token, token_path  # noqa: F401  (re-exported)

SAFE_METHODS = frozenset({"GET", "HEAD"})
CHANGING_METHODS = frozenset({"POST"})


@dataclass(frozen=True)
class Denied:
    status: int
    reason: str


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
