"""Every refusal of the recipe checker, with its location and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.recipe_helpers import REPO, catalog, check, errors, flagship_data, one_error, read, write


def test_every_shipped_recipe_passes() -> None:
    from metralectl.core.catalog import check_files

    files = sorted((REPO / "recipes").glob("*.yaml"))
    assert len(files) >= 15
    for path, recipe, problems in check_files(catalog(), files):
        assert recipe is not None, "\n".join(p.render() for p in problems)
        assert not errors(problems), path


def test_flagship_passes(tmp_path: Path) -> None:
    assert errors(check(tmp_path, flagship_data())) == []


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    text = (REPO / "recipes" / "qwen3.5-35b-a3b.yaml").read_text().replace("  max-seq-len: 8192", "  max-seq-len: [8192")
    problem = one_error(check(tmp_path, text))
    assert "YAML syntax error" in problem.message
    assert problem.line > 1 and problem.column > 0
    assert problem.file.endswith("qwen3.5-35b-a3b.yaml")


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    text = (REPO / "recipes" / "qwen3.5-35b-a3b.yaml").read_text()
    text = text.replace("  block-size: 16\n", "  block-size: 16\n  max-seq-len: 4096\n")
    first_line = next(i for i, line in enumerate(text.splitlines(), 1) if "max-seq-len: 8192" in line)
    problem = one_error(check(tmp_path, text))
    assert "duplicate key 'max-seq-len'" in problem.message
    assert f"line {first_line}" in problem.message
    assert problem.line == first_line + 2


def test_unknown_top_level_key_suggests(tmp_path: Path) -> None:
    data = flagship_data()
    data["resorces"] = data.pop("resources")
    probs = check(tmp_path, data)
    unknown = one_error(probs, "resorces")
    assert "unknown key" in unknown.message and "did you mean `resources`" in (unknown.hint or "")


def test_unknown_engine_flag_suggests(tmp_path: Path) -> None:
    data = flagship_data()
    data["serve"]["max-seq-length"] = 4096
    problem = one_error(check(tmp_path, data), "serve.max-seq-length")
    assert "unknown engine flag --max-seq-length" in problem.message
    assert "did you mean `max-seq-len`" in (problem.hint or "")


def test_flag_written_with_dashes(tmp_path: Path) -> None:
    data = flagship_data()
    data["serve"]["--scheduler"] = data["serve"].pop("scheduler")
    assert "without its dashes" in one_error(check(tmp_path, data), "serve.--scheduler").message


@pytest.mark.parametrize("key,value,fragment", [
    ("max-seq-len", "long", "must be an integer"),
    ("max-seq-len", 8192.5, "must be an integer"),
    ("oom-guard-mb", -1, "at least 0"),
    ("max-batch-size", 0, "at least 1"),
    ("kv-cache-dtype", "fp4", "must be one of"),
    ("scheduler", "lifo", "must be one of fifo, slai"),
    ("tool-grammar", "maybe", "auto, on, off"),
    ("auto-compact", 1.5, "at most 1"),
    ("auto-compact", -0.1, "at least 0"),
    ("default-min-p", True, "must be a number"),
    ("prompt-lookup-max-drafts", 17, None),
])
def test_wrong_types_and_ranges(tmp_path: Path, key: str, value: object, fragment: str | None) -> None:
    data = flagship_data()
    data["serve"][key] = value
    if key == "prompt-lookup-max-drafts":
        data["serve"]["prompt-lookup-decoding"] = True
        probs = check(tmp_path, data)
        assert any("at most 16" in p.message for p in errors(probs) if p.key == f"serve.{key}")
        return
    problem = one_error(check(tmp_path, data), f"serve.{key}")
    assert fragment in problem.message


@pytest.mark.parametrize("port", [0, 65536, -1, "8888"])
def test_port_out_of_range(tmp_path: Path, port: object) -> None:
    data = flagship_data()
    data["resources"]["port"] = port
    assert errors(check(tmp_path, data))
    assert one_error(check(tmp_path, data), "resources.port")


@pytest.mark.parametrize("util", [0, 1.01, -0.5, "0.9"])
def test_utilization_outside_unit_interval(tmp_path: Path, util: object) -> None:
    data = flagship_data()
    data["resources"]["memory-utilization"] = util
    assert one_error(check(tmp_path, data), "resources.memory-utilization")


def test_utilization_of_one_is_allowed(tmp_path: Path) -> None:
    data = flagship_data()
    data["resources"]["memory-utilization"] = 1
    assert errors(check(tmp_path, data)) == []


def test_boolean_false_is_allowed_and_rendered_as_absent(tmp_path: Path) -> None:
    """The engine's policy since 2026-10-05 (schema.rs@2735884): a presence-only flag is pinned `true` or
    `false`, and `false` renders as the flag's absence."""
    from metralectl.core.catalog import check_files
    from metralectl.core.render import serve_argv

    data = flagship_data()
    assert data["serve"]["enable-prefix-caching"] is True and data["serve"]["exact-verify"] is False
    data["serve"]["enable-prefix-caching"] = False
    [(_, recipe, problems)] = check_files(catalog(), [write(tmp_path, data)])
    assert recipe is not None and errors(problems) == []
    assert recipe.serve["enable-prefix-caching"] is False
    argv = serve_argv(recipe, catalog().engines["metrale"])
    assert "--enable-prefix-caching" not in argv and "--exact-verify" not in argv
    assert "--speculative" in argv and "false" not in argv


def test_boolean_false_is_refused_where_the_revision_refuses_it(tmp_path: Path) -> None:
    """Revision 91b364b (like release b34) refuses a presence-only `false`: absence is its only "off"."""
    data = read(REPO / "recipes" / "qwen3.5-122b-a10b-single.yaml")
    assert data["engine-revision"] == "91b364b"
    data["serve"]["enable-prefix-caching"] = False
    problem = one_error(check(tmp_path, data, "qwen3.5-122b-a10b-single.yaml"), "serve.enable-prefix-caching")
    assert "`false` restates the default" in problem.message and "91b364b" not in (problem.hint or "")
    assert "enable-prefix-caching: true" in (problem.hint or "")


def test_boolean_written_as_yes_is_refused(tmp_path: Path) -> None:
    # YAML 1.2: `yes` is the word "yes", not a boolean — a presence-only flag wants `true` or `false`.
    text = FLAGSHIP_TEXT().replace("  speculative: true", "  speculative: yes")
    problem = one_error(check(tmp_path, text), "serve.speculative")
    assert "presence-only switch: write `true` or `false`" in problem.message


def FLAGSHIP_TEXT() -> str:
    return (REPO / "recipes" / "qwen3.5-35b-a3b.yaml").read_text()


def test_missing_recipe_settable_key(tmp_path: Path) -> None:
    data = flagship_data()
    del data["serve"]["max-batch-size"]
    problem = one_error(check(tmp_path, data))
    assert "missing --max-batch-size" in problem.message and "every settable flag pinned" in problem.message
    assert "max-batch-size: 8" in (problem.hint or "")
    assert problem.key == "serve"


def test_missing_presence_only_flag_under_pin_everything(tmp_path: Path) -> None:
    data = flagship_data()
    del data["serve"]["hermetic"]
    problem = one_error(check(tmp_path, data))
    assert "missing --hermetic" in problem.message and "hermetic: false" in (problem.hint or "")


def test_excluded_flags_are_optional_and_may_still_be_written(tmp_path: Path) -> None:
    """The engine's EXCLUDED_NAMED (explicit.rs@61e6559): never required, still allowed."""
    data = flagship_data()
    assert "tool-call-parser" not in data["serve"] and "mtp-k-ladder" not in data["serve"]
    data["serve"].update({"tool-call-parser": "qwen3_coder", "mtp-k-ladder": "2:2,32:1"})
    assert errors(check(tmp_path, data)) == []


def test_flag_of_a_later_revision_is_refused_with_the_revision_that_has_it(tmp_path: Path) -> None:
    data = read(REPO / "recipes" / "qwen3.5-122b-a10b-single.yaml")
    data["serve"]["prompt-lookup-decoding"] = True
    problem = one_error(check(tmp_path, data, "qwen3.5-122b-a10b-single.yaml"), "serve.prompt-lookup-decoding")
    assert "not a flag of engine revision 91b364b" in problem.message
    assert "61e6559" in (problem.hint or "") and "2735884" in (problem.hint or "")


def test_unknown_engine_revision_suggests(tmp_path: Path) -> None:
    data = flagship_data()
    data["engine-revision"] = "2735883"
    problem = one_error(check(tmp_path, data), "engine-revision")
    assert "unknown Metrale Engine revision '2735883'" in problem.message and "2735884" in (problem.hint or "")


def test_missing_required_with_key(tmp_path: Path) -> None:
    data = flagship_data()
    del data["serve"]["mtp-quantization"]
    assert "missing --mtp-quantization" in one_error(check(tmp_path, data)).message


def test_speculative_settings_are_pinned_even_with_speculation_off(tmp_path: Path) -> None:
    """Under pin-everything the MTP settings stay stated when --speculative is off (the engine's own
    recipes pin num_drafts: 1 with speculative: false); more than one draft needs a method."""
    data = flagship_data()
    data["serve"]["speculative"] = False
    assert errors(check(tmp_path, data)) == []
    data["serve"]["num-drafts"] = 2
    problem = one_error(check(tmp_path, data), "serve.num-drafts")
    assert "--num-drafts 2 needs a speculative method" in problem.message
    data["serve"]["ngram-speculative"] = True
    assert errors(check(tmp_path, data)) == []


@pytest.mark.parametrize("extra,fragment", [
    ({"self-speculative": True}, "only one of --speculative, --self-speculative, --ngram-speculative"),
    ({"ngram-speculative": True}, "only one of"),
    ({"dflash": True}, "--dflash conflicts with --speculative"),
])
def test_conflicting_speculative_modes(tmp_path: Path, extra: dict, fragment: str) -> None:
    data = flagship_data()
    data["serve"].update(extra)
    assert any(fragment in p.message for p in errors(check(tmp_path, data)))


def test_prompt_lookup_needs_speculative_and_excludes_others(tmp_path: Path) -> None:
    data = flagship_data()
    for key in ("speculative", "num-drafts", "mtp-quantization", "mtp-vocab"):
        del data["serve"][key]
    data["serve"].update({"prompt-lookup-decoding": True, "self-speculative": True, "prompt-lookup-ngram": 4,
                          "prompt-lookup-max-drafts": 8, "prompt-lookup-min-match": 8,
                          "prompt-lookup-miss-backoff": 16, "prompt-lookup-max-seqs": 8})
    messages = [p.message for p in errors(check(tmp_path, data))]
    assert any("--prompt-lookup-decoding requires --speculative" in m for m in messages)
    assert any("--prompt-lookup-decoding conflicts with --self-speculative" in m for m in messages)


def test_mtp_head_precision_may_differ_from_the_checkpoint(tmp_path: Path) -> None:
    """The book said a mixed MTP head makes gibberish; the engine certifies a bf16 head on this NVFP4
    checkpoint (MI recipes/qwen3.5/qwen3.5-35b-a3b-nvfp4.yaml@2735884), and the engine wins."""
    data = flagship_data()
    assert data["checkpoint"]["quant"] == "nvfp4" and data["serve"]["mtp-quantization"] == "bf16"
    assert errors(check(tmp_path, data)) == []
    data["serve"]["mtp-quantization"] = "fp4"
    assert "must be one of bf16, fp8, nvfp4" in one_error(check(tmp_path, data), "serve.mtp-quantization").message


def test_speculative_for_a_model_without_mtp(tmp_path: Path) -> None:
    data = flagship_data()
    data["checkpoint"]["repo"] = "ig1/Qwen3-VL-30B-A3B-Instruct-NVFP4"
    problem = one_error(check(tmp_path, data), "serve.speculative")
    assert "has no MTP weights" in problem.message


def test_no_kernel_target(tmp_path: Path) -> None:
    data = flagship_data()  # a bf16 checkpoint kernels/ does not list, named as the flagship's model
    data["checkpoint"] = {"repo": "example/Qwen3.5-35B-A3B-BF16", "quant": "bf16", "model": "qwen3.5-35b-a3b"}
    data["serve"]["mtp-quantization"] = "bf16"
    problem = one_error(check(tmp_path, data), "checkpoint.quant")
    assert "no kernel target for (gb10, qwen3.5-35b-a3b, bf16)" in problem.message


def test_unknown_checkpoint_repo(tmp_path: Path) -> None:
    data = flagship_data()
    data["checkpoint"]["repo"] = "someone/Unknown-Model"
    assert "no kernel model on gb10" in one_error(check(tmp_path, data), "checkpoint.repo").message


def test_revision_must_be_a_commit(tmp_path: Path) -> None:
    data = flagship_data()
    data["checkpoint"]["revision"] = "main"
    assert "not a 40-character commit id" in one_error(check(tmp_path, data), "checkpoint.revision").message
    data["checkpoint"]["revision"] = "a" * 40
    assert errors(check(tmp_path, data)) == []


@pytest.mark.parametrize("name,value,fragment", [
    ("METRALE_RATE_LIMT_RPM", 60, "is not a lever of engine revision 2735884"),
    ("METRALE_BENCH_ITERS", 3, "classes it Dev"),
    ("METRALE_HOME", "/tmp/x", "cannot be set in a recipe"),
    ("PATH", "/usr/bin", "not a runtime lever"),
    ("METRALE_RATE_LIMIT_RPM", "sixty", "whole number"),
])
def test_env_refusals(tmp_path: Path, name: str, value: object, fragment: str) -> None:
    data = flagship_data()
    data["env"] = {name: value}
    problem = one_error(check(tmp_path, data), f"env.{name}")
    assert fragment in problem.message
    if name == "METRALE_RATE_LIMT_RPM":
        assert "METRALE_RATE_LIMIT_RPM" in (problem.hint or "")


def test_env_declared_lever_and_passthrough_accepted(tmp_path: Path) -> None:
    data = flagship_data()
    # METRALE_FP8_ROWWISE: a Runtime gate lever of the engine's table that the old hand-written list lacked
    data["env"] = {"METRALE_RATE_LIMIT_RPM": 600, "NCCL_DEBUG": "INFO", "METRALE_FP8_ROWWISE": "1",
                   "METRALE_MTP_DCUT_RATIO": "1.0"}
    assert errors(check(tmp_path, data)) == []
    data["env"] = {"METRALE_MTP_DCUT_RATIO": "most"}
    assert "must be a number" in one_error(check(tmp_path, data), "env.METRALE_MTP_DCUT_RATIO").message


def test_resource_flag_under_serve_points_to_resources(tmp_path: Path) -> None:
    data = flagship_data()
    data["serve"]["port"] = 9000
    problem = one_error(check(tmp_path, data), "serve.port")
    assert "resources.port" in (problem.hint or "")


def test_forbidden_flag(tmp_path: Path) -> None:
    data = flagship_data()
    data["serve"]["auth-token"] = "secret"
    assert "secret does not belong in a recipe" in one_error(check(tmp_path, data), "serve.auth-token").message


def test_bind_all_interfaces_needs_auth_or_acknowledgement(tmp_path: Path) -> None:
    data = flagship_data()
    data["resources"]["bind"] = "0.0.0.0"
    problem = one_error(check(tmp_path, data), "resources.bind")
    assert "without auth" in problem.message and "expose-acknowledged" in (problem.hint or "")
    data["resources"]["expose-acknowledged"] = True
    assert errors(check(tmp_path, data)) == []
    del data["resources"]["expose-acknowledged"]
    data["serve"].update({"require-auth": True, "auth-tokens-file": "/etc/metrale/tokens"})
    assert errors(check(tmp_path, data)) == []


def test_bind_must_be_an_address(tmp_path: Path) -> None:
    data = flagship_data()
    data["resources"]["bind"] = "localhost:8888"
    assert "not an IP address" in one_error(check(tmp_path, data), "resources.bind").message


def _ep2() -> dict:
    return read(REPO / "recipes" / "qwen3.5-122b-a10b-ep2.yaml")


@pytest.mark.parametrize("override", [
    {"num-drafts": 2}, {"mtp-quantization": "nvfp4"},
])
def test_multi_rank_ranks_must_agree(tmp_path: Path, override: dict) -> None:
    data = _ep2()
    data["resources"]["ranks"][1]["serve"] = override
    probs = errors(check(tmp_path, data, "qwen3.5-122b-a10b-ep2.yaml"))
    key = next(iter(override))
    assert any(f"ranks differ in --{key}" in p.message for p in probs), [p.render() for p in probs]


def test_multi_rank_worker_dropping_speculative(tmp_path: Path) -> None:
    data = _ep2()
    data["resources"]["ranks"][1]["serve"] = {"speculative": False}
    assert errors(check(tmp_path, data, "qwen3.5-122b-a10b-ep2.yaml"))


def test_multi_rank_needs_distinct_ports_and_head_first(tmp_path: Path) -> None:
    data = _ep2()
    data["resources"]["ranks"][1]["port"] = data["resources"]["ranks"][0]["port"]
    data["resources"]["ranks"][1]["role"] = "head"
    messages = [p.message for p in errors(check(tmp_path, data, "qwen3.5-122b-a10b-ep2.yaml"))]
    assert any("must have role worker" in m for m in messages)
    assert any("each rank needs its own port" in m for m in messages)


@pytest.mark.parametrize("text,fragment", [
    ("", "the recipe is empty"),
    ("- a\n- b\n", "must be a mapping"),
    ("name: x\n", "missing the required key"),
    ("\x00\x01", "a NUL byte is not allowed"),
    ("a: &x [*x]\n", None),
])
def test_degenerate_documents(tmp_path: Path, text: str, fragment: str | None) -> None:
    probs = errors(check(tmp_path, text))
    assert probs
    if fragment:
        assert any(fragment in p.message for p in probs), [p.render() for p in probs]


def test_problem_render_names_file_line_column_key_and_hint(tmp_path: Path) -> None:
    data = flagship_data()
    data["serve"]["max-seq-length"] = 1
    problem = one_error(check(tmp_path, data), "serve.max-seq-length")
    text = problem.render()
    assert text.startswith(f"{tmp_path}/qwen3.5-35b-a3b.yaml:{problem.line}:{problem.column}: error: serve.max-seq-length:")
    assert "hint: did you mean `max-seq-len`?" in text


def test_a_recipe_built_on_a_book_variant_inherits_the_whole_chain(tmp_path: Path) -> None:
    """hopper extends the certified flagship; a recipe (or --set) built on hopper gets every pinned setting."""
    from metralectl.core.overrides import apply_sets

    cat = catalog()
    hopper = apply_sets(cat, cat.recipes["qwen3.5-35b-a3b-hopper"], ["max-seq-len=4096"])
    assert hopper.hardware == "hopper" and hopper.serve["kv-cache-dtype"] == "fp8" and len(hopper.serve) > 90
    assert hopper.deviations == (("serve.max-seq-len", 8192, 4096),)
    assert hopper.source is None or hopper.source == "book"
    text = "extends: qwen3.5-35b-a3b-hopper\nname: mine\ndescription: mine\nserve:\n  max-batch-size: 1\n"
    assert errors(check(tmp_path, text, "mine.yaml")) == []


def test_a_non_runtime_lever_names_the_runtime_one_it_resembles(tmp_path: Path) -> None:
    data = flagship_data()
    data["env"] = {"METRALE_HOME": "/tmp/x"}
    problem = one_error(check(tmp_path, data), "env.METRALE_HOME")
    assert "cannot be set in a recipe" in problem.message and "Runtime" in (problem.hint or "")
