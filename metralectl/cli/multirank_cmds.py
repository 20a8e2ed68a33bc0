"""What a multi-rank (EP=2) `run` prints once both ranks serve (docs/multinode.md). The launch itself, and
`logs --rank N` and `stop` of every rank, are app/serving.py's."""

from __future__ import annotations

from typing import Any

from metralectl.cli.serve_cmds import print_ready


def print_ready_multi(launched: Any, as_json: bool) -> None:
    print_ready(launched, as_json, [
        f"roce      NCCL_SOCKET_IFNAME={launched.roce_interface}; master {launched.master_addr}:{launched.master_port}",
        *(f"rank {rank.rank}    {rank.container} ({rank.role}) on {rank.endpoint} [{rank.node}]"
          for rank in launched.ranks),
        f"run       {launched.run_id}; logs: metralectl logs -f {launched.recipe} --rank N"])
