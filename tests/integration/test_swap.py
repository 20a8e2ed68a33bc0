"""swap with rollback, the one-at-a-time lock, repair after a killed swap, foreign containers untouched."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from metralectl.errors import ExitCode

from tests.integration.conftest import Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def _serving(box: Box) -> dict[str, dict]:
    ps = json.loads(box.cli("ps", "--json", check=True).stdout)
    return {s["recipe"]: s for s in ps["serving"]}


def _journal(box: Box) -> Path:
    return box.home / "metrale" / "state" / "swap-journal.json"


def test_swap_replaces_the_model_on_the_same_port(box: Box) -> None:
    old, new = box.recipe("old"), box.recipe("new")
    box.weights_complete()
    first = box.cli("run", old, check=True)
    url = first.stdout.split("endpoint  ")[1].split()[0]
    out = box.cli("swap", new, "--json", check=True)
    result = json.loads(out.stdout)
    assert result["outcome"] == "swapped" and result["url"] + "/v1" == url
    assert set(result["phases"]) == {"drain", "stop", "boot"}
    assert "keeps the served address" in out.stderr  # the new recipe asked for another port
    serving = _serving(box)
    assert list(serving) == [new] and serving[new]["health"] == "ok"
    assert httpx.get(f"{url}/models", timeout=5).status_code == 200
    assert f"{old} → {new}: swapped" in box.cli("ps").stderr


def test_swap_to_a_failing_recipe_restores_the_previous_one(box: Box) -> None:
    old, bad = box.recipe("old"), box.recipe("bad", image="exit-at-start")
    box.weights_complete()
    box.cli("run", old, check=True)
    out = box.cli("swap", bad)
    assert out.returncode == 1
    assert f"the previous recipe {old} serves again" in out.stderr and "Traceback" not in out.stderr
    serving = _serving(box)
    assert list(serving) == [old] and serving[old]["health"] == "ok"
    assert not _journal(box).exists()
    assert "rolled-back" in box.cli("ps").stderr


def test_swap_refuses_before_releasing_anything(box: Box) -> None:
    old = box.recipe("old")
    box.weights_complete()
    box.cli("run", old, check=True)
    container_before = box.containers()
    refused = box.cli("swap", "qwen3.5-122b-a10b-ep2")
    assert refused.returncode == 1 and "hot swap is single-node" in refused.stderr
    invalid = box.cli("swap", old, "--set", "max-seq-len=lots")
    assert invalid.returncode == ExitCode.USAGE and "must be an integer" in invalid.stderr  # the --set's fault
    missing_image = box.recipe("noimage")
    (box.config / "recipes" / f"{missing_image}.yaml").write_text(
        (box.config / "recipes" / f"{missing_image}.yaml").read_text().replace("image: double-ok",
                                                                               "image: metrale-inference-hopper"))
    no_image = box.cli("swap", missing_image)
    assert no_image.returncode == 1 and "is not here" in no_image.stderr  # a locally built image: nothing to pull
    assert box.containers() == container_before and _serving(box)[old]["health"] == "ok"


def test_two_concurrent_swaps_one_is_busy(box: Box) -> None:
    old, a, b = box.recipe("old"), box.recipe("a", image="slow3"), box.recipe("b", image="slow3")
    box.weights_complete()
    box.cli("run", old, check=True)
    first = box.popen("swap", a)
    time.sleep(1.0)
    second = box.cli("swap", b, timeout=30)
    assert second.returncode == 75 and "busy" in second.stderr and f"swap to {a}" in second.stderr
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert list(_serving(box)) == [a]


def test_killed_mid_swap_is_reported_and_repaired(box: Box) -> None:
    old, new = box.recipe("old"), box.recipe("new", image="slow")
    box.weights_complete()
    box.cli("run", old, check=True)
    proc = box.popen("swap", new)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        journal = json.loads(_journal(box).read_text()) if _journal(box).exists() else {}
        if journal.get("phase") == "starting-new" and len(box.containers(all_=False)) == 1 and \
                box.containers(all_=False)[0].endswith(new):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the swap never reached starting-new")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    ps = box.cli("ps")
    assert "DEGRADED" in ps.stderr and "interrupted while starting-new" in ps.stderr and "--repair" in ps.stderr
    repaired = box.cli("ps", "--repair", "--json", check=True)
    serving = json.loads(repaired.stdout)["serving"]
    assert [s["recipe"] for s in serving] == [old] and serving[0]["health"] == "ok"
    assert json.loads(repaired.stdout)["degraded"] is None
    assert not _journal(box).exists()


def test_foreign_containers_are_never_touched(box: Box) -> None:
    image = box.images["ok"]
    clash = f"metralectl-{box.prefix}-clash"  # a foreign container holding the name a recipe renders to
    other_owner = f"{box.prefix}-otherowner"  # labelled as metralectl's, but another user's
    subprocess.run(["docker", "run", "-d", "--network", "none", "--name", clash, "--entrypoint", "/bin/busybox", image, "sleep", "300"],
                   check=True, capture_output=True)
    other = ["--label", "ai.metrale.metralectl.managed=true", "--label", "ai.metrale.metralectl.owner=someone-else",
             "--label", "ai.metrale.metralectl.recipe=x", "--entrypoint", "/bin/busybox", image, "sleep", "300"]
    subprocess.run(["docker", "create", "--network", "none", "--name", other_owner, *other], check=True, capture_output=True)
    try:
        mine = box.recipe("mine")
        box.weights_complete()
        (box.config / "recipes" / f"{box.prefix}-clash.yaml").write_text(
            (box.config / "recipes" / f"{mine}.yaml").read_text().replace(f"name: {mine}", f"name: {box.prefix}-clash"))
        refused = box.cli("run", f"{box.prefix}-clash")
        assert refused.returncode == 1 and "is not metralectl's" in refused.stderr
        box.cli("run", mine, check=True)
        box.cli("swap", mine, "--set", "max-seq-len=4096", check=True)
        box.cli("stop", "--all", check=True)
        every = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}} {{.State}}"], capture_output=True,
                               text=True).stdout
        assert f"{clash} running" in every and f"{other_owner} created" in every
        # another user's model that runs blocks a launch, and is not stopped by --replace
        subprocess.run(["docker", "start", other_owner], check=True, capture_output=True)
        blocked = box.cli("run", mine, "--replace")
        assert blocked.returncode == 1 and "another user's model" in blocked.stderr
        assert other_owner in subprocess.run(["docker", "ps", "--format", "{{.Names}}"], capture_output=True,
                                             text=True).stdout.split()
    finally:
        subprocess.run(["docker", "rm", "-f", clash, other_owner], capture_output=True)
