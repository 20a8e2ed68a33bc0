"""TensorRT-LLM as pinned data: engine/trtllm.yaml against trtllm-serve's own click command (the dump
scripts/trtllm-options.py made from the release source at 4c05a748), the roles metralectl owns, the recipe from
NVIDIA's DGX Spark playbook (checked, its provenance, a misspelt flag refused with a suggestion, the exact
`docker run`), and the generated `--extra_llm_api_options` file: checked key by key, shown by `run --print`, written
before the start under the state dir and never through a symlink."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from metralectl.core import serve_options
from metralectl.core.contract import EngineContract, parse_contract
from metralectl.core.render import docker_run_command, render
from metralectl.core.yamlsrc import load_file
from metralectl.ownedfs import OutsideOwned
from tests.unit.recipe_helpers import REPO, catalog, check, errors, read

ENGINE = REPO / "engine"
DUMP = ENGINE / "trtllm" / "4c05a748" / "serve-options.json"
RECIPE = REPO / "recipes" / "qwen3-8b-fp8-trtllm.yaml"
GOLDEN = REPO / "tests" / "golden" / "trtllm-qwen3-8b-docker-run.txt"
_URL = re.compile(r"https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/blob/(?P<commit>[0-9a-f]{40})/(?P<path>\S+)")


def _contract(engine_dir: Path = ENGINE) -> tuple[EngineContract | None, list[str]]:
    contract, problems = parse_contract(load_file(engine_dir / "trtllm.yaml"), engine_dir)
    return contract, [p.render() for p in problems.problems if p.severity == "error"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metralectl", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, **(env or {})})


def test_the_pinned_dump_is_trtllm_serves_click_command() -> None:
    data = json.loads(DUMP.read_text())
    assert (data["engine"], data["engine_version"], data["parser"], data["generator"]) == (
        "trtllm", "4c05a748", "tensorrt_llm.commands.serve:serve (click)", "scripts/trtllm-options.py")
    assert data["positionals"] == ["model"]  # `trtllm-serve MODEL`
    dump = serve_options.load(DUMP)
    by_flag = {f.flag: f for f in dump.flags}
    assert len(dump.flags) == 25 and dump.levers == ()
    assert by_flag["port"].default == "8000" and by_flag["host"].default == "localhost"
    assert list(by_flag["backend"].options) == ["pytorch", "tensorrt", "_autodeploy"]
    assert by_flag["kv_cache_free_gpu_memory_fraction"].value_type == "float"
    assert by_flag["trust_remote_code"].presence_only and by_flag["tp_size"].default == "1"
    # what the option definitions take from modules outside the pinned source is stubbed, never guessed
    assert by_flag["max_batch_size"].default is None and by_flag["log_level"].options == ()


def test_the_dump_is_the_bytes_engine_trtllm_yaml_records() -> None:
    revision = load_file(ENGINE / "trtllm.yaml").data["revisions"]["4c05a748"]
    assert revision["serve-options"] == "trtllm/4c05a748/serve-options.json"
    assert serve_options.sha256_file(DUMP) == revision["sha256"]
    assert revision["commit"] == "4c05a74891e4df8066f08ed4ce14b0972abe4e25"


def test_the_contract_declares_every_option_as_the_dump_says() -> None:
    contract, errs = _contract()
    assert errs == [] and contract is not None
    rev = contract.revisions["4c05a748"]
    dump = serve_options.load(DUMP)
    assert list(rev.specs) == [f.flag for f in dump.flags]
    for flag in dump.flags:
        assert serve_options.flag_drift(flag, rev.specs[flag.flag]) == [], flag.flag
    out = subprocess.run([sys.executable, "scripts/engine-contract.py", "check", "trtllm"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and "trtllm   4c05a748   25 flags" in out.stdout, out.stdout + out.stderr


def test_a_changed_dump_is_refused_until_recorded(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    (engine / "trtllm" / "4c05a748").mkdir(parents=True)
    shutil.copy(ENGINE / "trtllm.yaml", engine / "trtllm.yaml")
    data = json.loads(DUMP.read_text())
    data["flags"] = [f for f in data["flags"] if f["flag"] != "media_io_kwargs"]
    (engine / "trtllm" / "4c05a748" / "serve-options.json").write_text(json.dumps(data))
    _, errs = _contract(engine)
    assert any("has sha256" in e and "not the recorded" in e for e in errs), errs


def test_roles_and_fit_metralectl_owns() -> None:
    contract, _ = _contract()
    assert contract is not None
    f = contract.flags
    assert (f["host"].resource, f["port"].resource) == ("bind", "port")
    assert f["kv_cache_free_gpu_memory_fraction"].resource == "memory-utilization"
    assert contract.memory_meaning == "fraction-of-free-after-weights"
    assert (contract.fit_roles.context_length, contract.fit_roles.sequences) == ("max_seq_len", "max_batch_size")
    assert contract.model_argument.form == "positional" and contract.default_port == 8000
    assert contract.serve_command == ("trtllm-serve",) and contract.served_name_flag is None
    assert contract.readiness.style == "health-when-loaded" and contract.endpoints["health"] == "/health"
    assert "TRTLLM_*" in contract.env_passthrough and contract.metrics.series == {}
    for name in ("extra_llm_api_options", "server_role", "metadata_server_config_file", "disagg_cluster_uri"):
        assert f[name].recipe == "forbidden" and f[name].reason, name
    assert contract.revisions["4c05a748"].policy.keys == ("max_seq_len", "max_batch_size")
    assert contract.config_file is not None and contract.config_file.flag == "extra_llm_api_options"


def test_its_log_lines_give_the_ready_phase_and_named_failures() -> None:
    """The wording of tensorrt_llm/logger.py's prefix, uvicorn's ready line and the failures engine/trtllm.yaml names."""
    from metralectl.lifecycle.boot import BootLog, message_of

    engine = catalog().engines["trtllm"]
    assert message_of("[12/04/2026-05:40:03] [TRT-LLM] [I] Loading model", engine.log_prefix) == "Loading model"
    assert message_of("[12/04/2026-05:40:03] [TRT-LLM] [MPI_Rank 1] [W] slow", engine.log_prefix) == "slow"
    assert message_of("[TensorRT-LLM][INFO] Memory usage", engine.log_prefix) == "Memory usage"
    log = BootLog(engine, "127.0.0.1", 8000)
    assert [log.feed(line) for line in ("INFO:     Started server process [7]",
                                        "INFO:     Application startup complete.")] == [None, "ready"]
    for cause, line in (("bad-flag", "Error: No such option '--max_batch_sze'."),
                        ("out-of-memory", "[12/04/2026-05:40:03] [TRT-LLM] [E] torch.OutOfMemoryError: CUDA out of memory"),
                        ("no-weights", "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached "
                                       "snapshot folder")):
        log = BootLog(engine, "127.0.0.1", 8000)
        log.feed(line)
        assert log.failure is not None and log.failure.cause == cause and log.failure.remedy, line


def test_a_misspelt_trtllm_flag_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    data = read(RECIPE)
    data["serve"]["max_batch_sze"] = 8
    by_key = {p.key: p for p in errors(check(tmp_path, data, RECIPE.name))}
    assert by_key["serve.max_batch_sze"].hint == "did you mean `max_batch_size`?", by_key
    assert by_key["serve.max_batch_sze"].line is not None and "TensorRT-LLM" in by_key["serve.max_batch_sze"].message


def test_a_misspelt_trtllm_flag_is_refused_by_the_cli(tmp_path: Path) -> None:
    bad = tmp_path / RECIPE.name
    bad.write_text(RECIPE.read_text().replace("  trust_remote_code: true", "  trust_remote_cod: true"))
    out = _cli("recipes", "check", str(bad))
    assert out.returncode == 65, out.stdout + out.stderr
    assert f"{bad}:" in out.stdout + out.stderr and "did you mean `trust_remote_code`?" in out.stdout + out.stderr


def test_the_recipe_checks_and_names_its_provenance() -> None:
    out = _cli("recipes", "check", str(RECIPE))
    assert out.returncode == 0 and "1 ok, 0 refused" in out.stderr, out.stdout + out.stderr
    recipe = catalog().recipes["qwen3-8b-fp8-trtllm"]
    prov = recipe.provenance
    assert prov is not None and len(prov.commit) == 40 and len(prov.sha256) == 64
    header = RECIPE.read_text().split("\nschema:", 1)[0]
    assert {"repo": prov.repo, "commit": prov.commit, "path": prov.path} in [
        m.groupdict() for m in _URL.finditer(header)]
    assert recipe.engine_config["cuda_graph_config"] == {"enable_padding": True}


def test_list_engine_trtllm_lists_its_recipe() -> None:
    out = _cli("list", "--engine", "trtllm", "--json")
    assert out.returncode == 0, out.stderr
    names = [r["name"] for r in json.loads(out.stdout)["recipes"]]
    assert names == ["qwen3-8b-fp8-trtllm"]


@pytest.mark.parametrize("section,key,hint", [
    ({"kv_cache_confg": {"dtype": "auto"}}, "engine-config.kv_cache_confg", "did you mean `kv_cache_config`?"),
    ({"cuda_graph_config": {"enable_paddin": True}}, "engine-config.cuda_graph_config.enable_paddin",
     "did you mean `enable_padding`?"),
    ({"max_batch_size": 1}, "engine-config.max_batch_size", "set it as `serve.max_batch_size`"),
    ({"kv_cache_config": {"free_gpu_memory_fraction": 0.8}}, "engine-config.kv_cache_config.free_gpu_memory_fraction",
     "set resources.memory-utilization"),
    ({"cuda_graph_config": True}, "engine-config.cuda_graph_config", None),
])
def test_a_bad_engine_config_key_is_refused_at_its_line(tmp_path: Path, section: dict[str, Any], key: str,
                                                        hint: str | None) -> None:
    data = read(RECIPE)
    data["engine-config"] = section
    by_key = {p.key: p for p in errors(check(tmp_path, data, RECIPE.name))}
    assert key in by_key, by_key
    assert by_key[key].line is not None and str(tmp_path) in by_key[key].render()
    if hint:
        assert hint in (by_key[key].hint or ""), by_key[key].render()


def test_an_engine_that_reads_no_config_file_refuses_the_section(tmp_path: Path) -> None:
    data = read(REPO / "recipes" / "qwen3-8b-fp8-sglang.yaml")
    data["engine-config"] = {"print_iter_log": False}
    by_key = {p.key: p for p in errors(check(tmp_path, data, "qwen3-8b-fp8-sglang.yaml"))}
    assert "reads no generated config file" in by_key["engine-config"].message


def test_the_golden_docker_run_of_a_trtllm_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HOME", "/home/operator")  # the golden must not depend on who runs the tests
    monkeypatch.setenv("METRALE_HOME", "/home/operator/.metrale")
    monkeypatch.setattr("metralectl.core.render.owner", lambda: "operator")
    cat = catalog()
    recipe = cat.recipes["qwen3-8b-fp8-trtllm"]
    spec = render(recipe, cat.engines["trtllm"], cat.images[recipe.image])
    assert docker_run_command(spec) + "\n" == GOLDEN.read_text()
    [file] = spec.files
    assert file.host_path == "/home/operator/.metrale/state/engine-config/qwen3-8b-fp8-trtllm.yaml"
    assert "cuda_graph_config:\n  enable_padding: true\n" in file.text and "free_gpu_memory_fraction" not in file.text


def test_run_print_shows_the_generated_file_and_its_mount() -> None:
    out = _cli("run", "qwen3-8b-fp8-trtllm", "--print")
    assert out.returncode == 0, out.stderr
    head, _, docker = out.stdout.partition("METRALECTL_EOF\ndocker run")
    assert head.startswith("mkdir -p ") and "\nprint_iter_log: false\n" in head
    assert "/etc/metralectl/extra-llm-api-options.yaml:ro" in docker
    assert docker.rstrip().endswith("--extra_llm_api_options /etc/metralectl/extra-llm-api-options.yaml")
    spec = json.loads(_cli("run", "qwen3-8b-fp8-trtllm", "--print", "--json").stdout)
    assert spec["files"][0]["text"].endswith("disable_overlap_scheduler: true\n")


def _spec_with_file() -> Any:
    cat = catalog()
    recipe = cat.recipes["qwen3-8b-fp8-trtllm"]
    return render(recipe, cat.engines["trtllm"], cat.images[recipe.image])


def test_the_file_is_written_before_the_container_starts(isolated_env: Path, tmp_path: Path) -> None:
    from metralectl.lifecycle.ranks import Rank, _start

    spec = _spec_with_file()
    path = Path(spec.files[0].host_path)
    seen: list[tuple[str, int]] = []

    class Runtime:
        def create_and_start(self, spec: Any, labels: dict[str, str]) -> Any:
            seen.append((path.read_text(), stat.S_IMODE(path.stat().st_mode)))
            return type("Info", (), {"id": "c1"})()

    _start(Rank(0, Runtime(), spec, tmp_path / "log"), {}, "run1", lambda event: None)  # type: ignore[arg-type]
    assert path.is_relative_to(isolated_env / "metrale" / "state" / "engine-config")
    assert seen == [(spec.files[0].text, 0o644)]


def test_the_file_is_never_written_through_a_symlink(isolated_env: Path, tmp_path: Path) -> None:
    from metralectl.lifecycle.specs import write_spec_files

    spec = _spec_with_file()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    state = isolated_env / "metrale" / "state"
    state.mkdir(parents=True)
    (state / "engine-config").symlink_to(outside)
    with pytest.raises(OutsideOwned):
        write_spec_files(spec)
    assert list(outside.iterdir()) == []
    (state / "engine-config").unlink()
    (state / "engine-config").mkdir()
    victim = outside / "victim"
    victim.write_text("keep")
    Path(spec.files[0].host_path).symlink_to(victim)  # the file itself a link: replaced, not followed
    write_spec_files(spec)
    assert victim.read_text() == "keep" and not Path(spec.files[0].host_path).is_symlink()


@pytest.mark.parametrize("kind", ["kube", "compose"])
def test_an_export_refuses_a_recipe_whose_file_it_would_not_carry(kind: str) -> None:
    out = _cli("export", kind, "qwen3-8b-fp8-trtllm")
    assert out.returncode == 64 and out.stdout == "", out.stdout + out.stderr
    assert "engine-config" in out.stderr and "metralectl run qwen3-8b-fp8-trtllm" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_fit_estimate_says_how_trtllm_sizes_its_kv_cache() -> None:
    from metralectl.core.fit import kv_part

    cat = catalog()
    recipe = cat.recipes["qwen3-8b-fp8-trtllm"]
    part = kv_part(cat.model_of(recipe), recipe)
    assert part.gb is None and "0.9 of the memory free after the weights" in part.basis and "auto" in part.basis
