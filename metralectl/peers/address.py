"""Node addresses as operators type them: ip[:port], [v6]:port, bare v6, host.local, dns.name[:port]."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from metralectl.errors import ExitCode, UsageError
from metralectl.peers import PEER_PORT

_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


class BadAddress(UsageError):
    """An address that is not ip[:port], [v6]:port, a v6 address, or a host name[:port]."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class PeerAddress:
    host: str  # a host name, an IPv4 address, or an IPv6 address without brackets
    port: int

    @property
    def is_v6(self) -> bool:
        return ":" in self.host

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if self.is_v6 else f"{self.host}:{self.port}"

    def url(self, path: str) -> str:
        host = self.host.replace("%", "%25") if self.is_v6 else self.host  # a zone id inside a URL
        where = f"[{host}]:{self.port}" if self.is_v6 else f"{host}:{self.port}"
        return f"http://{where}{path}"

    def __str__(self) -> str:
        return self.netloc


def _port(text: str, whole: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 0 < int(text) < 65536:
        raise BadAddress(f"{whole!r}: port {text!r} is not a number from 1 to 65535")
    return int(text)


def _v6(text: str, whole: str) -> str:
    addr, _, zone = text.partition("%")
    try:
        value = ipaddress.IPv6Address(addr)
    except ValueError:
        raise BadAddress(f"{whole!r}: {text!r} is not an IPv6 address") from None
    return f"{value.compressed}%{zone}" if zone else value.compressed


def _hostname(text: str, whole: str) -> str:
    name = text.rstrip(".").lower()
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise BadAddress(f"{whole!r}: {text!r} is not a host name or IP address",
                         "write ip[:port], [v6]:port, host.local or dns.name[:port]")
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        return name


def parse_address(text: str, default_port: int = PEER_PORT) -> PeerAddress:
    whole = text
    text = text.strip()
    if "://" in text or "/" in text:
        raise BadAddress(f"{whole!r}: give an address, not a URL", "e.g. 192.168.1.20, [fe80::1%eth0]:8899, spark2.local")
    if not text:
        raise BadAddress("empty address")
    if text.startswith("["):
        inside, sep, rest = text[1:].partition("]")
        if not sep:
            raise BadAddress(f"{whole!r}: missing ']'")
        if rest and not rest.startswith(":"):
            raise BadAddress(f"{whole!r}: expected ':PORT' after ']'")
        return PeerAddress(_v6(inside, whole), _port(rest[1:], whole) if rest else default_port)
    if text.count(":") >= 2:
        return PeerAddress(_v6(text, whole), default_port)  # a bare v6 address carries no port
    host, sep, port = text.partition(":")
    return PeerAddress(_hostname(host, whole), _port(port, whole) if sep else default_port)
