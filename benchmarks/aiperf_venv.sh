#!/usr/bin/env bash
# AIPerf (PyPI, with all its declared dependencies: ~1.2 GB, ~1 minute the first time) in its own venv, made once
# per machine, version and Python, cached outside the clone under /var/cache/metralectl/aiperf/<version>-py<XY>
# (benchmarks/tool_venv.sh); prints the venv's directory on stdout. .ci/run builds it before the tests.
#
#   bash benchmarks/aiperf_venv.sh
#   VENV=$(bash benchmarks/aiperf_venv.sh --print-dir)      # where it is (or would be), building nothing
#
# benchmarks/aiperf_rate_side_by_side.py runs it offline against llama-server: --tokenizer a local folder
# (tests/real_llamacpp/tiny_gguf_tokenizer.py writes the tiny GGUF's), --ui-type none.
set -euo pipefail
exec bash "$(dirname "$0")/tool_venv.sh" aiperf "${AIPERF_VERSION:-0.13.0}" \
  "${AIPERF_PYTHON:-python3}" "aiperf transformers" "$@"
