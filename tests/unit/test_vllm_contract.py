"""engine/vllm.yaml against vLLM's own parser dump (engine/vllm/0.32.0/serve-options.json, made by
scripts/vllm-options.py): every option declared, each agreeing with the dump (type, negation, choices, default,
aliases), drift refused; and the series of the real server's /metrics read as vLLM's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metralectl.core import serve_options
from metralectl.core.contract import EngineContract, parse_contract
from metralectl.core.yamlsrc import load_file
from metralectl.telemetry.engine_metrics import engine_rates, parse_metrics
from tests.unit.recipe_helpers import REPO, catalog

ENGINE = REPO / "engine"
DUMP = ENGINE / "vllm" / "0.32.0" / "serve-options.json"
METRICS = REPO / "tests" / "unit" / "data" / "vllm-0.32.0-cpu-metrics.txt"  # the real server's, after 6 requests


def _contract(engine_dir: Path = ENGINE) -> tuple[EngineContract | None, list[str]]:
    contract, check = parse_contract(load_file(engine_dir / "vllm.yaml"), engine_dir)
    return contract, [p.render() for p in check.problems if p.severity == "error"]


def _copy(tmp_path: Path) -> Path:
    engine = tmp_path / "engine"
    (engine / "vllm" / "0.32.0").mkdir(parents=True)
    shutil.copy(ENGINE / "vllm.yaml", engine / "vllm.yaml")
    shutil.copy(DUMP, engine / "vllm" / "0.32.0" / "serve-options.json")
    return engine


def _edit_flag(engine: Path, name: str, old: str, new: str) -> None:
    path = engine / "vllm.yaml"
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith(f"  {name}: {{"))
    assert old in lines[index], lines[index]
    lines[index] = lines[index].replace(old, new, 1)
    path.write_text("".join(lines))


def test_the_pinned_dump_is_vllms_parser() -> None:
    data = json.loads(DUMP.read_text())
    assert (data["engine"], data["engine_version"], data["parser"]) == (
        "vllm", "0.32.0", "vllm.entrypoints.launchers.cli_args.make_arg_parser")
    dump = serve_options.load(DUMP)
    assert len(dump.flags) == 316 and dump.levers == ()
    by_flag = {f.flag: f for f in dump.flags}
    assert by_flag["enable-prefix-caching"].negation == "no-enable-prefix-caching"
    assert by_flag["gpu-memory-utilization"].cli_aliases == ("device-memory-utilization",)
    assert by_flag["gpu-memory-utilization"].default == "0.92"
    assert (by_flag["max-model-len"].value_type, by_flag["speculative-config"].value_type) == ("int", "json")
    assert by_flag["headless"].presence_only and by_flag["kv-cache-dtype"].options[:2] == ("auto", "bfloat16")


def test_the_contract_declares_every_option_as_the_dump_says() -> None:
    contract, errors = _contract()
    assert errors == [] and contract is not None
    rev = contract.revisions["0.32.0"]
    dump = serve_options.load(DUMP)
    assert rev.sha256 == serve_options.sha256_file(DUMP) and rev.engine_version == "0.32.0"
    assert list(rev.specs) == [f.flag for f in dump.flags]  # same options, the parser's order
    for flag in dump.flags:
        assert serve_options.flag_drift(flag, rev.specs[flag.flag]) == [], flag.flag
    negatable = [s for s in rev.specs.values() if s.type == "negatable"]
    assert len(negatable) == 88 and all(s.negation == f"no-{s.name}" for s in negatable)
    assert contract.flag("device-memory-utilization") is contract.flags["gpu-memory-utilization"]


def test_the_script_check_passes_for_vllm() -> None:
    out = subprocess.run([sys.executable, "scripts/engine-contract.py", "check", "vllm"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "vllm     0.32.0    316 flags" in out.stdout
    bad = subprocess.run([sys.executable, "scripts/engine-contract.py", "check", "vlm"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and "unknown engine 'vlm'" in bad.stderr


@pytest.mark.parametrize("name,old,new,fragment", [
    ("enable-prefix-caching", "negation: no-enable-prefix-caching", "negation: disable-prefix-caching",
     "negation differs"),
    ("dtype", "float32, half]", "float32]", "choices differ"),
    ("port", "default: 8000", "default: 8080", "default differs"),
    ("max-num-seqs", "type: int", "type: float", "the dump's type is int, ours is float"),
    ("gpu-memory-utilization", "aliases: [device-memory-utilization]", "aliases: []", "aliases differ"),
    ("trust-remote-code", "default: false", "default: true", "default differs"),
])
def test_drift_from_the_dump_is_refused(tmp_path: Path, name: str, old: str, new: str, fragment: str) -> None:
    engine = _copy(tmp_path)
    _edit_flag(engine, name, old, new)
    _, errors = _contract(engine)
    assert any(f"flags.{name}: drifts from the engine's vLLM 0.32.0 dump: {fragment}" in e for e in errors), errors


def test_a_changed_dump_is_refused_until_recorded(tmp_path: Path) -> None:
    engine = _copy(tmp_path)
    dump_path = engine / "vllm" / "0.32.0" / "serve-options.json"
    data = json.loads(dump_path.read_text())
    data["flags"] = [f for f in data["flags"] if f["flag"] != "seed"]
    dump_path.write_text(json.dumps(data))
    _, errors = _contract(engine)
    assert any("has sha256" in e and "not the recorded" in e for e in errors), errors
    assert any("flags.seed: is in no pinned serve-options.json" in e for e in errors), errors


def test_roles_metralectl_owns() -> None:
    contract, _ = _contract()
    assert contract is not None
    f = contract.flags
    assert (f["model"].recipe, f["host"].resource, f["port"].resource) == ("launcher", "bind", "port")
    assert f["gpu-memory-utilization"].resource == "memory-utilization"
    assert contract.memory_meaning == "fraction-of-total"
    for name in ("api-key", "hf-token", "download-dir", "config", "headless", "grpc", "uds", "disable-log-stats"):
        assert f[name].recipe == "forbidden" and f[name].reason, name
    assert f["enable-prefix-caching"].render_value(False) == ["--no-enable-prefix-caching"]
    assert f["speculative-config"].render_value({"method": "mtp", "num_speculative_tokens": 3}) == [
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}']
    assert f["max-model-len"].check_value("auto") is None and f["max-model-len"].check_value(0)


def test_the_real_servers_metrics_are_read_as_vllms() -> None:
    """The /metrics text of the real vLLM 0.32.0 (CPU) after 6 requests of 16 tokens (one of them 2 + 14: 77
    prompt and 77 generated tokens in all) is vLLM's, read through engine/vllm.yaml's mapping."""
    engines = catalog().engines
    text = METRICS.read_text()
    snap = parse_metrics(text, candidates=[c.metrics for c in engines.values()])
    assert snap.engine == "vllm"
    assert (snap.requests_total, snap.prompt_tokens_total, snap.generation_tokens_total) == (6, 77, 77)
    assert (snap.requests_active, snap.requests_waiting, snap.kv_cache_usage) == (0, 0, 0)
    assert snap.ttft is not None and snap.ttft.count == 6 and snap.ttft_p50_s is not None
    assert snap.itl is not None and snap.itl.count == 71 and 0 < (snap.itl_p50_s or 0) < 1
    assert snap.prefix_cache_queries_total == 77 and snap.prefix_cache_hit_rate == 0.0
    assert snap.to_json()["itl_p95_s"] == snap.itl_p95_s


def test_prefix_cache_hit_rate_from_hits_and_queries() -> None:
    """vLLM counts prefix-cache queries and hits (no misses): the rate is hits / queries, over a window too."""
    vllm = catalog().engines["vllm"].metrics

    def text(hits: int, queries: int) -> str:
        return (f"# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total {hits}\n"
                f"# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total {queries}\n")

    old, new = parse_metrics(text(10, 40), t=0.0, mapping=vllm), parse_metrics(text(40, 80), t=2.0, mapping=vllm)
    assert old.prefix_cache_hit_rate == 0.25 and new.prefix_cache_hit_rate == 0.5
    assert engine_rates(old, new).prefix_cache_hit_rate == 0.75  # 30 of the window's 40
