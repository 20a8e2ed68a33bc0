"""Engines run as host processes, behind the same ContainerRuntime contract as Docker's containers.

    runtime     ProcessRuntime: what `open_runtime(Endpoint(PROCESS_ENDPOINT_URL, ...))` returns
    launch      create_and_start: the state claimed, the supervisor started detached, its answer awaited;
                Ctrl-C or a failed start leaves no process and no state behind
    supervise   the supervisor (`python -m metralectl.seams.process.supervise`): starts the engine in a
                session and process group of its own, records its identity, reaps it, records its exit
    state       one state file per name under <METRALE_HOME>/state/processes (atomic, read capped, inside a
                directory we own), a process's identity, what a state says now (ContainerInfo)
    group       the engine's process group: its members, verified; signals only to verified processes
    logs        one log file per launch (bounded, rotated, the last launches kept), tail and follow
    images      an "image" here is an executable: present when it exists and may be executed

This package's own __init__ stays light: `ps`, the agent and the CLI import the host-process helpers below
from here, as they always did (they live in seams/hostproc.py, a flat module seams' other flat modules use).
"""

from __future__ import annotations

from metralectl.seams.hostproc import command_line as command_line
from metralectl.seams.hostproc import command_name as command_name
from metralectl.seams.hostproc import executable as executable
from metralectl.seams.hostproc import identity as identity
from metralectl.seams.hostproc import on_stop_signals as on_stop_signals
from metralectl.seams.hostproc import pid_alive as pid_alive
from metralectl.seams.hostproc import pid_is_ours as pid_is_ours
from metralectl.seams.hostproc import raise_fd_limit as raise_fd_limit
from metralectl.seams.hostproc import same_process as same_process
from metralectl.seams.hostproc import sigterm_as_interrupt as sigterm_as_interrupt
from metralectl.seams.hostproc import sigterm_as_interrupt_until_exit as sigterm_as_interrupt_until_exit
from metralectl.seams.hostproc import start_ticks as start_ticks
from metralectl.seams.hostproc import wait_gone as wait_gone

# The endpoint of "engines as host processes on this machine" (a rank record keeps it as its endpoint URL); endpoints
# are seams/docker's values, so it is defined there, once.
from metralectl.seams.docker.endpoints import PROCESS_ENDPOINT_URL as PROCESS_ENDPOINT_URL  # noqa: E402
IMAGE_PREFIX = "process:"  # a process-mode spec's image: "process:" + the absolute path of what is executed
