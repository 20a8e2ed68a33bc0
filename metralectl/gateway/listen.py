"""The gateway's address: HOST:PORT checked, a non-loopback one only with API keys or --allow-remote (shared by
`gateway` and `gateway enable`, which checks the address the agent will use when the operator gives it)."""

from __future__ import annotations

import ipaddress

from metralectl.errors import UsageError

DEFAULT_LISTEN = "127.0.0.1:8090"


def parse_listen(text: str, allow_remote: bool, has_keys: bool = False) -> tuple[str, int]:
    """HOST:PORT ([::1]:PORT for IPv6) → (host, port); a non-loopback host only with API keys or --allow-remote."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise UsageError(f"--listen {text!r} is not HOST:PORT", f"for example `--listen {DEFAULT_LISTEN}`")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        raise UsageError(f"--listen {text!r}: {host!r} is not an IP address",
                         f"name the address: `--listen {DEFAULT_LISTEN}` (loopback) or the interface's address") from None
    if not address.is_loopback and not allow_remote and not has_keys:
        raise UsageError(f"--listen {text}: {host} is not a loopback address, and no API key is configured: anyone "
                         "who reaches it could use every model", "make a key first (`metralectl gateway keys add NAME "
                         "--model M`), or pass --allow-remote to serve other machines without any authentication")
    return str(address), int(port)
