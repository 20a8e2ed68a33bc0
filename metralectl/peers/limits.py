"""What a stranger may cost the peer listener: hellos per source address, as a token bucket.

A hello is the one request anyone may send that makes the node verify a signature and write its peer
store, so it is rate-limited per source address (HELLO_BURST at once, then one per HELLO_EVERY_S) and
its nonces live in their own small store (listener.Node.hello_nonces): a flood of hellos can fill
neither the disk nor the replay store that paired peers' signed requests need.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

HELLO_BURST = 8
HELLO_EVERY_S = 6.0
HELLO_NONCES = 4096  # hello nonces remembered (in memory) until their requests expire
MAX_SOURCES = 4096  # sources tracked; the least recently seen is forgotten first


class SourceLimiter:
    """A token bucket per source address: `burst` requests at once, then one per `every_s` seconds."""

    def __init__(self, burst: int = HELLO_BURST, every_s: float = HELLO_EVERY_S, *,
                 max_sources: int = MAX_SOURCES, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.every_s, self.max_sources, self.clock = burst, every_s, max_sources, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # source -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, source: str) -> float:
        """0 when `source` may go on (one token taken); else the seconds until it may."""
        with self._lock:
            now = self.clock()
            tokens, at = self._buckets.pop(source, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) / self.every_s)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) * self.every_s
            self._buckets[source] = (tokens, now)  # most recently seen last
            while len(self._buckets) > self.max_sources:
                self._buckets.popitem(last=False)
            return wait


def source_key(address: str) -> str:
    """What a limit counts by: the IPv4 address, or an IPv6 address's /64 (one host commonly holds a whole
    /64, and would otherwise have 2^64 buckets)."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)
