"""`pull` of an image that is built from source, against the real daemon: it says it cannot be pulled and how to
build it, asks no registry, and exits 1 (the recipe's own class is x86_64 Hopper, like this machine)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_pull_of_a_from_source_image_says_how_to_build_it(box: Box) -> None:
    out = box.cli("pull", "qwen3.5-35b-a3b-hopper", "--image-only", timeout=120)
    assert out.returncode == 1, out.stderr
    assert "metrale/metrale-inference-hopper:latest cannot be pulled: it is built from source; not certified by " \
           "the engine" in out.stderr
    assert "docker build -f docker/hopper/Dockerfile -t metrale/metrale-inference-hopper:latest ." in out.stderr
    assert "Traceback" not in out.stderr and "Pulling" not in out.stderr
