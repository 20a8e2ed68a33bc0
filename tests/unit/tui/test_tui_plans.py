"""What the confirmation says, worked out from the real catalog and a fake Docker."""

from __future__ import annotations

from typing import Any

from metralectl.core.catalog import load_catalog
from metralectl.errors import MetralError
from metralectl.tui.plans import make_plan
from tests.fakes.runtime import FakeRuntime, image


def docker(running: tuple[str, ...] = (), images: bool = True) -> FakeRuntime:
    """A daemon holding every catalog image (or none), serving `running` (ours)."""
    rt = FakeRuntime(images=[image(i.ref) for i in load_catalog().images.values()] if images else [])
    for recipe in running:
        rt.serving(recipe)
    return rt


def plan(action: str, recipe: str | None, runtime: FakeRuntime | None = None, broken: bool = False) -> Any:
    catalog = load_catalog()

    def factory() -> FakeRuntime:
        if broken:
            raise MetralError("Docker is not running")
        return runtime or docker()

    return make_plan(action, catalog.recipe(recipe) if recipe else None, catalog, factory)  # type: ignore[arg-type]


def test_run_plan_shows_the_command_and_refuses_missing_weights() -> None:
    p = plan("run", "qwen3.5-35b-a3b")
    assert p.command and p.command.startswith("docker run -d --name metralectl-qwen3.5-35b-a3b")
    assert p.blocked and "weights" in p.blocked and p.hint == "press p to pull them"


def test_run_plan_refuses_when_image_absent_or_docker_down() -> None:
    assert "not present locally" in plan("run", "qwen3.5-35b-a3b", docker(images=False)).blocked
    assert plan("run", "qwen3.5-35b-a3b", broken=True).blocked == "Docker: Docker is not running"


def test_swap_and_stop_plans_follow_what_is_served() -> None:
    assert "serving nothing" in plan("swap", "qwen3.5-27b").blocked
    served = docker(running=("qwen3.5-27b",))
    assert "already the served model" in plan("swap", "qwen3.5-27b", served).blocked
    stop = plan("stop", None, served)
    assert stop.recipe == "qwen3.5-27b" and not stop.blocked and not stop.cancellable
    assert "serving nothing" in plan("stop", None).blocked
    pull = plan("pull", "qwen3.5-35b-a3b")
    assert not pull.blocked and any("weights Sehyo/Qwen3.5-35B-A3B-NVFP4" in s for s in pull.steps)


def test_multi_rank_recipe_is_refused_with_the_print_hint() -> None:
    p = plan("run", "qwen3.5-122b-a10b-ep2", docker())
    assert p.blocked and "needs 2 ranks" in p.blocked and "--rank N" in (p.hint or "")
