"""A Docker API proxy on a unix socket that holds back container creates: TEST FIXTURE.

    python3 tests/docker_image/slow_proxy.py --listen /tmp/x.sock --delay 3 [--upstream /var/run/docker.sock]

Every connection is relayed byte for byte to the real daemon, except that a request starting
`POST /…/containers/create` is held for --delay seconds before it is forwarded — so a client that is
interrupted while creating a container finishes its own cleanup lookup *before* the daemon creates it,
which is the race issue 19 item 8 describes, made certain. It prints `create-seen` and then
`create-forwarded` on stdout (one line each) as it happens, for the test to wait on.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time


def _pump(src: socket.socket, dst: socket.socket, delay_s: float, announce: bool) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if announce and data.startswith(b"POST ") and b"/containers/create" in data.split(b"\r\n", 1)[0]:
                print("create-seen", flush=True)
                time.sleep(delay_s)
                print("create-forwarded", flush=True)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(client: socket.socket, upstream: str, delay_s: float) -> None:
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    daemon.connect(upstream)
    threading.Thread(target=_pump, args=(client, daemon, delay_s, True), daemon=True).start()
    _pump(daemon, client, 0.0, False)
    client.close()
    daemon.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", default="/var/run/docker.sock")
    parser.add_argument("--delay", type=float, default=3.0)
    args = parser.parse_args(argv)
    if os.path.exists(args.listen):
        os.unlink(args.listen)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(args.listen)
    server.listen(64)
    print("listening", flush=True)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve, args=(client, args.upstream, args.delay), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
