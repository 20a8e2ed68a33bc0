"""vLLM started as a host process (engine/vllm.yaml `process:`): its API server module run by the Python it is
installed in, with no subcommand (`vllm serve` is what NVIDIA's image is given), the same flags as in the image."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from metralectl.core.render import docker_run_command, render, spec_for
from tests.unit.recipe_helpers import catalog
from tests.unit.test_vllm_contract import _contract, _copy

PYTHON = "/opt/venvs/vllm/bin/python"
RECIPE = "nemotron-3-nano-30b-a3b-vllm"


def test_the_process_section_names_the_api_server_module_and_no_subcommand() -> None:
    start = catalog().engines["vllm"].process
    assert start is not None and (start.module, start.interpreter, start.serve_command) == (
        "vllm.entrypoints.openai.api_server", "python3", ())
    assert start.program == "python3" and start.config_key == "interpreter"  # engines.yaml: vllm.interpreter


def test_a_vllm_host_process_runs_the_module_with_the_images_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", "/srv/hf")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    cat = catalog()
    recipe = cat.recipes[RECIPE]
    container = spec_for(cat, recipe)
    process = render(replace(recipe, runtime="process"), cat.engines["vllm"], cat.image_for(recipe), program=PYTHON)
    assert process.command[:5] == (PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", recipe.checkpoint.repo)
    assert container.command[:4] == ("vllm", "serve", "--model", recipe.checkpoint.repo)
    assert process.command[3:] == container.command[2:]  # the same flags, in the same order
    assert process.image == f"process:{PYTHON}" and process.mounts == ()
    assert (process.env["HF_HOME"], process.env["HF_HUB_CACHE"], process.env["HF_HUB_OFFLINE"]) == (
        "/srv/hf", "/srv/hf/hub", "1")
    assert "vllm serve" in docker_run_command(container)


def test_a_process_serve_command_that_is_an_option_is_refused(tmp_path: Path) -> None:
    engine = _copy(tmp_path)
    path = engine / "vllm.yaml"
    path.write_text(path.read_text().replace("  serve-command: []\n", "  serve-command: [--serve]\n", 1))
    contract, errors = _contract(engine)
    assert contract is None and any("process.serve-command: serve-command is the words before the model argument"
                                    in e for e in errors), errors


def _venv(root: Path, package: str | None) -> Path:
    """A real venv (no pip: a second) whose site-packages has `package`, an empty one, when named."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    if package:
        [site] = root.glob("lib/python*/site-packages")
        (site / package).mkdir()
        (site / package / "__init__.py").write_text("")
    return root / "bin"


@pytest.mark.parametrize("package,status", [("vllm", "ok"), (None, "problem")])
def test_doctor_asks_the_interpreter_for_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: str | None,
                                              status: str) -> None:
    """`doctor --recipe R --runtime process` of a vLLM recipe: the Python found must have vLLM (asked as the
    engine will be started: that interpreter, a host process's environment), or it says which Python to name."""
    from tests.unit import doctor_fakes as df
    from tests.unit.test_doctor_checks import run

    bin_dir = _venv(tmp_path / "venv", package)
    monkeypatch.setenv("PATH", str(bin_dir))
    ctx = df.make_ctx(tmp_path, recipe=RECIPE, recipe_sets=("runtime=process",))
    found = run(ctx, "recipe.program")["recipe.program"]
    assert found.status == status, found
    if status == "problem":
        assert "cannot start vllm.entrypoints.openai.api_server: it has no 'vllm' package" in found.detail
        assert "`vllm: {interpreter: /path/to/venv/bin/python}` in engines.yaml" in (found.remedy or "")
