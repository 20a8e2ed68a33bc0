"""`metralectl agent`: the long-running service. Wires the capability monitor, the local API + page and
the peer listener, records where it listens (`<config>/agent/agent.json`), and stops cleanly on
SIGTERM/SIGINT.

The docker group: a process keeps the groups it started with, so an agent started before
`usermod -aG docker $USER` can never reach the socket by itself. When its own check finds exactly that
case (listed in /etc/group, missing from the process) it re-executes itself through `sg docker`, which
needs no password for a listed member, and so picks up the fix within one check interval, without the
operator restarting anything (`--no-regroup` turns this off).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metralectl import paths
from metralectl.agent import security
from metralectl.agent.capability import DEFAULT_INTERVAL_S, CapabilityMonitor, doctor_capability
from metralectl.peers import PEER_PORT
from metralectl.seams.agent_files import read_state, state_path  # noqa: F401  (re-exported)
from metralectl.seams.process import on_stop_signals, raise_fd_limit

log = logging.getLogger("metralectl.agent")
REGROUP_MARK = "METRALECTL_AGENT_REGROUPED"  # set on the re-executed agent: never loop through sg twice


class CleanFormatter(logging.Formatter):
    """The agent's log lines: each message with its control characters escaped (safetext.clean), so text
    from a peer or a client (a hello's name, a request's path) can neither forge a line nor move the
    terminal's cursor. A traceback, which is ours, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        from metralectl.safetext import clean

        record.message = clean(record.message)
        return super().formatMessage(record)


def configure_logging(stream: Any = None) -> logging.Handler:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(CleanFormatter("%(asctime)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def page_url(base: Path | None = None, port: int | None = None) -> str:
    state = read_state(base) or {}
    port = port or int(state.get("api_port") or security.DEFAULT_API_PORT)
    return f"http://127.0.0.1:{port}/#token={security.load_or_create_token(base)}"


def needs_regroup(answer: dict[str, Any]) -> bool:
    for check in answer.get("checks", []):
        if check.get("id") == "docker.daemon" and check.get("status") == "problem":
            data = check.get("data") or {}
            return bool(data.get("cause") == "permission-denied" and data.get("in_docker_group")
                        and not data.get("docker_group_active"))
    return False


@dataclass
class AgentOptions:
    api_port: int = security.DEFAULT_API_PORT
    peer_port: int = PEER_PORT
    peer_host: str = "0.0.0.0"
    peer: bool = True
    interval_s: float = DEFAULT_INTERVAL_S
    regroup: bool = True
    argv: Sequence[str] = field(default_factory=lambda: list(sys.argv[1:]))


class Agent:
    def __init__(self, options: AgentOptions, *, base: Path | None = None,
                 check: Callable[[], dict[str, Any]] = doctor_capability, ops: Any = None, facts: Any = None,
                 home: Path | None = None, lock_path: Path | None = None) -> None:
        from metralectl.seams import identity
        from metralectl.agent.api import LocalApiServer
        from metralectl.agent.ops import LifecycleOps

        self.options = options
        self.base = base
        self.identity = identity.load_or_create(base)
        self.token = security.load_or_create_token(base)
        self.stopping = threading.Event()
        self.regroup_wanted = False
        self.monitor = CapabilityMonitor(self._checked(check), interval_s=options.interval_s,
                                         on_change=lambda a: log.info("capability: %s", a.get("summary")))
        self.ops = ops if ops is not None else LifecycleOps(self.monitor.latest)
        self.api = LocalApiServer(self.ops, token=self.token, port=options.api_port,
                                  info={"fingerprint": self.identity.fingerprint})
        self.peer_server: Any = None
        if options.peer:
            from metralectl.peers.admission import Facts
            from metralectl.peers.listener import Node, PeerServer

            node = Node(base if base is not None else paths.config_dir(), self.identity, facts or Facts(), home=home,
                        lock_path=lock_path)
            self.peer_server = PeerServer(node, options.peer_host, options.peer_port)
            self.api.units = node.units
        self.api.info["peer_port"] = self.peer_server.port if self.peer_server else None

    def _checked(self, check: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            answer = check()
            if (self.options.regroup and needs_regroup(answer) and not os.environ.get(REGROUP_MARK)
                    and shutil.which("sg")):
                answer["summary"] += " (the agent is picking up the docker group: restarting itself through `sg docker`)"
                self.regroup_wanted = True
                self.stopping.set()
            return answer
        return run

    def start(self) -> None:
        before, after = raise_fd_limit()  # connections are capped; the rest of the process needs its share
        if after != before:
            log.info("descriptor limit raised from %d to %d", before, after)
        self.monitor.start()
        self.api.start("agent-api")
        if self.peer_server is not None:
            self.peer_server.start("agent-peers")
        from metralectl.seams.store import write_json

        write_json(state_path(self.base), {"pid": os.getpid(), "api_port": self.api.port,
                                           "peer_port": self.peer_server.port if self.peer_server else None,
                                           "fingerprint": self.identity.fingerprint, "started": time.time()},
                   mode=0o600)

    def stop(self) -> None:
        self.stopping.set()
        self.monitor.stop()
        self.api.stop()
        if self.peer_server is not None:
            self.peer_server.stop()
        close = getattr(self.ops, "close", None)
        if close is not None:
            close()
        state = read_state(self.base)
        if state is not None and state.get("pid") == os.getpid():
            state_path(self.base).unlink(missing_ok=True)

    def wait(self) -> None:
        while not self.stopping.wait(0.5):
            pass


def run_agent(options: AgentOptions, *, base: Path | None = None, on_ready: Callable[[Agent], None] | None = None) -> None:
    from metralectl.joblog import quiet_http_clients

    quiet_http_clients()  # the log says what the agent did, not every health poll a readiness wait makes
    agent = Agent(options, base=base)

    with on_stop_signals(agent.stopping.set):  # SIGTERM or Ctrl-C: stop serving, then clean up
        agent.start()
        if on_ready is not None:
            on_ready(agent)
        try:
            agent.wait()
        finally:
            agent.stop()
    if agent.regroup_wanted:
        command = shlex.join([sys.executable, "-m", "metralectl", *options.argv])
        os.environ[REGROUP_MARK] = "1"
        log.warning("re-executing through `sg docker` to pick up the docker group")
        os.execvp("sg", ["sg", "docker", "-c", command])
