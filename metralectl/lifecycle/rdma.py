"""The RDMA side of an EP=2 launch: every node has the devices its rank is given, and which RDMA device
(NCCL_IB_HCA) sits behind the chosen RoCE interface on each. Checked before anything starts.

The hardware class's multi-node profile passes /dev/infiniband to each rank (the reference launcher's
profile). A node without it would make Docker refuse the container with a bare "error gathering device
information"; this says which node, why, and the fix (load the RDMA drivers, or `--no-rdma`) first.
On this machine the check is the device path itself; on another node it is what the probe container
read from that node's sysfs (the uverbs class: /dev/infiniband/uverbsN exists exactly when it does).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

from metralectl.errors import MetralError
from metralectl.core.hardware import RankProfile
from metralectl.lifecycle.events import Listener, Step, Warning_
from metralectl.seams.netprobe import ProbeReport
from metralectl.seams.docker.endpoints import Endpoint
from metralectl.seams.docker.errors import RDMA_HINT
class RdmaNode(Protocol):
    rank: int
    probe: ProbeReport | None

    @property
    def endpoint(self) -> Endpoint: ...

    @property
    def label(self) -> str: ...


def missing_devices(node: RdmaNode, profile: RankProfile) -> list[str] | None:
    """The RDMA device paths this node lacks; None when it cannot be told from here (a remote node the probe
    could not read). Only the profile's RDMA devices are checked (the ones `--no-rdma` leaves out)."""
    wanted = list(profile.rdma.devices)
    if not wanted:
        return []
    if node.endpoint.is_local:
        return [d for d in wanted if not os.path.exists(d)]
    rdma = node.probe.rdma if node.probe is not None else None
    if rdma is None:
        return None
    return [] if rdma.verbs else wanted


def check_rdma(nodes: Sequence[RdmaNode], profile: RankProfile | None, interface: str, *, rdma: bool,
               given_device: str | None, on_event: Listener) -> dict[int, str | None]:
    """Refuse a node without the RDMA devices; return each rank's NCCL_IB_HCA (None: not known, left out)."""
    if profile is None:
        return {n.rank: None for n in nodes}
    if not rdma:
        on_event(Step("rdma", "--no-rdma: NCCL over TCP sockets on the RoCE interface (no /dev/infiniband, "
                              "NCCL_IB_DISABLE=1)"))
        return {n.rank: None for n in nodes}
    for node in nodes:
        missing = missing_devices(node, profile)
        if missing is None:
            on_event(Warning_(f"{node.label}: its RDMA devices could not be checked (the probe did not read them)"))
        elif missing:
            raise MetralError(f"{node.label} has no {' or '.join(missing)}: an EP=2 rank gets the node's RDMA devices "
                              f"for NCCL over RoCE, and Docker would refuse to start it", RDMA_HINT)
    devices: dict[int, str | None] = {}
    for node in nodes:
        if given_device:
            devices[node.rank] = given_device
            continue
        view = node.probe.rdma if node.probe is not None else None
        devices[node.rank] = view.device_for(interface) if view is not None else None
    shown = "; ".join(f"rank {r}: {d or 'not found'}" for r, d in sorted(devices.items()))
    how = "given" if given_device else f"the RDMA device behind {interface} on each node"
    on_event(Step("rdma", f"NCCL_IB_HCA ({how}): {shown}"))
    unknown = [n for n in nodes if devices[n.rank] is None]
    for node in unknown:
        on_event(Warning_(f"{node.label}: no single RDMA device found behind {interface}, so NCCL_IB_HCA is left "
                          "unset there (NCCL then uses any RDMA device it finds); `--rdma-device DEV` names it"))
    return devices
