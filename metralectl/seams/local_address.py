"""Whether an address is this host's, from the kernel's own answer: no resolver is asked, no packet is sent."""

from __future__ import annotations

import errno
import ipaddress
import socket


def holds_address(address: str) -> bool:
    """Whether `address` (an IP address written out) is one of this host's: loopback, unspecified (every address
    here), or one a socket can bind here (multicast excepted). Any other is another host's; a name is False."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified:
        return True
    if ip.is_multicast:  # a TCP socket binds one on Linux, though no interface holds it
        return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError as exc:
        return exc.errno not in (errno.EADDRNOTAVAIL, errno.EINVAL, errno.EAFNOSUPPORT)
    return True
