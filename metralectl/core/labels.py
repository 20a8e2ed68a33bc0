"""Every container label metralectl sets or reads: the one table. Pure.

Labels are a contract with containers that outlive any one metralectl version (`ps`, `stop`, `swap` and
telemetry read them off containers an earlier version started), so a name here never changes; a new
label gets a new name. tests/unit/test_labels.py checks that no other module spells a label out.
"""

from __future__ import annotations

import getpass
import os

LABEL_PREFIX = "ai.metrale.metralectl"

# On every container `run` / `swap` starts (core.render.spec_for sets the first five).
LABEL_MANAGED = f"{LABEL_PREFIX}.managed"  # "true": an engine (helper containers lack it)
LABEL_RECIPE = f"{LABEL_PREFIX}.recipe"  # the recipe's name
LABEL_SPEC_HASH = f"{LABEL_PREFIX}.spec-hash"  # identity of what runs (image, flags, env, mounts)
LABEL_OWNER = f"{LABEL_PREFIX}.owner"  # the user who started it; others' containers are never touched
LABEL_RANK = f"{LABEL_PREFIX}.rank"  # multi-rank deployments only: this container's rank
LABEL_RUN_ID = f"{LABEL_PREFIX}.run-id"  # this start; removal of a failed start matches on it
LABEL_ENDPOINT = f"{LABEL_PREFIX}.endpoint"  # the engine's base URL (bench, telemetry, swap read it)
LABEL_SETS = f"{LABEL_PREFIX}.sets"  # the `--set` overrides, joined by \x1f (swap reads them back)
LABEL_ENGINE = f"{LABEL_PREFIX}.engine"  # the engine file's name (metrale, llama-cpp): ps/bench/top name it
# "metralectl-token": the engine asks metralectl's engine token (lifecycle/engine_token.py); whoever talks to it
# directly sends `Authorization: Bearer <token>`
LABEL_ENGINE_AUTH = f"{LABEL_PREFIX}.engine-auth"
ENGINE_AUTH_TOKEN = "metralectl-token"
# "1,3": the GPUs an engine was placed on, on a box of several (core/placement.py); not in the spec hash, so the
# same recipe on other GPUs is the same launch. Without it, an engine of `gpus: N` holds the first N.
LABEL_GPU_IDS = f"{LABEL_PREFIX}.gpu-ids"

# Short-lived helper containers, never taken for engines.
LABEL_PROBE = f"{LABEL_PREFIX}.probe"  # the network/HF-cache probe (seams/docker/containers.run_probe)
LABEL_DOCTOR = f"{LABEL_PREFIX}.doctor"  # doctor's GPU probe container

ALL = (LABEL_MANAGED, LABEL_RECIPE, LABEL_SPEC_HASH, LABEL_OWNER, LABEL_RANK, LABEL_RUN_ID, LABEL_ENDPOINT,
       LABEL_SETS, LABEL_ENGINE, LABEL_PROBE, LABEL_DOCTOR, LABEL_ENGINE_AUTH, LABEL_GPU_IDS)


def owner() -> str:
    """The value of LABEL_OWNER for this process: the user's name (their uid where the passwd has no entry)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"
