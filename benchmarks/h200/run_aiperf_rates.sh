#!/usr/bin/env bash
# On the lent H200: metralectl's `rate` suite beside AIPerf 0.13.0 on one llama-server built with CUDA (issue 34
# item 6). Builds llama-server (resumable, kept in WORK), installs metralectl and gguf from the kit's wheels into a
# fresh venv and AIPerf from wheels-aiperf/ into another, writes the 1b random Llama GGUF (once per machine), then
# runs benchmarks/aiperf_rate_side_by_side.py: the rates in turn, both tools per rate, prompts matched on the
# server's count. JSON, markdown and a tar of the logs land under $OUT.
#
#   (here)   AIPERF=1 bash benchmarks/h200/fetch_llamacpp_kit.sh build/h200-aiperf
#   (device) mkdir -p /tmp/src && tar -xzf build/h200-aiperf/src.tar.gz -C /tmp/src &&
#            KIT=$PWD/build/h200-aiperf bash /tmp/src/benchmarks/h200/run_aiperf_rates.sh
#
# A fresh machine spends ~230-280 s compiling llama-server; when the build and the sweep do not fit one call, the
# call ends after the build (exit 1, "call again") and the same command on the still-warm machine goes straight
# to the sweep. Env: KIT, OUT, WORK (default build/h200-aiperf-work under the current folder: ignored, not
# carried, kept on a warm machine), DEADLINE_S (default 570), RATES (default 4,8,16,32 requests/s: the 1b Q8_0
# model served ~26-29 requests/s of 128/128 at 64 streams), ARRIVAL (constant), PROMPT (128 server-side tokens),
# OSL (128), DURATION_S (10), WARMUP_S (2), NP (64 slots), CTX (65536), NGL (99), PRESET (1b), THREADS
# (llama-server -t; 0: its default), PYTHON.
# CPU dry run: LLAMA_SERVER=<built llama-server> NGL=0 THREADS=1 PRESET=tiny NP=4 CTX=4096 RATES=2,4 DURATION_S=3
# OSL=16 PYTHON=<a Python 3.12 like the device's> (THREADS=1 on 2 cores: a server computing on every core starves
# the clients, metralectl's TTFT p50 then read 228 ms against 3.6 ms with one thread).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TREE="$(cd "$HERE/../.." && pwd)"
KIT="$(cd "${KIT:?KIT must name the carried folder (AIPERF=1 fetch_llamacpp_kit.sh made it)}" && pwd)" || exit 2
OUT="${OUT:-/tmp/aiperf-rates-out}"
WORK="${WORK:-$PWD/build/h200-aiperf-work}"
DEADLINE_S="${DEADLINE_S:-570}"
RATES="${RATES:-4,8,16,32}" ARRIVAL="${ARRIVAL:-constant}" PROMPT="${PROMPT:-128}" OSL="${OSL:-128}"
DURATION_S="${DURATION_S:-10}" WARMUP_S="${WARMUP_S:-2}" NP="${NP:-64}" CTX="${CTX:-65536}" NGL="${NGL:-99}"
PRESET="${PRESET:-1b}" PYTHON="${PYTHON:-python3}" THREADS="${THREADS:-0}"
START=$SECONDS
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RES="$WORK/results-$STAMP"
mkdir -p "$OUT" "$RES"
exec > >(tee -a "$RES/run.log") 2>&1
note() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - START))s] $*"; }
left() { echo $((DEADLINE_S - (SECONDS - START))); }
RC=1
# shellcheck disable=SC2317  # runs from the EXIT trap
finish() {
  echo "rc=$RC elapsed=$((SECONDS - START))s rates=$RATES arrival=$ARRIVAL prompt=$PROMPT osl=$OSL duration=$DURATION_S np=$NP" \
    >"$RES/SUMMARY.txt"
  cp -f "$RES/SUMMARY.txt" "$OUT/" 2>/dev/null
  tar -czf "$OUT/aiperf-rates-$STAMP.tar.gz" --exclude=hub --exclude='*.gguf' --exclude=mvenv --exclude=whl \
    -C "$WORK" "$(basename "$RES")" 2>/dev/null
  note "results: $OUT (rc $RC)"
  exit "$RC"
}
trap finish EXIT

{
  echo "kit: $(head -3 "$KIT/KIT.txt" 2>/dev/null | tr '\n' ' ')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  "$PYTHON" --version; nproc
} >"$RES/environment.txt" 2>&1
cat "$RES/environment.txt"

# --- 1. metralectl + gguf (kit wheels) and AIPerf (wheels-aiperf, --no-deps), each in a fresh venv -------------
VENV="$WORK/venv"
# shellcheck source=/dev/null  # kit_venv.sh: checked on its own
source "$HERE/kit_venv.sh"
kit_venv "$VENV" || exit 1
AVENV="$WORK/venv-aiperf"
if [ ! -x "$AVENV/bin/aiperf" ]; then
  compgen -G "$KIT/wheels-aiperf/aiperf-*.whl" >/dev/null || { note "no wheels-aiperf/ in the kit (AIPERF=1)"; exit 1; }
  note "AIPerf's venv (--system-site-packages: the device's transformers, tokenizers, aiohttp deps, pillow, uvloop)"
  rm -rf "$AVENV"
  "$PYTHON" -m venv --system-site-packages "$AVENV" || exit 1
  parent="$("$PYTHON" -c 'import site, sys; print(site.getsitepackages()[0] if sys.prefix != sys.base_prefix else "")')"
  [ -n "$parent" ] && "$AVENV/bin/python" -c "import site, sys; open(site.getsitepackages()[0] + '/parent-site.pth', 'w').write(sys.argv[1] + '\n')" "$parent"
  "$AVENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$KIT"/wheels-aiperf/*.whl \
    || { note "FAILED: installing AIPerf"; rm -rf "$AVENV"; exit 1; }
fi
(cd "$RES" && "$AVENV/bin/python" -c 'import aiperf, transformers, importlib.metadata as m; print("aiperf", m.version("aiperf"), "transformers", transformers.__version__)') \
  || { note "FAILED: AIPerf does not import"; exit 1; }

# --- 2. llama-server with CUDA (resumable), the model beside it ------------------------------------------------
MODEL="$WORK/model-$PRESET.json"
MODEL_PID=""
if [ ! -s "$MODEL" ]; then
  (cd "$WORK" && "$VENV/bin/python" "$TREE/tests/real_llamacpp/build_tiny_gguf.py" --hf-cache "$WORK/hf" --preset "$PRESET" \
      --json >"$MODEL.tmp" 2>"$RES/model.err" && mv "$MODEL.tmp" "$MODEL") &
  MODEL_PID=$!
fi
if [ -n "${LLAMA_SERVER:-}" ]; then
  BIN="$LLAMA_SERVER"
else
  BIN="$(KIT="$KIT" WORK="$WORK" BUDGET_S=$(( $(left) - 20 )) bash "$HERE/build_llama_server_cuda.sh")" || {
    [ -n "$MODEL_PID" ] && wait "$MODEL_PID"
    note "the build is not finished: call again while the machine is warm (it resumes)"; exit 1; }
fi
"$BIN" --version >"$RES/build-info.txt" 2>&1
cat "$RES/build-info.txt"
if [ -n "$MODEL_PID" ] && ! wait "$MODEL_PID"; then cat "$RES/model.err"; note "FAILED: the model"; exit 1; fi
GGUF="$("$VENV/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["file"])' "$MODEL")"

# --- 3. the sweep: both tools per rate ---------------------------------------------------------------------------
budget=$(( $(left) - 10 ))
n_rates=$(tr ',' '\n' <<<"$RATES" | wc -l)
need=$(python3 -c "print(int($n_rates * (2 * ($DURATION_S + $WARMUP_S) + 15) + 40))")
note "the sweep: rates $RATES, ~${need}s needed, ${budget}s left"
if [ "$budget" -lt "$need" ]; then
  note "not enough time left for the whole sweep in this call: call again (the build, venvs and model are kept)"; exit 1
fi
cd "$RES" || exit 1  # not a checkout's root: its metralectl/ would shadow the installed wheel
timeout --kill-after=10 "$budget" "$VENV/bin/python" "$TREE/benchmarks/aiperf_rate_side_by_side.py" \
  --aiperf-venv "$AVENV" --llama-server "$BIN" --gguf "$GGUF" --metralectl "$VENV/bin/python" \
  --rates "$RATES" --arrival "$ARRIVAL" --prompt-tokens "$PROMPT" --osl "$OSL" --duration-s "$DURATION_S" \
  --warmup-s "$WARMUP_S" --slots "$NP" --ctx "$CTX" --threads "$THREADS" --server-arg="-ngl=$NGL" --workdir "$RES/sbs" \
  --json "$OUT/aiperf_rates.json" --md "$OUT/aiperf_rates.md"
RC=$?
[ "$RC" = 124 ] && note "the sweep ran out of time: fewer RATES or a shorter DURATION_S"
exit "$RC"
