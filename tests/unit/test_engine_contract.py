"""The serve contract against the engine's own dump (serve-options.json of release b34): drift is refused."""

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
from tests.unit.recipe_helpers import REPO

ENGINE = REPO / "engine"
DUMP = ENGINE / "metrale" / "b34" / "serve-options.json"
B34_SHA256 = "980b1d07c8a91e9b3fc862d1094d06be0c0cbfd33d67ae83ad0486c760f4b90c"  # serve-options.SOURCE.md


def _contract(engine_dir: Path = ENGINE) -> tuple[EngineContract | None, list[str]]:
    contract, check = parse_contract(load_file(engine_dir / "metrale.yaml"), engine_dir)
    return contract, [p.render() for p in check.problems if p.severity == "error"]


def _copy(tmp_path: Path) -> Path:
    engine = tmp_path / "engine"
    (engine / "metrale" / "b34").mkdir(parents=True)
    shutil.copy(ENGINE / "metrale.yaml", engine / "metrale.yaml")
    shutil.copy(DUMP, engine / "metrale" / "b34" / "serve-options.json")
    return engine


def test_the_pinned_dump_is_the_engines_bytes() -> None:
    assert serve_options.sha256_file(DUMP) == B34_SHA256
    dump = serve_options.load(DUMP)
    assert (dump.schema_version, dump.engine_version) == (2, "1.0.0-beta-preview")
    assert len(dump.flags) == 116 and len(dump.levers) == 708


def test_the_contract_agrees_with_the_dump() -> None:
    contract, errors = _contract()
    assert errors == [] and contract is not None
    b34 = contract.revisions["b34"]
    dump = serve_options.load(DUMP)
    assert list(b34.specs) == [f.flag for f in dump.flags]  # same flags, the engine's order
    for flag in dump.flags:
        assert serve_options.flag_drift(flag, b34.specs[flag.flag]) == [], flag.flag


def test_the_script_check_passes_and_generate_is_a_fixed_point(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "scripts/engine-contract.py", "check"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "b34       116 flags  708 levers" in out.stdout and "61e6559   133 flags" in out.stdout


def _edit_flag(engine: Path, name: str, old: str, new: str) -> None:
    path = engine / "metrale.yaml"
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith(f"  {name}: {{"))
    assert old in lines[index], lines[index]
    lines[index] = lines[index].replace(old, new, 1)
    path.write_text("".join(lines))


@pytest.mark.parametrize("name,old,new,fragment", [
    ("kv-cache-dtype", "fp8k_turbo2v]", "fp8k_turbo2v, fp4]", "choices differ"),
    ("max-seq-len", "default: 32768", "default: 32000", "default differs"),
    ("speculative", "type: flag", "type: string", "presence-only is True in the dump"),
    ("model-name", "aliases: [served-model-name], ", "", "aliases differ"),
    ("tp-size", "recipe-keys: [tensor_parallel]", "recipe-keys: [tensor-parallel]", "recipe keys differ"),
    ("block-size", "type: int", "type: float", None),  # a float still fits "16": not drift by itself
])
def test_flag_drift_is_refused(tmp_path: Path, name: str, old: str, new: str, fragment: str | None) -> None:
    engine = _copy(tmp_path)
    _edit_flag(engine, name, old, new)
    _, errors = _contract(engine)
    if fragment is None:
        assert errors == []
        return
    assert any(f"flags.{name}: drifts from the engine's b34 dump: {fragment}" in e for e in errors), errors


def test_a_missing_or_extra_flag_is_refused(tmp_path: Path) -> None:
    engine = _copy(tmp_path)
    text = (engine / "metrale.yaml").read_text()
    line = next(ln for ln in text.splitlines(keepends=True) if ln.startswith("  tbt-deadline-ms: {"))
    assert line.rstrip().endswith("}")  # a one-line entry
    text = text.replace(line, "")
    text = text.replace("  # flags the pinned dump lacks", "  made-up-flag: {type: int}\n  # flags the pinned dump lacks")
    (engine / "metrale.yaml").write_text(text)
    _, errors = _contract(engine)
    assert any("--tbt-deadline-ms of the engine's b34 serve-options.json is missing from `flags:`" in e for e in errors)
    assert any("flags.made-up-flag: is in no pinned serve-options.json and names no `source:`" in e for e in errors)


def test_a_changed_dump_is_refused_until_recorded(tmp_path: Path) -> None:
    engine = _copy(tmp_path)
    dump_path = engine / "metrale" / "b34" / "serve-options.json"
    data = json.loads(dump_path.read_text())
    data["flags"] = [f for f in data["flags"] if f["flag"] != "hermetic"]
    dump_path.write_text(json.dumps(data))
    _, errors = _contract(engine)
    assert any("has sha256" in e and "not the recorded 980b1d07" in e for e in errors)
    assert any("flags.hermetic: is in no pinned serve-options.json" in e for e in errors)


def test_kv_dtypes_auto_words_and_aliases() -> None:
    contract, _ = _contract()
    assert contract is not None
    kv = contract.flags["kv-cache-dtype"]
    assert len(kv.choices) == 16 and {"turbo4k_turbo8v", "bf16k_turbo2v", "fp8k_turbo3v"} <= set(kv.choices)
    batch = contract.flags["max-batch-size"]
    assert batch.check_value("auto") is None and batch.check_value(128) is None and batch.check_value("lots")
    hp = contract.flags["kv-high-precision-layers"]
    assert all(hp.check_value(w) is None for w in ("auto", "max", "all", 2))
    assert contract.flag("served-model-name") is contract.flags["model-name"]
    assert contract.flag("max-model-len") is contract.flags["max-seq-len"]  # an engine recipe's max_model_len
    assert contract.flag("host") is contract.flags["bind"] and contract.flag("tensor-parallel") is contract.flags["tp-size"]
    assert contract.flag("stupify") is contract.flags["disable-thinking"]


def test_presence_only_flags_render_as_presence() -> None:
    contract, _ = _contract()
    assert contract is not None
    flags = [s for s in contract.revisions["b34"].specs.values() if s.type == "flag"]
    assert len(flags) == 31
    spec = contract.flags["speculative"]
    assert spec.render_value(True) == ["--speculative"] and spec.render_value(False) == []
    assert spec.check_value(False) is None and "restates the default" in str(spec.check_value(False, false_allowed=False))


def test_levers_come_from_the_engines_table() -> None:
    contract, _ = _contract()
    assert contract is not None
    levers = contract.revisions["b34"].levers
    assert len(levers) == 708
    assert sum(lv.recipe for lv in levers.values()) == 633  # Runtime-class levers only
    assert levers["METRALE_FP8_ROWWISE"].recipe and levers["METRALE_FP8_ROWWISE"].klass == "runtime"
    assert not levers["METRALE_HOME"].recipe and levers["METRALE_HOME"].klass == "harness"
    assert levers["METRALE_RATE_LIMIT_RPM"].type == "int"  # our refinement of the table's `text`
    assert levers["METRALE_CANONICAL_TIERS"].flag == "--no-canonical-tiers"


def test_revisions_policies_and_later_flags_are_sourced() -> None:
    contract, _ = _contract()
    assert contract is not None
    assert contract.default_revision == "b34"
    new = contract.revisions["61e6559"]
    assert new.policy.required == "all" and new.policy.false_allowed and len(new.policy.excluded) == 32
    assert set(new.added) == set(new.specs) - set(contract.revisions["b34"].specs)
    for name in new.added:
        assert "@" in new.specs[name].source and new.specs[name].source.startswith("MI crates/server/src/cli/")
    later = contract.revisions["2735884"]
    assert "prompt-lookup-shared-cache-mb" not in later.specs  # nothing at 2735884 names it
    old = contract.revisions["91b364b"]
    assert old.policy.required == "clap-defaults" and not old.policy.false_allowed
    assert not contract.revisions["b34"].policy.false_allowed
