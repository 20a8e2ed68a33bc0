"""A gzip stream decompressed with a cap on what it may produce, counted as it is pulled. Pure.

tarfile decompresses every member it passes over, listed or not (skipping one reads it through), and
reads an extended header in one call of whatever size it declares. Handing tarfile this reader instead
of a GzipFile bounds all of that: the bytes come out of zlib at most `chunk` at a time, every one is
counted, and the read that would pass `cap` raises instead of decompressing further (a gzip bomb of
2 GB of zeros stops after `cap` bytes, not after 2 GB).
"""

from __future__ import annotations

import zlib

CHUNK = 1 << 16


class TooLarge(Exception):
    """The stream would decompress to more than the cap."""


class Truncated(Exception):
    """The compressed data ended before its gzip end marker."""


class BoundedGunzip:
    """A read-only stream of the decompressed bytes of `data` (one or more gzip members)."""

    def __init__(self, data: bytes, cap: int, chunk: int = CHUNK) -> None:
        self.cap = cap
        self.chunk = chunk
        self.produced = 0  # decompressed bytes handed out so far
        self._input = data
        self._decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._done = not data

    def _more(self, want: int) -> bytes:
        """At most `want` (≤ chunk) newly decompressed bytes; b"" only at the true end of the data."""
        while not self._done:
            if self._decomp.eof:
                rest = self._decomp.unused_data.lstrip(b"\x00")  # padding after a member, as gzip allows
                if not rest:
                    self._done = True
                    break
                self._decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._input = rest
            out = self._decomp.decompress(self._input, want)
            self._input = self._decomp.unconsumed_tail
            if out:
                return out
            if not self._input and not self._decomp.eof:
                raise Truncated("the compressed data ends before its gzip end marker")
        return b""

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all that is left when negative), never more than the cap in total."""
        parts: list[bytes] = []
        left = size if size >= 0 else self.cap + 1
        while left > 0:
            out = self._more(min(left, self.chunk))
            if not out:
                break
            self.produced += len(out)
            if self.produced > self.cap:
                raise TooLarge(f"decompresses to more than {self.cap} bytes")
            parts.append(out)
            left -= len(out)
        return b"".join(parts)

    def close(self) -> None:
        self._done = True
