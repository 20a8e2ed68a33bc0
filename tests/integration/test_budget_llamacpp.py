"""The memory budget with real engines (issue 32 item 2): llama.cpp's real `llama-server` as host processes (the
tiny random-weight GGUF under three repositories, three recipes answering to distinct names), driven through the
real CLI on a box without Docker (tests/integration/test_llamacpp_process.py's ProcBox).

`run` of a second recipe that fits the budget beside the first starts it beside, on a port of its own; a third that
does not fit is refused with the numbers and the fixes; `ps` lists both; `stop` without a name is a usage error
(64) listing them; `stop R` and `stop --all` act as told.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.test_llamacpp_process import (SECOND, TINY, ProcBox, _builder, _copy_repo, _verified,
                                                      llama_server)

pytestmark = [pytest.mark.integration]
THIRD = "metralectl-test/tiny-llama-gguf-c"
FOOTPRINT = 0.53  # GB: the tiny recipes' fit estimate (qwen2.5-0.5b's data, Q8_0); the engines' RSS is below it
__all__ = ["llama_server"]


@pytest.fixture(scope="module")
def hf_three(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf")
    hub = home / "hub"
    summary = _builder().install(hub)
    _verified(hub, TINY)
    _copy_repo(hub, summary, SECOND)
    _copy_repo(hub, summary, THIRD)
    return home


@pytest.fixture()
def box(tmp_path: Path, hf_three: Path, llama_server: Path) -> Iterator[ProcBox]:
    machine = ProcBox(tmp_path, hf_three, llama_server)
    try:
        yield machine
    finally:
        machine.cleanup()


def three(box: ProcBox, budget_gb: float) -> tuple[str, str, str]:
    """Three recipes, the first two on the same port (the second is moved beside it); box.yaml's budget."""
    (box.config / "box.yaml").write_text(f"budget: {budget_gb}  # GB\n")
    port = box.own_port()
    return (box.recipe("alpha", TINY, port, alias="tiny-alpha"), box.recipe("beta", SECOND, port, alias="tiny-beta"),
            box.recipe("gamma", THIRD, box.own_port(), alias="tiny-gamma"))


def test_run_beside_within_the_budget_and_the_refusal_with_the_numbers(box: ProcBox) -> None:
    alpha, beta, gamma = three(box, 1.2)  # two tiny models fit, three do not
    box.cli("run", alpha, check=True, timeout=300)
    second = box.cli("run", beta, "--json", timeout=300)
    assert second.returncode == 0, second.stderr
    moved = json.loads(second.stdout)
    serving = box.json("ps", "--json")["serving"]
    assert sorted((s["recipe"], s["health"]) for s in serving) == [(alpha, "ok"), (beta, "ok")], serving
    urls = {s["recipe"]: s["endpoint"] for s in serving}
    assert urls[alpha] != urls[beta] == moved["url"]
    assert len(box.engines()) == 1  # alpha on its held port; beta on the next free one, not among the held
    again = box.json("run", beta, "--json", timeout=120)  # of what serves, with these settings: done already
    assert again["already_serving"] is True and again["url"] == moved["url"]

    refused = box.cli("run", gamma, timeout=120)
    assert refused.returncode == 1, refused.stderr
    assert (f"{gamma} needs {FOOTPRINT:.2f} GB, free 0.13 GB of budget 1.20 GB (budget in " in refused.stderr
            and f"held by {alpha} {FOOTPRINT:.2f} GB, {beta} {FOOTPRINT:.2f} GB" in refused.stderr), refused.stderr
    assert f"`metralectl run {gamma} --replace`" in refused.stderr and f"`metralectl stop {alpha}`" in refused.stderr
    roomy = box.cli("run", gamma, "--budget", "2", "--json", timeout=300)  # --budget: this run's budget
    assert roomy.returncode == 0, roomy.stderr
    assert len(box.json("ps", "--json")["serving"]) == 3

    which = box.cli("stop", timeout=60)
    assert which.returncode == 64, which.stderr
    assert "3 models are served" in which.stderr and "name one or use --all" in which.stderr, which.stderr
    [stopped] = box.json("stop", beta, "--json", timeout=120)
    assert stopped["recipe"] == beta and stopped["removed"] is True
    assert sorted(s["recipe"] for s in box.json("ps", "--json")["serving"]) == [alpha, gamma]
    stopped_all = box.json("stop", "--all", "--json", timeout=120)
    assert sorted(s["recipe"] for s in stopped_all) == [alpha, gamma]
    assert box.engines() == [] and box.supervisors() == [] and box.json("ps", "--json")["serving"] == []


def _rss_gb(pid: int) -> float:
    from metralectl.lifecycle.budget import rss_bytes

    return (rss_bytes({pid}) or 0) / 1e9


def _gateway(box: ProcBox, *args: str) -> tuple[subprocess.Popen[str], str]:
    port = box.own_port()
    proc = box.popen("gateway", "--listen", f"127.0.0.1:{port}", "--json", *args)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line or json.loads(line).get("event") != "listening":  # never left running behind a failed test
        proc.kill()
        proc.wait(30)
        raise AssertionError((line, proc.stderr.read() if proc.stderr is not None else ""))
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # the status lines, never left to block it
    return proc, f"http://127.0.0.1:{port}"


def test_the_gateway_loads_on_demand_within_the_budget_and_evicts_the_lru_idle_model(box: ProcBox) -> None:
    """Three tiny models, a budget that fits two, the first pinned: a mixed workload through the gateway alternates
    the other two, forcing an eviction at each change. Every request answered 200 by the right engine (its own model
    id in the answer); a sampler of the running engines (each at the larger of its footprint and its RSS) never sees
    the budget exceeded; the pinned engine is the same process from its load to the end."""
    budget = 1.2
    (box.config / "box.yaml").write_text(f"budget: {budget}\n")
    recipes = {box.recipe(short, repo, box.own_port(), alias=f"tiny-{short}"): f"tiny-{short}"
               for short, repo in (("alpha", TINY), ("beta", SECOND), ("gamma", THIRD))}
    alpha, beta, gamma = recipes
    gateway, url = _gateway(box, "--pin", alpha, "--drain-timeout", "120")
    seen: list[float] = []
    alpha_pids: set[int] = set()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            engines = box.engines()
            seen.append(sum(max(FOOTPRINT, _rss_gb(pid)) for pid in engines))
            alpha_pids.update(pid for pid in engines if "tiny-alpha" in Path(f"/proc/{pid}/cmdline").read_bytes()
                              .decode(errors="replace"))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        listed = {(m["id"], m["status"]) for m in models}
        assert {(alpha, "loadable"), ("tiny-beta", "loadable"), (gamma, "loadable")} <= listed, listed

        def ask(name: str) -> tuple[str, int, str | None]:
            with httpx.Client(timeout=300) as client:
                answer = client.post(f"{url}/v1/chat/completions", json={
                    "model": name, "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
            return name, answer.status_code, answer.json().get("model") if answer.status_code == 200 else answer.text

        # alpha first (pinned), then beta and gamma alternating, by recipe name or alias, two clients at once
        work = [alpha] + [m for _ in range(4) for m in (beta, "tiny-gamma", alpha, "tiny-beta", gamma)]
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(ask, work))
        failed = [a for a in answers if a[1] != 200]
        assert not failed, failed
        for name, _, model in answers:
            assert model == recipes.get(name, name), (name, model)  # the engine that answered is the one asked
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        evictions = [line for line in metrics.splitlines() if line.startswith("metralectl_gateway_evictions_total")]
        assert evictions and all(alpha not in line for line in evictions), evictions
        assert sum(float(line.split()[-1]) for line in evictions) >= 4, evictions
        assert f'metralectl_gateway_loads_total{{model="{alpha}",outcome="loaded"}} 1.0' in metrics
    finally:
        stop.set()
        sampler.join()
        gateway.send_signal(signal.SIGINT)
        gateway.wait(30)
    assert seen and max(seen) <= budget, max(seen)
    assert len(alpha_pids) == 1, alpha_pids  # pinned: loaded once, never evicted


def _long_recipe(box: ProcBox, short: str, repo: str, port: int) -> str:
    """A tiny model with room for a long answer (16k context, one slot): a request that keeps it busy for seconds."""
    name = f"proc-{short}"
    (box.config / "recipes" / f"{name}.yaml").write_text(
        f"schema: 1\nname: {name}\ndescription: a long answer\nengine: llama-cpp\nruntime: process\n"
        f"checkpoint: {{repo: {repo}, quant: Q8_0, model: qwen2.5-0.5b-instruct, revision: null}}\n"
        "hardware: cpu\nimage: llama-cpp-cpu\n"
        f"serve: {{ctx-size: 16384, parallel: 1, n-gpu-layers: 0, alias: tiny-{short}, threads: 2, ui: false}}\n"
        f"resources: {{port: {port}, bind: 127.0.0.1, gpus: none, ranks: 1}}\n"
        "validated: {source: null, hardware: cpu}\n")
    return name


def test_a_busy_model_is_drained_not_killed_and_a_failed_load_leaves_the_rest_serving(box: ProcBox) -> None:
    """beta streams a long answer while gamma is asked for: gamma needs beta's room, so beta is drained — its
    answer arrives whole (every token, [DONE]) — and stopped only then; gamma answers after it. A model whose
    weights are damaged: its request gets 502 with the engine's reason, and the pinned model still answers."""
    from tests.integration.test_llamacpp_process import DAMAGED

    (box.config / "box.yaml").write_text("budget: 1.4\npin: [proc-alpha]\n")  # alpha 0.53 + beta 0.72 fit; + gamma not
    _copy_repo(box.hub, _builder().install(box.hub), DAMAGED, b"not a gguf file " * 64)
    alpha = box.recipe("alpha", TINY, box.own_port(), alias="tiny-alpha")
    beta = _long_recipe(box, "beta", SECOND, box.own_port())
    gamma = box.recipe("gamma", THIRD, box.own_port(), alias="tiny-gamma")
    broken = box.recipe("broken", DAMAGED, box.own_port(), alias="tiny-broken")
    gateway, url = _gateway(box, "--drain-timeout", "300")
    events: list[str] = []
    try:
        with httpx.Client(timeout=300) as client:
            assert client.post(f"{url}/v1/completions", json={"model": alpha, "prompt": "a", "max_tokens": 2}
                               ).status_code == 200
            first = threading.Event()

            def long_answer() -> None:
                body = {"model": beta, "prompt": "Once", "max_tokens": 4000, "stream": True, "ignore_eos": True}
                pieces, done = 0, False
                with httpx.Client(timeout=300) as own, own.stream("POST", f"{url}/v1/completions", json=body) as got:
                    assert got.status_code == 200
                    for line in got.iter_lines():
                        if line.startswith("data: "):
                            first.set()
                            done = done or line == "data: [DONE]"
                            pieces += line != "data: [DONE]"
                events.append(f"beta done {pieces} {done}")

            streaming = threading.Thread(target=long_answer)
            streaming.start()
            assert first.wait(120)
            answer = client.post(f"{url}/v1/completions", json={"model": gamma, "prompt": "b", "max_tokens": 2})
            events.append(f"gamma {answer.status_code} {answer.json().get('model') or answer.text}")
            streaming.join(300)
            assert events[0].startswith("beta done ") and events[0].endswith(" True"), events  # whole, then gamma
            assert int(events[0].split()[2]) >= 4000 and events[1] == "gamma 200 tiny-gamma", events

            failed = client.post(f"{url}/v1/completions", json={"model": broken, "prompt": "c", "max_tokens": 2})
            assert failed.status_code == 502, failed.text
            error = failed.json()["error"]
            assert error["code"] == "model_load_failed" and "corrupt-weights" in error["message"], error
            again = client.post(f"{url}/v1/completions", json={"model": "tiny-alpha", "prompt": "d", "max_tokens": 2})
            assert again.status_code == 200 and again.json()["model"] == "tiny-alpha"
    finally:
        gateway.send_signal(signal.SIGINT)
        gateway.wait(30)


def test_a_model_larger_than_the_whole_budget_is_refused_at_once_without_a_retry(box: ProcBox) -> None:
    """A budget below the tiny model's footprint: /v1/models lists it `too_large` with the numbers, and a request
    for it is answered 503 `model_too_large` with the numbers and no Retry-After, starting no engine and stopping
    none (the one already serving under another budget keeps serving)."""
    alpha = box.recipe("alpha", TINY, box.own_port(), alias="tiny-alpha")
    beta = box.recipe("beta", SECOND, box.own_port(), alias="tiny-beta")
    gateway, url = _gateway(box, "--budget", "0.5")
    try:
        listed = {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
        assert (listed[beta]["status"], listed[beta]["budget_gb"]) == ("too_large", 0.5), listed
        assert f"{listed[beta]['needs_gb']:.2f}" == f"{FOOTPRINT:.2f}", listed
        box.cli("run", alpha, "--json", check=True, timeout=300)  # by hand, under the default budget
        served = box.engines()
        assert len(served) == 1, served
        answer = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": beta, "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
        assert answer.status_code == 503 and "retry-after" not in answer.headers, (answer.status_code, answer.headers)
        error = answer.json()["error"]
        assert error["code"] == "model_too_large", error
        assert f"it needs {FOOTPRINT:.2f} GB, more than the whole budget 0.50 GB (--budget)" in error["message"], error
        assert box.engines() == served  # nothing started, nothing evicted
    finally:
        gateway.send_signal(signal.SIGINT)
        gateway.wait(30)
        box.cli("stop", "--all", timeout=120)
