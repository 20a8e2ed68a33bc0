"""engine/vllm.yaml's log phases and failure signatures against lines the real vLLM 0.32.0 (CPU build) wrote:
a start on a tiny Llama, and six failed starts (a Python without vLLM, no snapshot, a truncated .safetensors, a
max-model-len the KV cache cannot hold, the port in use, an unknown flag). The lines are quoted as the server logged them."""

from __future__ import annotations

import pytest

from metralectl.lifecycle.boot import BootLog, message_of
from tests.unit.recipe_helpers import catalog

PORT = 18731
BOOT = [
    "(APIServer pid=31051) INFO 12-03 19:37:59 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': "
    "18731, 'model': 'metralectl-test/tiny-llama-vllm', 'dtype': 'float32', 'max_model_len': 1024}",
    "(Worker pid=32624) INFO 12-03 19:38:31 [cpu_model_runner.py:68] Starting to load model /tmp/vobs/hf/hub/"
    "models--metralectl-test--tiny-llama-vllm/snapshots/0000000000000000000000000000000000000000...",
    "(Worker pid=32624) INFO 12-03 19:38:31 [default_loader.py:501] Loading weights took 0.01 seconds",
    "(Worker pid=32624) INFO 12-03 19:38:32 [cpu_model_runner.py:87] Warming up model for the compilation...",
    "(EngineCore pid=32591) INFO 12-03 19:39:06 [kv_cache_utils.py:2327] CPU KV cache size: 262,144 tokens, "
    "Maximum concurrency for 1,024 tokens per request: 256.00x",
    "(APIServer pid=31051) INFO 12-03 19:39:08 [entry.py:140] Starting vLLM server on http://127.0.0.1:18731",
    "INFO:     Application startup complete.",
]
FAILURES = {
    "engine-missing": ["/usr/bin/python3: Error while finding module specification for 'vllm.entrypoints.openai."
                       "api_server' (ModuleNotFoundError: No module named 'vllm')"],
    "no-weights": ["huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot "
                   "folder for the specified revision on the local disk and outgoing traffic has been disabled. "
                   "To enable repo look-ups and downloads online, pass 'local_files_only=False' as input.",
                   "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                   "{'EngineCore': 1}"],
    "corrupt-weights": ["(Worker pid=9315) ERROR 12-03 19:40:44 [multiproc_executor.py:953] safetensors._safetensors"
                        "_rust.SafetensorError: Error while deserializing header: incomplete metadata, file not "
                        "fully covered",
                        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                        "{'EngineCore': 1}"],
    "kv-cache-too-small": [
        "(EngineCore pid=13056) ERROR 12-03 19:42:20 [core.py:1510] ValueError: To serve at least one request with "
        "the model's max seq len (400000), (1.53 GiB KV cache is needed, which is larger than the available KV cache "
        "memory (1.0 GiB). Based on the available memory, the estimated maximum model length is 262016. Try "
        "increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
        "`max_model_len` when initializing the engine.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore': 1}"],
    "port-in-use": ["OSError: [Errno 98] Address already in use"],
    "bad-flag": ["api_server.py: error: unrecognized arguments: --bogus-flag"],
}


def _log() -> BootLog:
    return BootLog(catalog().engines["vllm"], "127.0.0.1", PORT)


def test_the_prefix_is_cut_from_every_process_s_lines() -> None:
    prefix = catalog().engines["vllm"].log_prefix
    assert message_of(BOOT[5], prefix) == "Starting vLLM server on http://127.0.0.1:18731"
    assert message_of(BOOT[4], prefix).startswith("CPU KV cache size: 262,144 tokens")
    assert message_of(BOOT[1], prefix).startswith("Starting to load model /tmp/vobs/hf/hub/")


def test_a_real_start_goes_through_its_phases_to_ready() -> None:
    log = _log()
    phases = [phase for line in BOOT if (phase := log.feed(line))]
    assert phases == ["loading", "loaded", "warm-up", "kv-sizing", "ready"]
    assert log.ready_line_seen and log.failure is None


def test_another_servers_ready_line_is_not_ours() -> None:
    log = BootLog(catalog().engines["vllm"], "127.0.0.1", PORT + 1)
    log.feed(BOOT[5])
    assert not log.ready_line_seen


@pytest.mark.parametrize("cause", sorted(FAILURES))
def test_a_failed_start_is_named_from_the_line_that_says_why(cause: str) -> None:
    log = _log()
    for line in FAILURES[cause]:
        log.feed(line)
    assert log.failure is not None and log.failure.cause == cause, log.failure
    assert log.failure.remedy
