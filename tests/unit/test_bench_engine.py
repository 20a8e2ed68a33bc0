"""Every benchmark record names the engine it measured (target.engine, bench/engine_id.py): the recipe's when
metralectl serves the target, else what the server's own answers show, else "unknown" — never a guess.

The servers here are real HTTP servers on loopback: the quirky server (tests/bench_truth/quirky_server.py)
with the GET routes of llama.cpp's llama-server added (their shapes as the real one answers, pinned in
tests/real_llamacpp/README.md), and the Metrale engine double. The real llama-server and `transformers serve`
are checked in tests/integration/test_engine_identity_real.py and tests/realengines/test_engine_identity.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from metralectl.bench import engine_id, records, signed
from metralectl.bench.engine_id import Answers
from metralectl.bench.params import parse_params
from metralectl.bench.runner import Event, RunRequest, run
from metralectl.bench.suites import get_suite
from metralectl.bench.target import Control, describe
from metralectl.peers.store import known_keys
from metralectl.present.bench_view import history_table, render_compare, render_run
from tests.bench_truth.quirky_server import Habits, Seen, _Handler, _Server, quirky_server

# What llama-server answers (tests/real_llamacpp/README.md; seen on the real one, build 11434): the parts the
# detection reads, and enough else that a reader sees the shape.
LLAMA_PROPS = {"default_generation_settings": {"params": {"top_k": 40}, "n_ctx": 2048}, "total_slots": 1,
               "model_alias": "tiny-llama", "build_info": "b6500-1a2b3c4", "endpoint_metrics": True}
LLAMA_MODELS = {"object": "list", "data": [{"id": "tiny-llama", "object": "model", "created": 0,
                                            "owned_by": "llamacpp", "meta": {"n_ctx_train": 4096}}]}
LLAMA_METRICS = ("# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed\n"
                 "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 0\n"
                 "llamacpp:tokens_predicted_total 0\nllamacpp:requests_processing 0\n")


class _LlamaLike(_Handler):
    """The quirky server's streams, and llama-server's /props, /v1/models and /metrics."""

    def do_GET(self) -> None:
        if self.path == "/props":
            self._json(200, LLAMA_PROPS)
        elif self.path == "/v1/models":
            self._json(200, {**LLAMA_MODELS, "data": [{**LLAMA_MODELS["data"][0], "id": self._model()}]})
        elif self.path == "/metrics":
            data = LLAMA_METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            super().do_GET()


class _LlamaServer(_Server):
    def __init__(self, habits: Habits) -> None:
        ThreadingHTTPServer.__init__(self, ("127.0.0.1", 0), _LlamaLike)
        self.habits, self.seen, self.stop = habits, Seen(), threading.Event()


@contextmanager
def llama_like(**habits: Any) -> Iterator[str]:
    server = _LlamaServer(Habits(**habits))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


def bench(url: str, *, recipe: Any = None, managed: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Event]]:
    s = get_suite("decode")
    params = parse_params(s.id, s.schema, ["client_bound=warn", "repeats=1", "warmup=0", "max_tokens=4"])
    events: list[Event] = []
    done = run(RunRequest(s.id, params, url, recipe=recipe, managed=managed), events.append)
    return json.loads((done.directory / "run.json").read_text()), events


def engine_warnings(events: list[Event]) -> list[str]:
    return [e.message for e in events if e.kind == "warning" and "answers like" in e.message]


def flagship() -> Any:
    from metralectl.core.catalog import load_catalog

    return load_catalog().recipe("qwen3.5-35b-a3b")


# -- what the answers show (pure) ---------------------------------------------------------------------------
def test_llama_cpp_is_known_by_its_props_owner_and_metrics() -> None:
    got = engine_id.detect(Answers(models=LLAMA_MODELS, props=LLAMA_PROPS, metrics=LLAMA_METRICS))
    assert (got["name"], got["source"], got["detected"], got["version"]) == ("llama-cpp", "detected", "llama-cpp",
                                                                            "b6500-1a2b3c4")
    assert got["evidence"] == ('GET /v1/models: owned_by "llamacpp"; GET /props: default_generation_settings; '
                               "GET /metrics: 3 llamacpp:* samples")
    # any one signature is enough: llama-server without --metrics, or behind a proxy that hides /props
    assert engine_id.detect(Answers(props=LLAMA_PROPS))["name"] == "llama-cpp"
    assert engine_id.detect(Answers(models=LLAMA_MODELS))["name"] == "llama-cpp"


@pytest.mark.parametrize(("answers", "name"), [
    (Answers(serve_config={"binary_sha256": "ab", "args_sha256": "cd", "engine_version": "met 1.2"}), "metrale"),
    (Answers(metrics="metrale_requests_active 0\nmetrale_requests_total 3\n"), "metrale"),
    (Answers(models={"data": [{"id": "m", "owned_by": "vllm"}]}), "vllm"),
    (Answers(metrics="# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0\n"), "vllm"),
    (Answers(models={"data": [{"id": "m", "owned_by": "sglang"}]}), "sglang"),
    (Answers(openapi={"paths": {"/v1/chat/completions": {}, "/load_model": {}, "/reset": {}, "/health": {}}}),
     "transformers"),
])
def test_each_engines_signature(answers: Answers, name: str) -> None:
    got = engine_id.detect(answers)
    assert (got["name"], got["source"]) == (name, "detected"), got


@pytest.mark.parametrize("answers", [
    Answers(),  # nothing answered
    # transformers serve's /v1/models names the model's organisation; a proxy names itself: neither is an engine
    Answers(models={"data": [{"id": "org/m", "owned_by": "org"}]}, metrics="process_cpu_seconds_total 1\n"),
    # /hardware is an ordinary word: our own truth server answers it too, so alone it proves nothing
    Answers(models={"data": [{"id": "truth-model", "owned_by": "truth"}]}, hardware={"hardware_class": "truth-server"}),
    # FastAPI's own schema without transformers serve's routes (vLLM, SGLang and many others are FastAPI apps)
    Answers(openapi={"paths": {"/v1/chat/completions": {}, "/health": {}}}),
])
def test_no_signature_is_unknown_and_says_what_it_saw(answers: Answers) -> None:
    got = engine_id.detect(answers)
    assert (got["name"], got["source"], got["detected"]) == (None, "unknown", None)
    assert got["evidence"].startswith("the server showed no engine's signature (")


def test_two_engines_signatures_are_unknown_not_a_pick() -> None:
    got = engine_id.detect(Answers(models={"data": [{"id": "m", "owned_by": "vllm"}]}, props=LLAMA_PROPS))
    assert (got["name"], got["source"]) == (None, "unknown")
    assert "several engines" in got["evidence"] and "vllm (" in got["evidence"] and "llama-cpp (" in got["evidence"]


def test_server_text_in_the_evidence_is_escaped() -> None:
    got = engine_id.detect(Answers(models={"data": [{"id": "m", "owned_by": "evil\x1b[2J\nowner"}]}))
    assert "\x1b" not in got["evidence"] and "\n" not in got["evidence"] and "\\x1b" in got["evidence"]
    version = engine_id.detect(Answers(props={**LLAMA_PROPS, "build_info": "b1\x1b]0;pwned\x07"}))["version"]
    assert version is not None and "\x1b" not in version and "\x07" not in version


def test_the_recipe_wins_and_the_server_is_checked_against_it() -> None:
    agrees = engine_id.from_recipe("llama-cpp", "tiny", "b6500", "metralectl-tiny",
                                   engine_id.detect(Answers(props=LLAMA_PROPS)))
    assert (agrees["name"], agrees["source"], agrees["detected"], agrees["revision"], agrees["version"]) == (
        "llama-cpp", "recipe", "llama-cpp", "b6500", "b6500-1a2b3c4")
    assert agrees["evidence"].startswith("recipe tiny, served by metralectl in container metralectl-tiny; the server "
                                         "agrees (GET /props")
    assert engine_id.disagreement(agrees) is None
    differs = engine_id.from_recipe("metrale", "qwen", None, None, engine_id.detect(Answers(props=LLAMA_PROPS)))
    assert (differs["name"], differs["source"], differs["detected"], differs["version"]) == (
        "metrale", "recipe", "llama-cpp", None)  # the build it reports is another engine's: not this one's version
    assert engine_id.disagreement(differs) == "the recipe's engine is metrale, but the server answers like llama-cpp"
    silent = engine_id.from_recipe("metrale", "qwen", None, None, engine_id.detect(Answers()))
    assert engine_id.disagreement(silent) is None and "agrees" not in silent["evidence"]
    # a run gated on one recipe (`--recipe`) while another engine is measured
    assert engine_id.disagreement(agrees, "metrale") == (
        "the recipe gated on is for metrale, but metralectl serves llama-cpp there")
    detected = engine_id.detect(Answers(props=LLAMA_PROPS))
    assert engine_id.disagreement(detected, "metrale") == (
        "the recipe's engine is metrale, but the server answers like llama-cpp")
    assert engine_id.disagreement(detected, "llama-cpp") is None and engine_id.disagreement(detected) is None
    assert engine_id.disagreement(engine_id.detect(Answers()), "metrale") is None  # unknown contradicts nothing


def test_readers_of_records_from_before_engines_were_named() -> None:
    assert engine_id.describe(None) == "not recorded (a record from before metralectl named engines)"
    assert engine_id.short(None) == "-"
    assert engine_id.short(engine_id.detect(Answers())) == "?"
    line = engine_id.describe(dict(engine_id.detect(Answers(props=LLAMA_PROPS))))
    assert line == "llama-cpp (detected, build b6500-1a2b3c4: GET /props: default_generation_settings)"


# -- against real servers on loopback -------------------------------------------------------------------------
def test_describe_detects_a_llama_server_by_what_it_answers() -> None:
    with llama_like() as url, Control(url) as control:
        target = describe(control)
    assert target.engine is not None
    assert (target.engine["name"], target.engine["source"], target.engine["version"]) == (
        "llama-cpp", "detected", "b6500-1a2b3c4")
    assert "GET /props" in target.engine["evidence"] and 'owned_by "llamacpp"' in target.engine["evidence"]


def test_describe_detects_the_metrale_double_and_says_it_is_a_double() -> None:
    from tests.unit.test_engine_double_local import MARKER, Double

    double = Double("serve", "Org/Model-7B", "--model-name", "served-7b")
    try:
        assert double.wait_for(MARKER), double.text
        with Control(double.url) as control:
            target = describe(control)
    finally:
        double.stop()
    assert target.engine is not None and target.engine["name"] == "metrale", target.engine
    evidence = target.engine["evidence"]
    assert "GET /serve-config: binary_sha256, args_sha256" in evidence and "metrale_* samples" in evidence
    assert "test double" in evidence and target.engine["version"] == "met 1.0.0-beta-preview (test double)"


def test_a_record_of_an_unknown_server_says_unknown(isolated_env: Path) -> None:
    with quirky_server() as (url, _seen):
        record, _events = bench(url)
    engine = record["target"]["engine"]
    assert (engine["name"], engine["source"], engine["detected"]) == (None, "unknown", None)
    assert "no engine's signature" in engine["evidence"] and "no /props" in engine["evidence"]
    text = render_run(record)
    assert "\nengine    unknown (unknown: the server showed no engine's signature" in text


def test_a_record_of_a_detected_llama_server(isolated_env: Path) -> None:
    with llama_like() as url:
        record, events = bench(url)
    engine = record["target"]["engine"]
    assert (engine["name"], engine["source"], engine["version"], engine["revision"]) == (
        "llama-cpp", "detected", "b6500-1a2b3c4", None)
    assert not engine_warnings(events)
    assert render_run(record).splitlines()[2].startswith("engine    llama-cpp (detected, build b6500-1a2b3c4: ")


def test_a_served_recipe_names_the_engine_and_a_disagreeing_server_is_a_warning(isolated_env: Path) -> None:
    recipe = flagship()
    managed = {"recipe": recipe.name, "container": "metralectl-qwen3.5-35b-a3b", "spec_hash": "s", "url": "u"}
    with quirky_server() as (url, _seen):
        quiet, events = bench(url, recipe=recipe, managed=managed)
    engine = quiet["target"]["engine"]
    assert (engine["name"], engine["source"], engine["detected"], engine["revision"]) == (
        "metrale", "recipe", None, "2735884")
    assert engine["evidence"] == "recipe qwen3.5-35b-a3b, served by metralectl in container metralectl-qwen3.5-35b-a3b"
    assert not engine_warnings(events)
    with llama_like() as url:
        odd, events = bench(url, recipe=recipe, managed=managed)
    engine = odd["target"]["engine"]
    assert (engine["name"], engine["source"], engine["detected"]) == ("metrale", "recipe", "llama-cpp")
    assert "but the server answers like llama-cpp" in engine["evidence"]
    [warning] = engine_warnings(events)
    assert warning.startswith("the recipe's engine is metrale, but the server answers like llama-cpp")


def test_a_gate_recipe_does_not_name_the_engine_of_a_server_metralectl_does_not_serve(isolated_env: Path) -> None:
    """`--recipe` only gates: the server at --url may be anything, so its engine is what it shows."""
    with llama_like() as url:
        record, events = bench(url, recipe=flagship())
    assert (record["target"]["engine"]["name"], record["target"]["engine"]["source"]) == ("llama-cpp", "detected")
    assert [w.split(":")[0] for w in engine_warnings(events)] == [
        "the recipe's engine is metrale, but the server answers like llama-cpp"]
    # metralectl serves a catalog recipe the run is not gated on: the engine is still that recipe's
    with llama_like() as url:
        record, events = bench(url, managed={"recipe": "qwen3.5-35b-a3b-llamacpp", "container": "c"})
    engine = record["target"]["engine"]
    assert (engine["name"], engine["source"], engine["detected"]) == ("llama-cpp", "recipe", "llama-cpp")
    assert engine["evidence"].startswith("recipe qwen3.5-35b-a3b-llamacpp, served by metralectl in container c; "
                                         "the server agrees (") and not engine_warnings(events)
    with llama_like() as url:
        record, events = bench(url, recipe=flagship(), managed={"recipe": "qwen3.5-35b-a3b-llamacpp", "container": "c"})
    assert (record["target"]["engine"]["name"], record["target"]["engine"]["source"]) == ("llama-cpp", "recipe")
    assert [e.message.split(":")[0] for e in events if e.kind == "warning" and "gated on" in e.message] == [
        "the recipe gated on is for metrale, but metralectl serves llama-cpp there"]
    # metralectl serves a recipe this catalog no longer has: detection, and the evidence says why
    with llama_like() as url:
        record, _ = bench(url, managed={"recipe": "gone-recipe", "container": "c"})
    engine = record["target"]["engine"]
    assert engine["source"] == "detected" and engine["evidence"].startswith(
        "metralectl serves recipe gone-recipe there, not in this catalog; GET /v1/models")


# -- records: signed, listed, exported ------------------------------------------------------------------------
def test_the_engine_is_signed_with_the_record_and_old_records_still_verify(isolated_env: Path) -> None:
    with llama_like() as url:
        record, _ = bench(url)
    directory = records.run_dir("decode", record["run_id"])
    assert signed.verify_record(directory, known_keys()).ok
    path = directory / "run.json"
    path.write_text(path.read_text().replace('"name": "llama-cpp"', '"name": "vllm"'))
    assert not signed.verify_record(directory, known_keys()).ok  # the engine is covered like every other byte
    # a record written before engines were named, signed then: verifies, and reads as "not recorded"
    old_dir = isolated_env / "old"
    old_dir.mkdir()
    old = {"run_id": "r0", "suite": "decode", "requests_file": "requests.jsonl",
           "target": {"url": "http://127.0.0.1:8888", "model": "m", "recipe": "qwen3.5-35b-a3b"}}
    (old_dir / "run.json").write_text(json.dumps(old))
    (old_dir / "requests.jsonl").write_text("")
    assert signed.sign_run(old_dir, old) is None and signed.verify_record(old_dir, known_keys()).ok
    assert "engine    not recorded (a record from before metralectl named engines)" in render_run(old)


def test_history_export_and_compare_name_the_engine(isolated_env: Path) -> None:
    with llama_like() as url:
        llama, _ = bench(url)
    with quirky_server() as (url, _seen):
        unknown, _ = bench(url)
    old = {**unknown, "run_id": "r-old", "target": {k: v for k, v in unknown["target"].items() if k != "engine"}}
    table = history_table([llama, unknown, old]).splitlines()
    assert table[0].split()[5] == "ENGINE"
    assert [line.split()[5] for line in table[1:]] == ["llama-cpp", "?", "-"]
    csv_lines = records.export_runs_csv([llama, unknown, old]).splitlines()
    header = csv_lines[0].split(",")
    assert header[8:10] == ["engine", "engine_source"]
    assert [line.split(",")[8:10] for line in csv_lines[1:]] == [["llama-cpp", "detected"], ["", "unknown"], ["", ""]]
    compared = render_compare(llama, unknown)
    assert "engine llama-cpp" in compared and "engine ?" in compared
    assert "note: different engines (llama-cpp, ?)" in compared


def test_the_target_on_record_has_the_typed_keys_and_nothing_else() -> None:
    from dataclasses import fields

    from metralectl.bench.run_record import EngineIdentity, TargetRecord
    from metralectl.bench.target import Target

    assert [f.name for f in fields(Target)] == list(TargetRecord.__annotations__)
    written = Target("http://x", "m", engine=engine_id.detect(Answers(props=LLAMA_PROPS))).to_json()
    assert list(written) == list(TargetRecord.__annotations__) and written["engine"] is not None
    assert set(written["engine"]) == EngineIdentity.__required_keys__
