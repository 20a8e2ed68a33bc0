"""Child processes for test_listener_limits.py (run as `python -m tests.unit.flood_children WHAT ...`): each
changes its own descriptor limit, which a test must never do to the pytest process itself.

    agent BASE LIMIT     a real Agent (local API + peer listener on 127.0.0.1) started with RLIMIT_NOFILE
                         soft LIMIT/2, hard LIMIT (the agent raises the soft one to LIMIT, no further);
                         prints its ports and the limit it runs under, runs until stdin closes
    starved              a bare Server whose accept() finds no descriptor: takes every descriptor, prints
                         its port, waits for a line (the parent has connected), counts accept attempts for
                         HOLD_S, frees the descriptors, prints the count, and serves until stdin closes
    raise                lowers the soft limit to 64, calls raise_fd_limit(), prints before/after/hard
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

HOLD_S = 2.0


def agent(base: str, limit: int) -> None:
    from metralectl.agent.service import Agent, AgentOptions

    resource.setrlimit(resource.RLIMIT_NOFILE, (limit // 2, limit))
    check: Any = lambda: {"can_run": True, "summary": "flood test", "problems": [], "checks": []}  # noqa: E731
    node = Agent(AgentOptions(api_port=0, peer_port=0, peer_host="127.0.0.1", peer=True, interval_s=30.0, regroup=False),
                 base=Path(base), check=check, ops=None, home=Path(base) / "home", lock_path=Path(base) / "lock")
    node.start()
    try:
        print(json.dumps({"api": node.api.port, "peer": node.peer_server.port,
                          "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}), flush=True)
        sys.stdin.read()  # until the parent closes it
        print(json.dumps({"turned_away": node.peer_server.turned_away}), flush=True)
    finally:
        node.stop()


def starved() -> None:
    from metralectl.seams.httpserve import Handler, Server

    class Counting(Server):
        attempts = 0

        def get_request(self) -> Any:
            Counting.attempts += 1
            return super().get_request()

    server = Counting(("127.0.0.1", 0), Handler)
    server.start("starved")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, soft), hard))
    fillers = []  # every descriptor taken before anyone connects, so no accept() can succeed until freed
    try:
        while True:
            fillers.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    print(json.dumps({"port": server.port}), flush=True)  # stdout and stdin need no new descriptor
    sys.stdin.readline()  # the parent has connected: the listening socket is readable from now on
    before = Counting.attempts
    time.sleep(HOLD_S)
    during = Counting.attempts - before
    for fd in fillers:
        os.close(fd)
    print(json.dumps({"attempts_while_starved": during, "fillers": len(fillers)}), flush=True)
    sys.stdin.read()
    server.stop()


def raise_limit() -> None:
    from metralectl.seams.process import raise_fd_limit

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    before, after = raise_fd_limit()
    print(json.dumps({"before": before, "after": after, "hard": hard,
                      "now": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}), flush=True)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "agent":
        agent(sys.argv[2], int(sys.argv[3]))
    elif what == "starved":
        starved()
    elif what == "raise":
        raise_limit()
    else:
        raise SystemExit(f"unknown: {what}")
