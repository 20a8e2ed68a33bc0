"""What the confirmation says, worked out from the real catalog and a fake Docker, by the launch's own
preflight (lifecycle/preflight.py) and the stop's own selection (app/serving.select_stop)."""

from __future__ import annotations

from typing import Any

import pytest

from metralectl.core.catalog import load_catalog
from metralectl.errors import MetralError
from metralectl.tui.plans import make_plan
from tests.fakes.runtime import FakeRuntime, image


@pytest.fixture(autouse=True)
def gb10_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped recipes are for GB10 (arm64): judged as on one (the launch refuses another platform)."""
    monkeypatch.setattr("metralectl.seams.machine.cpu_arch", lambda: "aarch64")


def docker(running: tuple[str, ...] = (), images: bool = True) -> FakeRuntime:
    """A daemon holding every catalog image (or none), serving `running` (ours)."""
    rt = FakeRuntime(images=[image(i.ref, i.platform) for i in load_catalog().images.values()] if images else [])
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
    assert p.blocked and "weights" in p.blocked and p.hint == "Esc, then p in the Library pulls them"


def test_run_plan_refuses_when_image_absent_or_docker_down() -> None:
    absent = plan("run", "qwen3.5-35b-a3b", docker(images=False))
    assert "is not here" in absent.blocked and absent.hint == "Esc, then p in the Library pulls it"
    assert plan("run", "qwen3.5-35b-a3b", broken=True).blocked == "Docker: Docker is not running"


def test_swap_and_stop_plans_follow_what_is_served() -> None:
    nothing = plan("swap", "qwen3.5-27b")
    assert nothing.blocked == "nothing is being served by metralectl" and nothing.hint == "Esc, then r in the Library runs this recipe"
    served = docker(running=("qwen3.5-27b",))
    assert "already the served model" in plan("swap", "qwen3.5-27b", served).blocked
    stop = plan("stop", None, served)
    assert stop.recipe == "qwen3.5-27b" and not stop.blocked and not stop.cancellable
    assert plan("stop", None).blocked == "nothing is being served by metralectl"
    pull = plan("pull", "qwen3.5-35b-a3b")
    assert not pull.blocked and any("weights Sehyo/Qwen3.5-35B-A3B-NVFP4" in s for s in pull.steps)


def test_multi_rank_recipe_is_refused_with_the_print_hint() -> None:
    p = plan("run", "qwen3.5-122b-a10b-ep2", docker())
    assert p.blocked and "needs 2 ranks" in p.blocked and "--rank N" in (p.hint or "")


def test_a_plan_refuses_what_the_launch_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's refusal is the launch's own (the same function, the same message), in the launch's order."""
    from types import SimpleNamespace

    from metralectl.core.overrides import apply_sets
    from metralectl.core.render import spec_for
    from metralectl.lifecycle.launch import LaunchOptions
    from metralectl.lifecycle.preflight import launch_refusal, observe

    monkeypatch.setattr("metralectl.seams.hf.cache.cache_state", lambda *a, **k: SimpleNamespace(status="complete"))
    from metralectl import paths

    (paths.config_dir() / "box.yaml").write_text("budget: 150\n")  # one GB10 model's share fits, two do not
    served = docker(running=("qwen3.5-27b",))
    run = plan("run", "qwen3.5-35b-a3b", served)
    catalog = load_catalog()
    recipe = apply_sets(catalog, catalog.recipe("qwen3.5-35b-a3b"), [])
    spec = spec_for(catalog, recipe)
    refused = launch_refusal(recipe, spec, LaunchOptions(pull=False), observe(recipe, catalog, served, spec))  # type: ignore[arg-type]
    assert refused is not None and run.blocked == refused.error.message
    assert run.blocked.startswith("qwen3.5-35b-a3b needs ") and "of budget 150.00 GB" in run.blocked
    assert "held by qwen3.5-27b " in run.blocked and "Esc, then w in the Library" in (run.hint or "")
    assert not plan("run", "qwen3.5-35b-a3b").blocked  # nothing served, image and weights here: it would go
    same = plan("swap", "qwen3.5-27b", served)
    assert same.blocked == "qwen3.5-27b is already the served model, with these settings"
    assert not plan("swap", "qwen3.5-35b-a3b", served).blocked


def test_a_plan_on_another_platform_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("metralectl.seams.machine.cpu_arch", lambda: "x86_64")
    p = plan("run", "qwen3.5-35b-a3b")
    assert p.blocked and "built for linux/arm64" in p.blocked and "then p" not in (p.hint or "")
