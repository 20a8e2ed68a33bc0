"""Reading an engine's boot from its log: phases, the readiness marker, and why a start failed. Pure."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from metralectl.contract import EngineContract


@dataclass(frozen=True)
class Diagnosis:
    cause: str  # out-of-memory | empty-cache | no-kernel-target | no-gpu | port-in-use | exited | stalled | timeout | ...
    message: str
    remedy: str


REMEDIES = {
    "out-of-memory": "lower resources.memory-utilization (e.g. 0.85) or serve.max-seq-len; check for GPU memory "
                     "held by an earlier container (`metralectl doctor`)",
    "port-in-use": "free the port, or `--set resources.port=N`",
    "gpu-runtime-missing": "install the NVIDIA container toolkit: `sudo nvidia-ctk runtime configure --runtime=docker "
                           "&& sudo systemctl restart docker`",
    "stalled": "the engine stopped making progress; check `metralectl logs` and free memory / disk",
    "timeout": "the engine did not become ready within the hardware class's boot timeout",
    "exited": "see the log lines above",
    "health": "the engine printed its marker but /health never answered 200",
    # multi-rank (EP=2) launches; the log signatures' remedies live in engine/metrale.yaml
    "nccl-stuck": "NCCL_SOCKET_IFNAME must name the same RoCE port on every rank and that link must be up: check "
                  "the interface metralectl chose on each node (shown above), the engine image's own environment, "
                  "and `ping -I IF HEAD-IP` from the worker",
    "requests-hang": "the head is healthy but the worker does not take part in requests (it failed to come up or "
                     "lost the head): `metralectl logs --rank 1 RECIPE` on the kept log, then run again",
    "rank-exited": "see the failing rank's log lines above (`metralectl logs --rank N` while it is kept)",
}


class BootLog:
    """Feed log lines; learn the phase, whether the marker was seen, and any failure signature."""

    def __init__(self, contract: EngineContract, bind: str, port: int, keep: int = 200) -> None:
        self.contract = contract
        self.bind = bind
        self.port = port
        self.phase = "starting"
        self.marker_seen = False
        self.failure: Diagnosis | None = None
        self.tail: deque[str] = deque(maxlen=keep)
        self._marker = contract.readiness_marker.format(bind=bind, port=port)
        self._port_in_use = re.compile(r"(?i)address already in use|bind.*in use")

    def feed(self, line: str) -> str | None:
        """Record one line; return the new phase name when this line starts one."""
        self.tail.append(line)
        new_phase = None
        for pattern in self.contract.log_phases:
            if pattern.pattern.search(line):
                if pattern.key == "ready" and not self._is_our_marker(line):
                    continue
                new_phase = pattern.key
                self.phase = pattern.key
                break
        if line.strip().startswith(self._marker) or (new_phase == "ready"):
            self.marker_seen = True
        if self.failure is None:
            self.failure = self._failure(line)
        return new_phase

    def _is_our_marker(self, line: str) -> bool:
        match = re.search(r"Listening on (\S+):(\d+)", line)
        return match is not None and int(match.group(2)) == self.port

    def _failure(self, line: str) -> Diagnosis | None:
        for pattern in self.contract.log_failures:
            if pattern.pattern.search(line):
                return Diagnosis(pattern.key, line.strip(), pattern.remedy or REMEDIES.get(pattern.key, ""))
        if self._port_in_use.search(line):
            return Diagnosis("port-in-use", line.strip(), REMEDIES["port-in-use"])
        return None


def diagnose_exit(exit_code: int | None, oom_killed: bool, log: BootLog) -> Diagnosis:
    """Why a container that exited while starting did so: the log's signature first, then the code."""
    if oom_killed or exit_code == 137:
        if log.failure is not None and log.failure.cause != "out-of-memory":
            return log.failure
        return Diagnosis("out-of-memory", f"the container was killed (exit {exit_code}{', OOM-killed' if oom_killed else ''})",
                         REMEDIES["out-of-memory"])
    if log.failure is not None:
        return log.failure
    return Diagnosis("exited", f"the engine exited with code {exit_code} while starting", REMEDIES["exited"])
