#!/usr/bin/env bash
# On the lent H200: the first real-GPU lifecycle through metralectl, with llama-server run as a host process.
# Builds llama-server with CUDA (resumable), installs metralectl from the kit's wheel into a fresh venv, writes
# two random-weight F16 GGUF models (~1.9 and ~3.0 GB) and a truncated one, then drives run → top → bench →
# swap → swap to the damaged model (rolls back) → stop (lifecycle_gpu.py), summarizes and checks it, and packs
# everything into one tar under $OUT. See docs/h200.md.
#
#   (here)   bash benchmarks/h200/fetch_llamacpp_kit.sh build/h200-lifecycle
#   (device) mkdir -p /tmp/src && tar -xzf build/h200-lifecycle/src.tar.gz -C /tmp/src &&
#            KIT=$PWD/build/h200-lifecycle bash /tmp/src/benchmarks/h200/run_lifecycle_gpu.sh
#
# Env: KIT (the carried folder), OUT, WORK (build, venv and models, kept between calls on a warm machine;
# default build/h200-lifecycle-work under the current folder: ignored and not carried, so the device keeps
# it), DEADLINE_S (default 560: no lifecycle starts later than DEADLINE_S - 150), RUNS (lifecycles in this
# call, default 1), PRESET (gpu|tiny), PORT (default 18180). A CPU dry run: LLAMA_SERVER=<a built
# llama-server> (no build) PRESET=tiny NGL=0 GPUS=none CTX=1024 PARALLEL=2 THREADS=1 REPEATS=3 MAX_TOKENS=16
# BENCH_PARAMS=client_bound=warn ALLOW_NO_GPU=1 PYTHON=<a Python 3.12 like the device's>.
# Exit: 0 when every lifecycle ran and its check held; 1 otherwise (the tar is written either way).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
KIT="$(cd "${KIT:?KIT must name the carried folder (fetch_llamacpp_kit.sh made it)}" && pwd)" || exit 2
OUT="${OUT:-/tmp/h200-lifecycle-out}"
WORK="${WORK:-$PWD/build/h200-lifecycle-work}"
DEADLINE_S="${DEADLINE_S:-560}"
RUNS="${RUNS:-1}"
PRESET="${PRESET:-gpu}"
PORT="${PORT:-18180}"
PYTHON="${PYTHON:-python3}"
START=$SECONDS
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT" "$WORK"
LOG="$WORK/call-$STAMP.log"
exec > >(tee -a "$LOG") 2>&1
note() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - START))s] $*"; }
FAILED=0

{
  echo "kit: $(head -3 "$KIT/KIT.txt" 2>/dev/null | tr '\n' ' ')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  command -v nvcc >/dev/null && nvcc --version | tail -n 1
  "$PYTHON" --version; nproc; uname -r
} >"$WORK/environment.txt" 2>&1
cat "$WORK/environment.txt"

# --- 1. metralectl (and gguf) from the carried wheels, in a fresh venv ---------------------------------------
VENV="$WORK/venv"
# shellcheck source=/dev/null  # kit_venv.sh: checked on its own
source "$HERE/kit_venv.sh"
kit_venv "$VENV" || exit 1
"$VENV/bin/metralectl" --version

# --- 2. the models (once per machine), written while llama-server compiles ------------------------------------
MODELS="$WORK/models-$PRESET.json"
MODELS_PID=""
if [ ! -s "$MODELS" ]; then
  note "writing the models (preset $PRESET) beside the build"
  # not from a checkout's root: its metralectl/ would shadow the installed wheel
  (cd "$WORK" && "$VENV/bin/python" "$HERE/make_lifecycle_models.py" --hf-cache "$WORK/hf-$PRESET" \
      --preset "$PRESET" --json >"$MODELS.tmp" 2>"$WORK/models.err" && mv "$MODELS.tmp" "$MODELS") &
  MODELS_PID=$!
fi

# --- 3. llama-server with CUDA (or the given one) ---------------------------------------------------------
if [ -n "${LLAMA_SERVER:-}" ]; then
  BIN="$LLAMA_SERVER"
else
  BIN="$(KIT="$KIT" WORK="$WORK" BUDGET_S=$((DEADLINE_S - 60 - (SECONDS - START))) bash "$HERE/build_llama_server_cuda.sh")" || {
    [ -n "$MODELS_PID" ] && wait "$MODELS_PID"
    note "the build is not finished; no lifecycle this call (call again while the machine is warm)"; exit 1; }
fi
{ echo "binary: $BIN"; "$BIN" --version 2>&1 | tail -n 3; ldd "$BIN" 2>/dev/null | grep -iE "cuda|cublas" ;
  echo "build-seconds-per-call: $(paste -sd, "$WORK/build-seconds" 2>/dev/null)"; } >"$WORK/build-info.txt"
cat "$WORK/build-info.txt"

if [ -n "$MODELS_PID" ] && ! wait "$MODELS_PID"; then
  cat "$WORK/models.err"; note "FAILED: the models"; exit 1
fi
[ -s "$MODELS" ] || { note "FAILED: no models summary"; exit 1; }
note "models: $(tr -d '\n ' <"$MODELS" | cut -c1-400)"
cd "$WORK" || exit 1  # not a checkout's root: its metralectl/ would shadow the installed wheel

# --- 4. the lifecycle(s) -----------------------------------------------------------------------------------
EXTRA=()
for p in ${BENCH_PARAMS:-}; do EXTRA+=(--bench-param "$p"); done
[ -n "${THREADS:-}" ] && EXTRA+=(--threads "$THREADS")
[ -n "${RUNTIME:-}" ] && EXTRA+=(--runtime "$RUNTIME")  # docker: the same lifecycle in containers of IMAGE_REF
[ -n "${IMAGE_REF:-}" ] && EXTRA+=(--image-ref "$IMAGE_REF")
CHECK=()
[ -n "${ALLOW_NO_GPU:-}" ] && CHECK+=(--allow-no-gpu)
for i in $(seq "$RUNS"); do
  if [ $((SECONDS - START)) -gt $((DEADLINE_S - 150)) ]; then
    note "SKIPPED lifecycle $i: too close to the ${DEADLINE_S}s deadline"; FAILED=1; break
  fi
  RES="$WORK/lifecycle-$STAMP-$i"
  note "lifecycle $i of $RUNS -> $RES"
  PATH="$(dirname "$BIN"):$PATH" "$PYTHON" "$HERE/lifecycle_gpu.py" --res "$RES" --metralectl "$VENV/bin/metralectl" \
    --models "$MODELS" --engine-dir "$(dirname "$BIN")" --hardware "${HARDWARE:-hopper}" --gpus "${GPUS:-all}" \
    --ngl "${NGL:-all}" --ctx "${CTX:-8192}" --parallel "${PARALLEL:-4}" --port "$PORT" \
    --bench-repeats "${REPEATS:-10}" --max-tokens "${MAX_TOKENS:-128}" "${EXTRA[@]}" \
    --deadline $(( $(date +%s) + DEADLINE_S - (SECONDS - START) - 60 )) || FAILED=1
  cp "$WORK/environment.txt" "$WORK/build-info.txt" "$MODELS" "$RES/" 2>/dev/null
  "$PYTHON" "$HERE/summarize_lifecycle.py" "$RES" "${CHECK[@]}" --out "$RES/summary.json" --md "$RES/summary.md" \
    --label "$STAMP-$i" || FAILED=1
  cat "$RES/summary.md" 2>/dev/null
  "$PYTHON" "$HERE/check_lifecycle.py" "$RES/summary.json" >"$RES/check.out" 2>&1 || FAILED=1
  cat "$RES/check.out"
  cp "$LOG" "$RES/call.log"
  tar -czf "$OUT/h200-lifecycle-$STAMP-$i.tar.gz" -C "$WORK" "$(basename "$RES")" && note "results: $OUT/h200-lifecycle-$STAMP-$i.tar.gz"
done
if [ "$FAILED" -ne 0 ]; then note "RESULT: FAILED (see above)"; exit 1; fi
note "RESULT: every lifecycle ran and its check held"
