#!/usr/bin/env bash
# A peer benchmark tool from the package index in its own venv, made once per machine, tool version and Python,
# cached outside the clone under /var/cache/metralectl/<tool>/<version>-py<XY> (the way
# tests/realengines/vllm_cpu_venv.sh caches vLLM; ~/.cache/metralectl when /var/cache is not writable); prints the
# venv's directory on stdout. Shared by benchmarks/llama_benchy_venv.sh and benchmarks/aiperf_venv.sh.
#
#   bash benchmarks/tool_venv.sh TOOL VERSION PYTHON IMPORTS [--print-dir]
#
# TOOL is the distribution (installed as TOOL==VERSION), its console script bin/TOOL; IMPORTS the modules
# checked after the install (space-separated). A venv is used only when its install completed (.complete);
# a lock keeps two callers from building it at once. The pip log: <dir>.log; the resolved set: <dir>/freeze.txt.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: tool_venv.sh TOOL VERSION PYTHON IMPORTS [--print-dir]" >&2; exit 2; }
TOOL="$1" VERSION="$2" PY="$3" IMPORTS="$4"
tag="$("$PY" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
root=/var/cache/metralectl
if ! { mkdir -p "$root" 2>/dev/null && [ -w "$root" ]; }; then root="${XDG_CACHE_HOME:-$HOME/.cache}/metralectl"; fi
dir="$root/$TOOL/$VERSION-$tag"
if [ "${5:-}" = "--print-dir" ]; then echo "$dir"; exit 0; fi
say() { echo "$TOOL-venv: $*" >&2; }
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ -f "$dir/.complete" ] && [ -x "$dir/bin/$TOOL" ]; then echo "$dir"; exit 0; fi
rm -rf "$dir"
log="$dir.log"
say "installing $TOOL==$VERSION into $dir (once per machine)"
"$PY" -m venv "$dir"
if ! "$dir/bin/python" -m pip install -q --disable-pip-version-check "$TOOL==$VERSION" >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
  say "installing $TOOL==$VERSION failed (whole log: $log)"
  exit 1
fi
for m in $IMPORTS; do "$dir/bin/python" -c "import $m" >&2; done
"$dir/bin/python" -m pip freeze --disable-pip-version-check > "$dir/freeze.txt"
touch "$dir/.complete"
say "done: $dir"
echo "$dir"
