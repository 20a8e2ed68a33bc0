#!/usr/bin/env bash
# llama-benchy (PyPI) in its own venv, made once per machine, version and Python, cached outside the clone
# (benchmarks/tool_venv.sh); prints the venv's directory on stdout.
#
#   bash benchmarks/llama_benchy_venv.sh               # seconds the first time (aiohttp, numpy, tokenizers, ...)
#   VENV=$(bash benchmarks/llama_benchy_venv.sh --print-dir)
#
# benchmarks/llama_benchy_side_by_side.py runs it offline: a local tokenizer.json (--tokenizer), a book already in
# its cache (~/.cache/llama-benchy/<md5 of --book-url>.txt, under a HOME of the script's), --model given (no HF
# look-up), --skip-coherence (a random tiny model does not say Paris).
set -euo pipefail
exec bash "$(dirname "$0")/tool_venv.sh" llama-benchy "${LLAMA_BENCHY_VERSION:-0.4.0}" \
  "${LLAMA_BENCHY_PYTHON:-python3}" "llama_benchy tokenizers" "$@"
