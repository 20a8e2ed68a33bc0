"""SGLang as pinned data: engine/sglang.yaml against SGLang 0.5.23's own parser dump
(engine/sglang/0.5.23/serve-options.json, made by scripts/sglang-options.py), the roles metralectl owns, its log
lines, its /metrics series, and the shipped recipe from NVIDIA's DGX Spark playbook: checked, its provenance, a
misspelt flag refused with a suggestion, and the exact `docker run` (golden)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.core import serve_options
from metralectl.core.contract import EngineContract, parse_contract
from metralectl.core.render import docker_run_command, render, spec_for
from metralectl.core.yamlsrc import load_file
from metralectl.lifecycle.boot import BootLog, message_of
from metralectl.telemetry.engine_metrics import parse_metrics
from tests.unit.recipe_helpers import REPO, catalog, check, errors, read

ENGINE = REPO / "engine"
DUMP = ENGINE / "sglang" / "0.5.23" / "serve-options.json"
RECIPE = REPO / "recipes" / "qwen3-8b-fp8-sglang.yaml"
GOLDEN = REPO / "tests" / "golden" / "sglang-qwen3-8b-docker-run.txt"
_URL = re.compile(r"https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/blob/(?P<commit>[0-9a-f]{40})/(?P<path>\S+)")


def _contract(engine_dir: Path = ENGINE) -> tuple[EngineContract | None, list[str]]:
    contract, problems = parse_contract(load_file(engine_dir / "sglang.yaml"), engine_dir)
    return contract, [p.render() for p in problems.problems if p.severity == "error"]


def test_the_pinned_dump_is_sglangs_parser() -> None:
    data = json.loads(DUMP.read_text())
    assert (data["engine"], data["engine_version"], data["parser"], data["generator"]) == (
        "sglang", "0.5.23", "sglang.srt.server_args.ServerArgs.add_cli_args", "scripts/sglang-options.py")
    dump = serve_options.load(DUMP)
    assert len(dump.flags) == 531 and dump.levers == ()
    by_flag = {f.flag: f for f in dump.flags}
    assert by_flag["model-path"].cli_aliases == ("model",) and by_flag["tp-size"].cli_aliases == (
        "tensor-parallel-size",)
    assert (by_flag["mem-fraction-static"].value_type, by_flag["context-length"].value_type) == ("float", "int")
    assert by_flag["enable-metrics"].presence_only and by_flag["port"].default == "30000"
    assert by_flag["enable-tf32-matmul"].negation == "no-enable-tf32-matmul"
    # SGLang's own deprecated actions are recorded as what they do: a presence flag, or a valued one
    assert by_flag["monokernel-backend"].value_type == "choice" and not by_flag["monokernel-backend"].presence_only
    sampling = by_flag["sampling-backend"].options
    assert list(sampling) == sorted(sampling)  # built from a set: sorted, so the dump is the same on every run


def test_the_contract_declares_every_option_as_the_dump_says() -> None:
    contract, errs = _contract()
    assert errs == [] and contract is not None
    rev = contract.revisions["0.5.23"]
    dump = serve_options.load(DUMP)
    assert rev.sha256 == serve_options.sha256_file(DUMP) and rev.engine_version == "0.5.23"
    assert list(rev.specs) == [f.flag for f in dump.flags]
    for flag in dump.flags:
        assert serve_options.flag_drift(flag, rev.specs[flag.flag]) == [], flag.flag
    assert contract.flag("model") is contract.flags["model-path"]
    out = subprocess.run([sys.executable, "scripts/engine-contract.py", "check", "sglang"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and "sglang   0.5.23    531 flags" in out.stdout, out.stdout + out.stderr


def test_a_changed_dump_is_refused_until_recorded(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    (engine / "sglang" / "0.5.23").mkdir(parents=True)
    shutil.copy(ENGINE / "sglang.yaml", engine / "sglang.yaml")
    data = json.loads(DUMP.read_text())
    data["flags"] = [f for f in data["flags"] if f["flag"] != "random-seed"]
    (engine / "sglang" / "0.5.23" / "serve-options.json").write_text(json.dumps(data))
    _, errs = _contract(engine)
    assert any("has sha256" in e and "not the recorded" in e for e in errs), errs
    assert any("flags.random-seed: is in no pinned serve-options.json" in e for e in errs), errs


def test_roles_and_fit_metralectl_owns() -> None:
    contract, _ = _contract()
    assert contract is not None
    f = contract.flags
    assert (f["model-path"].recipe, f["host"].resource, f["port"].resource) == ("launcher", "bind", "port")
    assert f["mem-fraction-static"].resource == "memory-utilization"
    assert contract.memory_meaning == "static-weights-and-kv"
    assert f["enable-metrics"].recipe == "launcher" and contract.launcher_sets == {"enable-metrics": True}
    for name in ("api-key", "admin-api-key", "ssl-keyfile-password", "download-dir", "config", "grpc-mode",
                 "smg-grpc-mode", "encoder-only"):
        assert f[name].recipe == "forbidden" and f[name].reason, name
    assert contract.revisions["0.5.23"].policy.keys == ("context-length", "max-running-requests")
    assert contract.readiness.style == "warm-up-marker"


BOOT = [  # the wording of SGLang 0.5.23's log lines (file:line in engine/sglang.yaml), with its logger's prefix
    "[2026-12-03 19:37:59 TP0] Load weight begin. avail mem=110.42 GB",
    "[2026-12-03 19:38:31 TP0] Load weight end. elapsed=31.20 s, type=Qwen3ForCausalLM, quant=fp8, avail mem=100.97 GB,"
    " mem usage=9.45 GB.",
    "[2026-12-03 19:38:40 TP0] max_total_num_tokens=418724, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=8, context_len=32768, available_gpu_mem=20.11 GB",
    "[2026-12-03 19:39:08] The server is fired up and ready to roll!",
]


def test_a_start_goes_through_its_phases_to_the_warm_up_marker() -> None:
    engine = catalog().engines["sglang"]
    assert message_of(BOOT[0], engine.log_prefix) == "Load weight begin. avail mem=110.42 GB"
    log = BootLog(engine, "127.0.0.1", 30000)
    assert [phase for line in BOOT if (phase := log.feed(line))] == ["loading", "loaded", "kv-sizing", "ready"]
    assert log.marker_seen and log.failure is None


@pytest.mark.parametrize("cause,line", [
    ("kv-cache-too-small", "[2026-12-03 19:38:40 TP0] RuntimeError: Not enough memory. Please try to increase "
                           "--mem-fraction-static."),
    ("bad-flag", "sglang serve: error: unrecognized arguments: --bogus-flag"),
    ("port-in-use", "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
                    "address already in use"),
])
def test_a_failed_start_is_named(cause: str, line: str) -> None:
    log = BootLog(catalog().engines["sglang"], "127.0.0.1", 30000)
    log.feed(line)
    assert log.failure is not None and log.failure.cause == cause and log.failure.remedy


METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen3-8b",tp_rank="0"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="qwen3-8b",tp_rank="0"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="qwen3-8b",tp_rank="0"} 0.25
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="qwen3-8b",tp_rank="0"} 0.5
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="qwen3-8b"} 6.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen3-8b"} 77.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen3-8b"} 96.0
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="qwen3-8b"} 4.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="qwen3-8b"} 6.0
sglang:time_to_first_token_seconds_count{model_name="qwen3-8b"} 6.0
sglang:time_to_first_token_seconds_sum{model_name="qwen3-8b"} 0.9
"""


def test_sglang_metrics_are_read_through_its_mapping() -> None:
    """prometheus_client's text of the series sglang/srt/observability/metrics_collector.py declares."""
    engines = catalog().engines
    snap = parse_metrics(METRICS, candidates=[c.metrics for c in engines.values()])
    assert snap.engine == "sglang"
    assert (snap.requests_active, snap.requests_waiting, snap.kv_cache_usage) == (2, 1, 0.25)
    assert (snap.requests_total, snap.prompt_tokens_total, snap.generation_tokens_total) == (6, 77, 96)
    assert snap.prefix_cache_hit_rate == 0.5 and snap.ttft is not None and snap.ttft.count == 6


def test_the_recipe_checks_and_names_its_provenance() -> None:
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "check", str(RECIPE)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and "1 ok, 0 refused" in out.stderr, out.stdout + out.stderr
    recipe = catalog().recipes["qwen3-8b-fp8-sglang"]
    prov = recipe.provenance
    assert prov is not None and len(prov.commit) == 40 and len(prov.sha256) == 64
    header = RECIPE.read_text().split("\nschema:", 1)[0]
    assert {"repo": prov.repo, "commit": prov.commit, "path": prov.path} in [
        m.groupdict() for m in _URL.finditer(header)]
    assert recipe.checkpoint.repo in header and any(k == "resources.bind" for k, *_ in prov.deviations)
    validated = load_file(RECIPE).data["validated"]
    assert validated["source"] is None and validated["decode-tok-s"] is None


def test_a_misspelt_sglang_flag_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    data = read(RECIPE)
    data["serve"]["mem-fraction-statc"] = 0.5
    data["serve"]["context-lenght"] = 4096
    by_key = {p.key: p for p in errors(check(tmp_path, data, RECIPE.name))}
    assert by_key["serve.context-lenght"].hint == "did you mean `context-length`?", by_key
    assert by_key["serve.context-lenght"].line is not None
    assert "serve.mem-fraction-statc" in by_key  # the memory fraction is resources.memory-utilization's
    assert "SGLang" in by_key["serve.context-lenght"].message


def test_a_misspelt_sglang_flag_is_refused_by_the_cli(tmp_path: Path) -> None:
    bad = tmp_path / RECIPE.name
    bad.write_text(RECIPE.read_text().replace("  attention-backend: flashinfer", "  attention-backnd: flashinfer"))
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "check", str(bad)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 65, out.stdout + out.stderr
    assert f"{bad}:" in out.stdout + out.stderr and "did you mean `attention-backend`?" in out.stdout + out.stderr


def test_the_golden_docker_run_of_an_sglang_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/home/operator")  # the golden must not depend on who runs the tests
    monkeypatch.setattr("metralectl.core.render.owner", lambda: "operator")
    cat = catalog()
    recipe = cat.recipes["qwen3-8b-fp8-sglang"]
    text = docker_run_command(render(recipe, cat.engines["sglang"], cat.images[recipe.image]))
    assert text + "\n" == GOLDEN.read_text()
    words = shlex.split(docker_run_command(spec_for(cat, recipe)).replace("\\\n", " "))
    image = words.index("lmsysorg/sglang:latest-cu130")
    assert words[image + 1:image + 6] == ["python3", "-m", "sglang.launch_server", "--model-path", "nvidia/Qwen3-8B-FP8"]
    assert ("--mem-fraction-static", "0.75") in zip(words, words[1:]) and "--enable-metrics" in words
