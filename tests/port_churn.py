"""A busy neighbour: binds ephemeral loopback ports and releases them, in a loop, until stopped.

Run it beside the suite to show the tests own their ports (docs/development.md, "Ports"):

    python tests/port_churn.py --for 600 &          # or: --hold 4000 --rate 0 for a harsher neighbour
    .venv/bin/python -m pytest …
    kill %1                                          # it prints how many ports it took, then exits 0

Each round binds one socket to 127.0.0.1 port 0 (as any client or server asking the kernel for a port does),
listens on every other one (so a connection to a port it holds may even be answered), and keeps the last
`--hold` of them open, closing the oldest: at any moment about hold/14000 of the ephemeral ports of bind()'s
kind are taken, each for a short while, at random. A test that picks a free port, closes it, and binds the
number later then meets a taken port now and then; a test that holds its port never does.
"""

from __future__ import annotations

import argparse
import collections
import signal
import socket
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hold", type=int, default=2000, help="sockets kept open at once (default 2000)")
    ap.add_argument("--rate", type=float, default=20000.0,
                    help="binds per second at most; 0: as fast as it can (one core) (default 20000)")
    ap.add_argument("--for", dest="duration", type=float, default=0.0, help="stop after this many seconds (0: never)")
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    held: collections.deque[socket.socket] = collections.deque()
    binds = failures = 0
    start = time.monotonic()
    batch = 100  # binds between two looks at the clock
    while not stop and not (args.duration and time.monotonic() - start >= args.duration):
        began = time.monotonic()
        for _ in range(batch):
            sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
            try:
                sock.bind((args.host, 0))
                if binds % 2:
                    sock.listen(1)
            except OSError:  # the ephemeral range is full: give some back
                failures += 1
                sock.close()
                if held:
                    held.popleft().close()
                continue
            binds += 1
            held.append(sock)
            while len(held) > args.hold:
                held.popleft().close()
        if args.rate > 0:
            time.sleep(max(0.0, batch / args.rate - (time.monotonic() - began)))
    for sock in held:
        sock.close()
    took = time.monotonic() - start
    print(f"port_churn: {binds} ports bound and released in {took:.0f} s ({binds / max(took, 1e-9):.0f}/s), "
          f"{failures} binds refused, {args.hold} held at a time", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
