"""`metralectl bench` names the engine it measured, against llama.cpp's real `llama-server` in a container started
with plain `docker run` (not by metralectl, so the engine is what the server's answers show: bench/engine_id.py).

The server, its image and model are tests/integration/test_llamacpp_real.py's fixtures (skipped there, with the
reason, when the image is absent outside CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from tests.integration.test_llamacpp_real import REPO, Server, hf_cache, llama_image, server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_a_bench_record_names_llama_server_from_its_own_answers(server: Server) -> None:  # noqa: F811
    with urllib.request.urlopen(f"{server.url}/props", timeout=30) as answer:
        props = json.loads(answer.read())
    run = subprocess.run([sys.executable, "-m", "metralectl", "bench", "run", "decode", "--url", server.url,
                          "-p", "repeats=1", "-p", "warmup=0", "-p", "max_tokens=8", "-p", "client_bound=warn",
                          "--format", "json"], capture_output=True, text=True, cwd=REPO, env=dict(os.environ),
                         timeout=600)
    assert run.returncode == 0, run.stderr
    engine = json.loads(run.stdout)["target"]["engine"]
    assert (engine["name"], engine["source"], engine["detected"], engine["revision"]) == (
        "llama-cpp", "detected", "llama-cpp", None), engine
    # every signature the real server gives (it runs with --metrics), and its build as /props says it
    assert engine["evidence"].startswith('GET /v1/models: owned_by "llamacpp"; GET /props: default_generation_settings; '
                                         "GET /metrics: "), engine
    assert "llamacpp:* sample" in engine["evidence"] and engine["version"] == props["build_info"]
    history = subprocess.run([sys.executable, "-m", "metralectl", "bench", "history"], capture_output=True, text=True,
                             cwd=REPO, env=dict(os.environ), timeout=120)
    assert history.stdout.splitlines()[1].split()[5] == "llama-cpp", history.stdout
