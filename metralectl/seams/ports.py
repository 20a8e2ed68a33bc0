"""Can a server listen on this host's address and port right now? The one bind probe.

Docker cannot tell (with host networking the engine binds the host's port itself, after start), so
`run` refuses a taken port before it starts anything and `doctor` reports who holds it.
"""

from __future__ import annotations

import socket


def bind_error(host: str, port: int) -> OSError | None:
    """None when a server could listen on host:port now, else the error bind() or listen() gave."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not "taken"
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            return exc
    return None


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now."""
    return bind_error(host, port) is None
