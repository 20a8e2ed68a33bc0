"""llama.cpp's real `llama-server`, driven by metralectl through its whole lifecycle, and its flags held
against the real binary.

Nothing here is a double except the Metrale engine double the swap goes to and back from. The image
`metralectl-test/llama-server:<version>` holds llama-server built from llama.cpp's source
(scripts/build-llama-server.sh, tests/real_llamacpp/image.sh); the model is the tiny random-weight GGUF of
tests/real_llamacpp/build_tiny_gguf.py, in this box's Hugging Face cache, verified as `metralectl pull`
leaves it; the recipe is an ordinary user recipe of the `llama-cpp` engine (engine/llama-cpp.yaml).

run → ready → ps / logs → top reads its llamacpp:* series → bench decode and concurrency-sweep, every request
ok with the server's own token counts → swap to the Metrale double and back → a swap to a llama.cpp recipe
whose model file is damaged rolls back → stop.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import TEST_HARDWARE, Box

pytestmark = [pytest.mark.docker, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "build-llama-server.sh"
IMAGE_SH = REPO / "tests" / "real_llamacpp" / "image.sh"
BAD_REPO = "metralectl-test/damaged-llama-gguf"


def _fail_or_skip(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


def _version() -> str:
    return subprocess.run(["bash", str(BUILD), "--print-version"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def llama_image(docker_daemon: None) -> str:
    image = f"metralectl-test/llama-server:{_version()}"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        packed = subprocess.run(["bash", str(IMAGE_SH), "--no-build", "--quiet"], capture_output=True, text=True,
                                timeout=300)
        if packed.returncode != 0:
            _fail_or_skip(f"no image {image} and no built llama-server to package: run "
                          f"`bash tests/real_llamacpp/image.sh` (builds llama.cpp once). {packed.stderr[-300:]}")
    return image


def _verified(hub: Path, repo: str) -> None:
    """Record the snapshot's files as verified, exactly as `metralectl pull` leaves them."""
    from metralectl.seams.hf import cache as hfcache, listing as hflisting

    base = hub / ("models--" + repo.replace("/", "--"))
    commit = (base / "refs" / "main").read_text().strip()
    snap = base / "snapshots" / commit
    files = [hflisting.RepoFile(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
             for p in sorted(snap.iterdir())]
    hfcache.write_json_atomic(snap / hfcache.VERIFIED_MANIFEST, hflisting.Listing(repo, commit, tuple(files)).to_json())


def _install_models(box: Box) -> dict[str, Any]:
    """The tiny GGUF, and a copy of it under another repo whose file is not a GGUF at all (the engine
    refuses to load it), both verified in the box's HF cache."""
    try:
        import gguf  # noqa: F401  (the writer's dependency)
    except ImportError:
        _fail_or_skip("the `gguf` package is missing (scripts/bootstrap.sh installs tests/realengines/requirements.txt)")
    sys.path.insert(0, str(REPO / "tests" / "real_llamacpp"))
    import build_tiny_gguf

    hub = box.home / "hf" / "hub"
    summary = build_tiny_gguf.install(hub)
    _verified(hub, summary["repo"])
    bad = hub / ("models--" + BAD_REPO.replace("/", "--"))
    snap = bad / "snapshots" / summary["revision"]
    snap.mkdir(parents=True)
    (snap / Path(summary["file"]).name).write_bytes(b"not a gguf file " * 64)
    (bad / "refs").mkdir()
    (bad / "refs" / "main").write_text(summary["revision"])
    _verified(hub, BAD_REPO)
    return summary


def _llama_recipe(box: Box, short: str, repo: str, port: int) -> str:
    name = f"{box.prefix}-{short}"
    (box.config / "recipes" / f"{name}.yaml").write_text(
        f"schema: 1\nname: {name}\ndescription: a tiny GGUF on the real llama-server\nengine: llama-cpp\n"
        f"checkpoint: {{repo: {repo}, quant: Q8_0, model: qwen3.5-35b-a3b, revision: null}}\n"
        f"hardware: {TEST_HARDWARE}\nimage: llama-test\n"
        "serve: {ctx-size: 1024, parallel: 2, n-gpu-layers: 0, alias: tiny-llama, threads: 2, ui: false}\n"
        f"resources: {{port: {port}, bind: 127.0.0.1, gpus: none, ranks: 1}}\n"
        f"validated: {{source: null, hardware: {TEST_HARDWARE}}}\n")
    return name


def _json(out: subprocess.CompletedProcess[str]) -> Any:
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout)


def _requests(box: Box, record: dict[str, Any]) -> list[dict[str, Any]]:
    [run_dir] = (box.home / "metrale" / "runs").glob(f"*/{record['run_id']}")
    return [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]


def test_llama_server_through_the_whole_lifecycle(box: Box, llama_image: str) -> None:
    (box.config / "images" / "llama-test.yaml").write_text(
        f"schema: 1\nid: llama-test\nref: {llama_image}\nengine: llama-cpp\nhardware: [{TEST_HARDWARE}]\n"
        "platform: linux/amd64\nrevision-label: org.opencontainers.image.version\n")
    model = _install_models(box)
    # Held for the whole test: every swap stops one engine and starts the next on this port, and in between
    # nothing listens there. llama-server and the double set SO_REUSEADDR, so each binds beside the held
    # socket (test_llamacpp_real.py checks llama-server does); no other program can take it meanwhile.
    port = box.own_port()
    llama = _llama_recipe(box, "llama", model["repo"], port)
    damaged = _llama_recipe(box, "damaged", BAD_REPO, port)
    double = box.recipe("double", port=port)
    box.weights_complete()  # the double's checkpoint

    # the exact docker run, llama.cpp's way: --hf-repo REPO:QUANT, the launcher's --offline --metrics
    printed = box.cli("run", llama, "--print", check=True).stdout
    assert f"--hf-repo {model['repo']}:Q8_0" in printed and "--offline --metrics" in printed, printed
    assert "-e HF_HUB_OFFLINE=1" in printed and "--no-ui" in printed, printed

    run = box.cli("run", llama, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "loading" in run.stderr and "ready" in run.stderr, run.stderr  # its own log phases, read from data
    url = f"http://127.0.0.1:{port}"

    ps = _json(box.cli("ps", "--json", check=True))
    [served] = [s for s in ps["serving"] if s["recipe"] == llama]
    assert served["state"] == "running" and served["health"] == "ok", served
    logs = box.cli("logs", llama, check=True)
    assert "llama_server: model loaded" in logs.stdout and f"listening on http://127.0.0.1:{port}" in logs.stdout

    # bench decode: every request ok, tokens as the server counted them
    decode = box.cli("bench", "run", "decode", "--url", url, "-p", "client_bound=warn", "--format", "json",
                     timeout=600)
    record = _json(decode)
    lines = _requests(box, record)
    assert decode.returncode == 0 and record["status"] == "completed", decode.stderr
    assert lines and all(r["ok"] for r in lines), [(r["error_kind"], r["error"]) for r in lines if not r["ok"]]
    assert all(r["count_method"] in {"usage", "continuous-usage"} for r in lines if r["phase"] == "measure")
    assert all(r["output_tokens"] == r["asked_tokens"] for r in lines if r["phase"] == "measure")

    # the sweep sizes its prompts with the engine's own template + tokenizer (llama.cpp's /tokenize reads no
    # `messages`), so every prompt has the length asked for and fits the slot
    sweep = box.cli("bench", "run", "concurrency-sweep", "--url", url, "-p", "concurrencies=1,2", "-p", "isls=64",
                    "-p", "osl=16", "-p", "duration_s=2", "-p", "warmup_s=0.5", "-p", "client_bound=warn",
                    "--format", "json", timeout=600)
    swept = _json(sweep)
    sweep_lines = _requests(box, swept)
    assert sweep.returncode == 0 and swept["status"] == "completed", sweep.stderr
    lost = [(r["phase"], r["error"]) for r in sweep_lines if not r["ok"]
            and not (r["phase"] != "measure" and str(r["error"]).startswith("cancelled: unmeasured"))]
    assert sweep_lines and not lost, lost[:3]  # only load outside the measured window is cut short, by design
    assert swept["prompt_sizing"]["64"] == {"method": "tokenize", "tokens": 64}, swept["prompt_sizing"]
    measured = [r for r in sweep_lines if r["phase"] == "measure" and r.get("prompt_tokens") is not None]
    assert measured and all(r["prompt_tokens"] == 64 for r in measured), {r["prompt_tokens"] for r in measured}

    # top reads llama.cpp's own series through engine/llama-cpp.yaml's mapping
    top = _json(box.cli("top", "--once", "--json", "--url", url, "--interval", "0.5", check=True, timeout=60))
    [engine] = [e for e in top["engines"] if e["url"] == url]
    assert engine["engine"] == "llama-cpp" and engine["state"] == "ok", engine
    assert engine["requests_active"] == 0 and engine["requests_waiting"] == 0, engine
    assert engine["totals"]["generation_tokens"] >= sum(r["output_tokens"] for r in lines if r["ok"]), engine
    assert engine["totals"]["prompt_tokens"] > 0, engine

    # swap across engines and back: the served address stays, each engine is seen ready its own way
    to_double = _json(box.cli("swap", double, "--json", timeout=300))
    assert to_double["outcome"] == "swapped", to_double
    back = _json(box.cli("swap", llama, "--json", timeout=300))
    assert back["outcome"] == "swapped", back
    assert "llama_server: model loaded" in box.cli("logs", llama, check=True).stdout

    # a llama.cpp recipe whose model file is damaged: the swap fails, says why, and llama serves again
    failed = box.cli("swap", damaged, "--json", timeout=300)
    result = _json(failed)
    assert failed.returncode == 1 and result["outcome"] == "rolled-back", result
    assert f"the previous recipe {llama} serves again" in failed.stderr, failed.stderr
    assert "corrupt-weights" in failed.stderr or "not a GGUF" in failed.stderr, failed.stderr
    serving = _json(box.cli("ps", "--json", check=True))["serving"]
    assert [(s["recipe"], s["health"]) for s in serving] == [(llama, "ok")], serving

    stop = box.cli("stop", "--json", check=True, timeout=120)
    stopped = _json(stop)
    assert stopped and all(s["memory"] for s in (stopped if isinstance(stopped, list) else stopped["stopped"]))
    assert box.containers(all_=True) == [], box.containers(all_=True)


def test_every_declared_flag_is_an_option_of_the_real_binary(llama_image: str) -> None:
    """The pinned --help (engine/llama-cpp/<rev>/help.txt) is the binary's, and every flag the engine file
    declares, under every spelling metralectl writes, is one of its options."""
    from metralectl.core import help_dump
    from metralectl.core.catalog import load_catalog

    contract = load_catalog(use_cache=False, include_user=False).engines["llama-cpp"]
    revision = contract.revision(None)
    assert revision is not None
    live = subprocess.run(["docker", "run", "--rm", "--network", "none", llama_image, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert live.returncode == 0, live.stderr
    options = help_dump.options_of(live.stdout + live.stderr)
    pinned = help_dump.load(REPO / "engine" / "llama-cpp" / _version() / "help.txt")
    assert options == pinned.options, sorted(options ^ pinned.options)
    for spec in contract.flags.values():
        for option in (spec.option, *(f"--{a}" for a in spec.aliases), *([f"--{spec.negation}"] if spec.negation else [])):
            assert option in options, option


def test_an_unknown_or_misspelt_llama_flag_is_refused_with_file_line_and_a_suggestion(tmp_path: Path) -> None:
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(
        "schema: 1\nname: typo\ndescription: misspelt flags\nengine: llama-cpp\n"
        "checkpoint: {repo: unsloth/Qwen3.5-35B-A3B-GGUF, quant: UD-Q4_K_XL, model: qwen3.5-35b-a3b, revision: null}\n"
        "hardware: gb10\nimage: llama-cpp-gb10\nserve:\n  ctx-size: 4096\n  paralel: 2\n  n-gpu-layers: all\n"
        "  no-cont-batching: true\n"
        "resources: {port: 8080, bind: 127.0.0.1, gpus: all, ranks: 1}\nvalidated: {source: null, hardware: gb10}\n")
    out = subprocess.run([sys.executable, "-m", "metralectl", "recipes", "check", str(recipe)], capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 65, out.stderr
    assert f"{recipe}:10:" in out.stderr and "--paralel" in out.stderr and "did you mean `parallel`" in out.stderr
    assert f"{recipe}:12:" in out.stderr and "`cont-batching: false`" in out.stderr
    assert "missing --parallel" in out.stderr
    assert "Traceback" not in out.stderr
