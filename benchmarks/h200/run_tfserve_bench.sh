#!/usr/bin/env bash
# On the lent H200 (from the repository root, with carry: [".whl"] from fetch_wheels.sh): serve a
# ~0.73B random-weight bf16 Llama with Hugging Face `transformers serve` on cuda:0, then run
# metralectl's benchmarks and AIPerf against it, rung for rung, and put everything in one tar under
# $OUT. See benchmarks/h200/README.md.
#
#   bash benchmarks/h200/run_tfserve_bench.sh [--mode plain|cb] [--eos suppressed|natural]
#                                             [--cpu --tiny] [--skip-metralectl] [--skip-aiperf]
#
# --mode cb serves with --continuous-batching (batched streams; plain runs one request at a time).
# --cpu --tiny: the same steps on a CPU with the tiny test model and short runs (the dry run).
# Env: OUT (default /tmp/tfserve-bench-out), PYTHON (the interpreter with torch + transformers,
# default python3), WHEELS (default .whl), WORK (venv + model cache, default /tmp/tfserve-bench),
# DEADLINE_S (stop starting steps after this many seconds, default 540: the device kills at 600),
# TFSERVE_SYSTEM_SITE (dry runs only: a site-packages directory the venv sees as if it were the
# system's, to stand in for the H200's preinstalled packages).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
MODE=plain EOS=suppressed DEVICE=cuda:0 PRESET=h200 QUICK=0 DO_METRALECTL=1 DO_AIPERF=1
while [ $# -gt 0 ]; do
  case "$1" in
    --mode) MODE=$2; shift 2 ;;
    --eos) EOS=$2; shift 2 ;;
    --cpu) DEVICE=cpu; shift ;;
    --tiny) PRESET=tiny; QUICK=1; shift ;;
    --skip-metralectl) DO_METRALECTL=0; shift ;;
    --skip-aiperf) DO_AIPERF=0; shift ;;
    *) echo "run_tfserve_bench: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
case "$MODE" in plain) SERVE_EXTRA=() ;; cb) SERVE_EXTRA=(--continuous-batching) ;;
  *) echo "run_tfserve_bench: --mode is plain or cb, not $MODE" >&2; exit 2 ;; esac
OUT="${OUT:-/tmp/tfserve-bench-out}"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-.whl}"
WORK="${WORK:-/tmp/tfserve-bench}"
DEADLINE_S="${DEADLINE_S:-540}"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RES="$WORK/results-$MODE-$STAMP"
VENV="$WORK/venv"
START=$SECONDS
mkdir -p "$OUT" "$RES"
exec > >(tee -a "$RES/run.log") 2>&1
declare -a STEPS=()  # "name rc seconds"
FAILED=0

note() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - START))s] $*"; }
over_deadline() { [ $((SECONDS - START)) -ge "$DEADLINE_S" ]; }
# step NAME BUDGET_S CMD...: run one step with a time budget, log it, record its exit status.
step() {
  local name=$1 budget=$2; shift 2
  if over_deadline; then
    note "SKIPPED $name: past the ${DEADLINE_S}s deadline"; STEPS+=("$name skipped 0"); FAILED=1; return 1
  fi
  local left=$((DEADLINE_S - (SECONDS - START)))
  [ "$budget" -gt "$left" ] && budget=$left
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

PIDFILE="$WORK/server.pid"
# shellcheck disable=SC2317  # runs from the EXIT trap
finish() {
  if [ -f "$PIDFILE" ]; then
    "$VENV/bin/python" tests/realengines/transformers_serve.py down --pidfile "$PIDFILE" || true
  fi
  cp -f "$RES"/server/*.log "$RES/" 2>/dev/null || true
  {
    echo "mode=$MODE eos=$EOS device=$DEVICE preset=$PRESET elapsed=$((SECONDS - START))s"
    printf '%-28s %8s %8s\n' step exit seconds
    for s in "${STEPS[@]}"; do read -r -a f <<<"$s"; printf '%-28s %8s %8s\n' "${f[@]}"; done
  } | tee "$RES/SUMMARY.txt"
  rm -rf "$RES/server/hf"
  tar -czf "$OUT/tfserve-bench-$MODE-$STAMP.tar.gz" -C "$(dirname "$RES")" "$(basename "$RES")"
  note "results: $OUT/tfserve-bench-$MODE-$STAMP.tar.gz"
  if [ "$FAILED" -ne 0 ]; then note "RESULT: FAILED (see SUMMARY.txt above)"; exit 1; fi
  note "RESULT: all steps passed"
}
trap finish EXIT

# --- 1. a venv over the system's torch + transformers, with the carried wheels installed offline ---
if [ ! -x "$VENV/bin/python" ]; then
  step venv 120 "$PYTHON" -m venv --system-site-packages "$VENV" || exit 1
fi
# The device's python3 is itself a venv (/opt/torch/.venv): a venv made from it sees the base
# interpreter's packages, not its parent's, so the parent's site-packages goes in by a .pth file.
PARENT_SITE="${TFSERVE_SYSTEM_SITE:-$("$PYTHON" -c 'import site, sys; print(site.getsitepackages()[0] if sys.prefix != sys.base_prefix else "")')}"
if [ -n "$PARENT_SITE" ]; then
  "$VENV/bin/python" -c "import site, sys; open(site.getsitepackages()[0] + '/tfserve-system-site.pth', 'w').write(sys.argv[1] + '\n')" "$PARENT_SITE"
fi
PIPI=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS")
# accelerate: the H200 has one (1.15) over its own numpy; only a machine without it gets the carried wheel,
# without dependencies (a resolve would look for numpy among the carried wheels, where it is not)
grep -v '^accelerate' benchmarks/h200/serve-requirements.txt >"$WORK/serve-requirements.txt"
step install-serve 180 "${PIPI[@]}" -r "$WORK/serve-requirements.txt" || exit 1
if ! "$VENV/bin/python" -c "import accelerate" 2>/dev/null; then
  step install-accelerate 60 "${PIPI[@]}" --no-deps accelerate || exit 1
fi
ours=("$WHEELS"/metralectl_cockpit-*.whl)
step install-metralectl 180 "${PIPI[@]}" "${ours[0]}" || exit 1
if [ "$DO_AIPERF" = 1 ]; then
  step install-aiperf 180 bash -c "$(printf '%q ' "${PIPI[@]}") --no-deps aiperf==0.13.0 && \
    $(printf '%q ' "${PIPI[@]}") -r benchmarks/h200/aiperf-runtime.txt" || DO_AIPERF=0
fi
step environment 120 "$VENV/bin/python" -c '
import json, platform, importlib.metadata as md
names = ["torch", "transformers", "tokenizers", "huggingface_hub", "fastapi", "uvicorn", "starlette", "pydantic",
         "openai", "metralectl", "aiperf", "httpx", "typer"]
out = {"python": platform.python_version()}
for n in names:
    try:
        out[n] = md.version(n)
    except md.PackageNotFoundError:
        out[n] = None
import torch
out["cuda"] = torch.version.cuda
out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
print(json.dumps(out, indent=1))' || exit 1
cp "$RES/environment.out" "$RES/environment.json"
nvidia-smi >"$RES/nvidia-smi.txt" 2>&1 || true

# --- 2. the model (built once per machine) and the server ---
export METRALECTL_TFSERVE_CACHE="$WORK/models" METRALECTL_TFSERVE_PYTHON="$VENV/bin/python"
UP=("$VENV/bin/python" tests/realengines/transformers_serve.py up --pidfile "$PIDFILE" --workdir "$RES/server"
    --preset "$PRESET" --eos "$EOS" --device "$DEVICE" --ready-timeout 400)
[ "$DEVICE" = cpu ] && UP+=(--threads 1)
[ ${#SERVE_EXTRA[@]} -gt 0 ] && UP+=(-- "${SERVE_EXTRA[@]}")
step server-up 480 "${UP[@]}" || exit 1
URL=$("$VENV/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$RES/server-up.out")
MODEL=$("$VENV/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"])' "$RES/server-up.out")
MODEL_DIR=$("$VENV/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_dir"])' "$RES/server-up.out")
cp "$MODEL_DIR/metralectl-build.json" "$RES/model-build.json"
note "serving $MODEL at $URL ($MODE, eos $EOS)"

# Rungs shared by both tools. Quick (--tiny): small enough for a 2-core CPU in a few minutes.
if [ "$QUICK" = 1 ]; then
  CONC=(1 4) ISL=32 OSL=16 REPEATS=2 SWEEP_S=3 LONG_OSL=48
else
  CONC=(1 4 16) ISL=128 OSL=128 REPEATS=10 SWEEP_S=20 LONG_OSL=600
fi
# CONC_LIST=16 (say) narrows the rungs; ONLY_SWEEP=1 leaves out decode and long-decode; AIPERF_EXTRA adds a second
# AIPerf run per rung with those arguments (e.g. "--extra-inputs temperature:0", to send what metralectl sends)
[ -n "${CONC_LIST:-}" ] && read -r -a CONC <<<"${CONC_LIST//,/ }"
CONC_CSV=$(IFS=,; echo "${CONC[*]}")
# metralectl from this tree, not from the carried wheel (which may predate the last change to the
# client): the wheel brought its dependencies; PYTHONPATH makes the tree's package win.
MCTL=(env "PYTHONPATH=$PWD" "$VENV/bin/python" -m metralectl)
"${MCTL[@]}" --version >"$RES/metralectl-version.txt" 2>&1
env "PYTHONPATH=$PWD" "$VENV/bin/python" -c 'import metralectl; print(metralectl.__file__)' >>"$RES/metralectl-version.txt" 2>&1
export METRALE_HOME="$RES/metrale" METRALECTL_CONFIG_DIR="$RES/config" METRALECTL_CACHE_DIR="$RES/cache"
export METRALECTL_LOCK_DIR="$RES" NO_COLOR=1

# --- 3. metralectl's benchmarks ------------------------------------------------------------------
# >>> HOOK: the lead's metralectl bench commands. Keep --url "$URL" and --format json; rungs above.
run_metralectl_benches() {
  if [ "${ONLY_SWEEP:-0}" != 1 ]; then
  step mctl-decode 150 "${MCTL[@]}" bench run decode --url "$URL" -p "repeats=$REPEATS" \
    -p "max_tokens=$OSL" --format json
  step mctl-long-decode 150 "${MCTL[@]}" bench run long-decode --url "$URL" -p "osl=$LONG_OSL" \
    -p "repeats=$(( QUICK == 1 ? 2 : 3 ))" --format json
  fi
  step mctl-concurrency-sweep 200 "${MCTL[@]}" bench run concurrency-sweep --url "$URL" \
    -p "concurrencies=$CONC_CSV" -p "isls=$ISL" -p "osl=$OSL" -p "duration_s=$SWEEP_S" --format json
}
# <<< HOOK

# --- 4. AIPerf on the same rungs, back to back ----------------------------------------------------
# --use-legacy-max-tokens: AIPerf sends max_completion_tokens otherwise, which transformers 5.17
# ignores (it generates up to 1024 tokens); 5.20+ honours both. No ignore_eos/min_tokens (422).
run_aiperf() {
  local c n
  for c in "${CONC[@]}"; do
    n=$((c * 2)); [ "$n" -lt 8 ] && n=8
    w=$c; [ "$w" -gt 4 ] && w=4  # warmup: a few requests (plain mode serves them one at a time)
    # NVML's energy counter sampled beside it: J per output token over AIPerf's measured window
    "$VENV/bin/python" benchmarks/h200/energy_window.py sample "$RES/aiperf-c$c.energy.jsonl" \
      2>"$RES/aiperf-c$c.energy.err" &
    local sampler=$!
    step "aiperf-c$c" 200 "$VENV/bin/aiperf" profile -m "$MODEL" --url "$URL" --endpoint-type chat --streaming \
      --concurrency "$c" --request-count "$n" --warmup-request-count "$w" --isl "$ISL" --isl-stddev 0 \
      --osl "$OSL" --osl-stddev 0 --random-seed 0 --use-legacy-max-tokens --use-server-token-count \
      --tokenizer "$MODEL_DIR" --ui-type none --artifact-dir "$RES/aiperf/c$c"
    kill -TERM "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    "$VENV/bin/python" benchmarks/h200/energy_window.py judge "$RES/aiperf-c$c.energy.jsonl" "$RES/aiperf/c$c" \
      >"$RES/aiperf-c$c.energy.json" 2>&1 || true
    if [ -n "${AIPERF_EXTRA:-}" ]; then
      # shellcheck disable=SC2086  # AIPERF_EXTRA is a list of arguments
      step "aiperf-c$c-x" 200 "$VENV/bin/aiperf" profile -m "$MODEL" --url "$URL" --endpoint-type chat --streaming \
        --concurrency "$c" --request-count "$n" --warmup-request-count "$w" --isl "$ISL" --isl-stddev 0 \
        --osl "$OSL" --osl-stddev 0 --random-seed 0 --use-legacy-max-tokens --use-server-token-count \
        --tokenizer "$MODEL_DIR" --ui-type none --artifact-dir "$RES/aiperf/c$c-x" $AIPERF_EXTRA
    fi
  done
}

[ "$DO_METRALECTL" = 1 ] && run_metralectl_benches
[ "$DO_AIPERF" = 1 ] && run_aiperf
# Exit codes are not evidence (the client has exited 0 with every request failed): read the records.
step check 60 "$VENV/bin/python" benchmarks/h200/check_results.py "$RES" --expect-osl "$OSL"
cat "$RES/check.out"
note "benchmarks done; the server log is $RES/server"
exit 0  # finish (the EXIT trap) stops the server, writes SUMMARY.txt, tars, and sets the exit status
