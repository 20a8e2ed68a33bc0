"""Reading an engine's boot from its log: phases, its ready line, and why a start failed. Pure.

The log is a hint, never the readiness signal (that is /health: lifecycle/readiness.py). A line is
cleaned first (ANSI colour codes removed, other control characters escaped, so it is safe on a
terminal), then its message is cut out of the tracing prefix the engine writes
(`2026-08-26T05:35:05Z  INFO `, or `…443862Z  INFO spark::main_modules::serve: `); the contract's
patterns (engine/metrale.yaml) are searched in that message.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from metralectl.core.contract import EngineContract
from metralectl.errors import ExitCode, MetralError

# CSI sequences (colours, cursor moves) and the two-byte ESC forms; what tracing writes on a TTY.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# tracing-subscriber fmt: RFC 3339 UTC time, the level right-aligned in 5 columns, an optional target
# (a Rust module path, so it has `::` in it — `Error: …` is a message, not a target).
_PREFIX = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})\s+"
                     r"(?P<level>TRACE|DEBUG|INFO|WARN|ERROR)\s+(?:[A-Za-z_][\w]*(?:::[\w]+)+:\s)?")


def clean_line(raw: str) -> str:
    """The line without colour codes, with any other control character shown as \\xNN."""
    text = _ANSI.sub("", raw).rstrip("\r\n")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def message_of(line: str, prefix: re.Pattern[str] | None = None) -> str:
    """A clean line's message: the engine's log prefix (tracing's time, level and module path unless the
    engine file names another `log-prefix:`) cut off when there is one."""
    match = (prefix or _PREFIX).match(line)
    return line[match.end():].strip() if match else line.strip()


@dataclass(frozen=True)
class Diagnosis:
    cause: str  # out-of-memory | empty-cache | no-kernel-target | no-gpu | port-in-use | exited | stalled | timeout | ...
    message: str
    remedy: str


class LaunchFailed(MetralError):
    """The engine did not become ready; its diagnosis names the cause and the remedy."""

    exit_code = ExitCode.FAILED

    def __init__(self, diagnosis: Diagnosis, last_lines: list[str], log_path: str, kept: str | None = None) -> None:
        where = f"; logs kept in {log_path}" + (f"; container {kept} kept" if kept else "")
        super().__init__(f"start failed ({diagnosis.cause}): {diagnosis.message}{where}", diagnosis.remedy)
        self.diagnosis = diagnosis
        self.last_lines = last_lines
        self.log_path = log_path


REMEDIES = {
    "out-of-memory": "lower resources.memory-utilization (e.g. 0.85) or serve.max-seq-len; check for GPU memory "
                     "held by an earlier engine (`metralectl doctor`)",
    "port-in-use": "free the port, or `--set resources.port=N`",
    "gpu-runtime-missing": "install the NVIDIA container toolkit: `sudo nvidia-ctk runtime configure --runtime=docker "
                           "&& sudo systemctl restart docker`",
    "stalled": "the engine stopped making progress (no new log line and no change in its /health answer); check "
               "`metralectl logs` and free memory / disk, or give a slow load more time with --stall-timeout",
    "timeout": "the engine did not become ready within the boot timeout (the hardware class's, or --boot-timeout)",
    "exited": "see the log lines above",
    "health": "the engine logged that it is ready, but /health never answered 200: check that --bind/--port are "
              "what the recipe says (`metralectl run RECIPE --print`) and that nothing else holds the port",
    "no-model": "the engine came up without a model (a modelless boot): metralectl passes the model as `serve "
                "<hf-id>`, so the image's entrypoint or a --set dropped it; check `metralectl run RECIPE --print`",
    "gpu-fault": "the engine latched a GPU fault: check `nvidia-smi` and the kernel log (`dmesg | grep -i xid`) "
                 "and `metralectl doctor`; a GPU fault usually needs the GPU reset (or the machine rebooted) "
                 "before the engine can start again",
    # multi-rank (EP=2) launches; the log signatures' remedies live in engine/metrale.yaml
    "nccl-stuck": "NCCL_SOCKET_IFNAME must name the same RoCE port on every rank and that link must be up: check "
                  "the interface metralectl chose on each node (shown above), the engine image's own environment, "
                  "and `ping -I IF HEAD-IP` from the worker",
    "requests-hang": "the head is healthy but the worker does not take part in requests (it failed to come up or "
                     "lost the head): `metralectl logs --rank 1 RECIPE` on the kept log, then run again",
    "rank-exited": "see the failing rank's log lines above (`metralectl logs --rank N` while it is kept)",
}


class BootLog:
    """Feed log lines; learn the phase, whether our ready line was seen, and any failure signature."""

    def __init__(self, contract: EngineContract, bind: str, port: int, keep: int = 200) -> None:
        self.contract = contract
        self.bind = bind
        self.port = port
        self.phase = "starting"
        self.ready_line_seen = False  # a hint only: /health decides
        self.failure: Diagnosis | None = None
        self._failure_rank = len(contract.log_failures) + 1  # lower = more specific (earlier in log-failures)
        self.marker_seen = False  # the warm-up marker (readiness style warm-up-marker)
        self.tail: deque[str] = deque(maxlen=keep)
        self._port_in_use = re.compile(r"(?i)address already in use|bind.*in use")

    def feed(self, raw: str) -> str | None:
        """Record one line (as the engine wrote it); return the new phase name when this line starts one."""
        line = clean_line(raw)
        self.tail.append(line)
        message = message_of(line, self.contract.log_prefix)
        new_phase = None
        marker = self.contract.readiness.marker
        if marker is not None and marker.search(message):
            self.marker_seen = True
        for pattern in self.contract.log_phases:
            match = pattern.pattern.search(message)
            if match is None:
                continue
            port = match.groupdict().get("port")
            if port is not None and port.isdigit() and int(port) != self.port:
                continue  # another engine's (or rank's) line: not ours
            new_phase = pattern.key
            self.phase = pattern.key
            break
        if new_phase == "ready":
            self.ready_line_seen = True
        found = self._failure(message)
        if found is not None and found[0] < self._failure_rank:
            # The first line of the most specific signature seen: an engine often logs a generic "failed to
            # load model" before the line that says why (llama.cpp: `invalid magic characters`).
            self._failure_rank, self.failure = found
        return new_phase

    def _failure(self, message: str) -> tuple[int, Diagnosis] | None:
        for rank, pattern in enumerate(self.contract.log_failures):
            if pattern.pattern.search(message):
                return rank, Diagnosis(pattern.key, message.strip(), pattern.remedy or REMEDIES.get(pattern.key, ""))
        if self._port_in_use.search(message):
            return len(self.contract.log_failures), Diagnosis("port-in-use", message.strip(), REMEDIES["port-in-use"])
        return None


def diagnose_exit(exit_code: int | None, oom_killed: bool, log: BootLog) -> Diagnosis:
    """Why an engine (a container or a host process) that exited while starting did so: the log's signature first,
    then the code (137 or the kernel's OOM kill: out of memory, as the runtime recorded it)."""
    if oom_killed or exit_code == 137:
        if log.failure is not None and log.failure.cause != "out-of-memory":
            return log.failure
        return Diagnosis("out-of-memory",
                         f"the engine was killed (exit {exit_code}{', OOM-killed' if oom_killed else ''})",
                         REMEDIES["out-of-memory"])
    if log.failure is not None:
        return log.failure
    said = last_error_line(log)
    return Diagnosis("exited", f"the engine exited with code {exit_code} while starting"
                     + (f": {said}" if said else " (it logged no error line)"), REMEDIES["exited"])


_ERROR_WORDS = re.compile(r"(?i)\b(error|fatal|panic(?:ked)?|exception|abort(?:ed)?|failed|cannot|can't|unable)\b")
_ERROR_LEVEL = re.compile(r"^\d{4}-\d{2}-\d{2}T\S+\s+ERROR\s|^\d+\.\d{2}\.\d{3}\.\d{3} E ")


def last_error_line(log: BootLog) -> str | None:
    """The engine's own last word on why it stopped: its last ERROR-level line, else the last line that says
    error/failed/panic/..., else its last line; shortened for one line of output."""
    lines = [line for line in log.tail if line.strip()]
    chosen = (next((line for line in reversed(lines) if _ERROR_LEVEL.search(line)), None)
              or next((line for line in reversed(lines) if _ERROR_WORDS.search(line)), None)
              or (lines[-1] if lines else None))
    if chosen is None:
        return None
    message = message_of(chosen, log.contract.log_prefix)
    return message if len(message) <= 240 else message[:239] + "…"
