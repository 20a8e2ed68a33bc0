#!/usr/bin/env bash
# On the lent H200: what `metralectl gateway` costs in front of a real engine on a real GPU, on a machine with
# cores to spare (issue 32's speed targets; the 2-core development box cannot say, docs/gateway.md).
# llama-server built with CUDA (build_llama_server_cuda.sh, resumable: the first call may only build),
# metralectl from the kit's wheel in a fresh venv, then benchmarks/gateway_overhead.py at each concurrency, the 1B
# random-weight GGUF on the GPU, in the paired design (DESIGN=paired, the default: one client pool sends the same
# prompts direct and through the gateway at the same moments, so the engine's noise falls on both alike; bootstrap
# intervals; the gateway's own time per request from inside it) or the first one (DESIGN=sequential: metralectl's
# own bench direct, then through the gateway, interleaved by round).
#
#   (here)   METRALECTL_REF=<commit> bash benchmarks/h200/fetch_llamacpp_kit.sh build/h200-lifecycle
#   (device) mkdir -p /tmp/src && tar -xzf build/h200-lifecycle/src.tar.gz -C /tmp/src &&
#            KIT=$PWD/build/h200-lifecycle bash /tmp/src/benchmarks/h200/run_gateway_overhead.sh
#
# Env: KIT, OUT, WORK (as run_lifecycle_gpu.sh: kept on a warm machine), DEADLINE_S (default 560),
# DESIGN (paired), CONNECTIONS (fresh, or keep-alive: metralectl bench's kept-alive transport; gateway_paired.py), ROUNDS (4), DURATION (25 s per round and concurrency, after WARMUP 3), CONCURRENCIES (1,16,64),
# ISL, OSL (128, 64: the prompt's and the answer's tokens; a shorter answer gives more requests, so more of the
# tail, per second), PRESET (1b), GATEWAY_LOOPS (auto; auto,asyncio: a gateway on each event loop, side by side; auto+busy50@14,auto@15: one with --busy-poll 50 on CPU 14 beside one without on 15), BASELINE (1: the
# gateway of the wheel in the kit's baseline/ folder beside this one, as gateway-baseline), FLOOR (1: the C relay
# of benchmarks/relay_floor.c as another path: what any relay process costs on this machine), BUILD_ONLY (1: stop once built), LLAMA_SERVER (a llama-server built on an earlier machine of this kind,
# or a .tar.xz of its bin/llama-server, or such a name whose .part-NN files SAVE_SERVER left: no build, one call),
# SAVE_SERVER (1: once built, a .tar.xz of bin/llama-server into OUT in 15 MiB parts, for LLAMA_SERVER on a later
# machine), SERVE (the engine's extra serve settings, KEY=VALUE
# separated by spaces; default cache-ram=0: llama-server saves its idle slots to a prompt cache at every new request,
# tens of milliseconds of TTFT at 16 streams that both paths share and that only widen the intervals; "" for none),
# GATEWAY_CPUS (e.g. 14-15: gateway_overhead.py --gateway-cpus: the gateway on those CPUs by its own --cpus, the
# engine kept off them by metralectl (box.yaml's gateway-cpus), the clients too: on the lent H100 the
# kernel put engine threads the gateway had just woken on its CPU and preempted it, ~240 times a second at 64
# streams, which made the gateway's own TTFT p99 1.4-2.3 ms; on CPUs of its own, 0.12-0.15 ms; docs/gateway.md).
# The measurement takes ROUNDS x concurrencies x (WARMUP + DURATION)
# plus ~60 s (4 x 3 x 28 s = 336 s): it must fit one call after the venv, so keep it under ~450 s (--budget stops
# starting phases that would end past the call's limit; what ran is reported). Exit 0 when every request was
# answered; the targets are judged in the table (gateway-overhead.txt and .md in the tar, and on stdout).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
KIT="$(cd "${KIT:?KIT must name the carried folder (fetch_llamacpp_kit.sh made it)}" && pwd)" || exit 2
OUT="${OUT:-/tmp/h200-gateway-out}"
WORK="${WORK:-$PWD/build/h200-lifecycle-work}"
DEADLINE_S="${DEADLINE_S:-560}"
PYTHON="${PYTHON:-python3}"
START=$SECONDS
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT" "$WORK"
note() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - START))s] $*" >&2; }

VENV="$WORK/venv"
# shellcheck source=/dev/null  # kit_venv.sh: checked on its own
source "$HERE/kit_venv.sh"
kit_venv "$VENV" || exit 1
(cd "$WORK" && "$VENV/bin/metralectl" --version) >&2
BASELINE_ARGS=()
if [ -n "${BASELINE:-}" ]; then  # an earlier metralectl wheel (the kit's baseline/): its gateway beside this one
  BASE_VENV="$WORK/venv-baseline"
  if [ ! -x "$BASE_VENV/bin/metralectl" ]; then
    rm -rf "$BASE_VENV" && "$PYTHON" -m venv --system-site-packages "$BASE_VENV" &&
      cp "$VENV"/lib/python3*/site-packages/parent-site.pth "$BASE_VENV"/lib/python3*/site-packages/ 2>/dev/null
    "$BASE_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$KIT/wheels" \
      "$KIT"/baseline/metralectl_cockpit-*.whl || { note "FAILED: installing the baseline wheel"; exit 1; }
  fi
  BASELINE_ARGS=(--baseline-python "$BASE_VENV/bin/python")
  note "baseline: $("$BASE_VENV/bin/metralectl" --version 2>&1 | head -1)"
fi

if [ -n "${LLAMA_SERVER:-}" ]; then  # one built on an earlier machine of the same kind (a .tar.xz of bin/llama-server)
  if [ ! -f "$LLAMA_SERVER" ] && [ -f "$LLAMA_SERVER.part-00" ]; then  # as SAVE_SERVER left it: in parts
    cat "$LLAMA_SERVER".part-* >"$WORK/llama-server-joined.tar.xz" || exit 1
    LLAMA_SERVER="$WORK/llama-server-joined.tar.xz"
  fi
  case "$LLAMA_SERVER" in
    *.tar.xz) mkdir -p "$WORK/prebuilt" && tar -xJf "$LLAMA_SERVER" -C "$WORK/prebuilt" || exit 1
              BIN="$WORK/prebuilt/bin/llama-server" ;;
    *) BIN="$LLAMA_SERVER" ;;
  esac
  "$BIN" --version >&2 || { note "FAILED: $BIN does not run here"; exit 1; }
else
  BIN="$(KIT="$KIT" WORK="$WORK" BUDGET_S=$((DEADLINE_S - 30 - (SECONDS - START))) bash "$HERE/build_llama_server_cuda.sh")" || {
    note "the build is not finished; call again while the machine is warm"; exit 3; }
fi
note "llama-server: $BIN"
if [ -n "${SAVE_SERVER:-}" ]; then  # for a later machine of this kind (the build takes ~270 s of a call), in parts
  # of 15 MiB (a file back from the device is at most 16 MiB): cat llama-server-cuda.tar.xz.part-* > one .tar.xz
  XZ_OPT="-T0 -6" tar -cJf "$WORK/llama-server-cuda.tar.xz" -C "$(dirname "$(dirname "$BIN")")" bin/llama-server &&
    split -b 15m -d "$WORK/llama-server-cuda.tar.xz" "$OUT/llama-server-cuda.tar.xz.part-" &&
    note "saved: $(find "$OUT" -maxdepth 1 -name "llama-server-cuda.tar.xz.part-*" | sort | tr "\n" " ")($(du -h "$WORK/llama-server-cuda.tar.xz" | cut -f1))"
fi
SERVE_ARGS=()
for setting in ${SERVE-cache-ram=0}; do SERVE_ARGS+=(--serve "$setting"); done
LOOPS="${GATEWAY_LOOPS:-auto}"
CPU_ARGS=()
if [ -n "${GATEWAY_CPUS:-}" ]; then  # the product's way: gateway --cpus, the engine and the client kept off them
  CPU_ARGS=(--gateway-cpus "$GATEWAY_CPUS")
  note "the gateway on CPUs $GATEWAY_CPUS (metralectl gateway --cpus; the engine and the client on the others)"
fi
if [ -n "${BUILD_ONLY:-}" ]; then note "built (BUILD_ONLY): call again for the measurement"; exit 0; fi
left=$((DEADLINE_S - (SECONDS - START)))
# one phase at least (warm-up + duration) and ~70 s of starts; --budget below skips the phases that would end late
need=$(( ${WARMUP:-3} + ${DURATION:-25} + 70 ))
if [ "$left" -lt "$need" ]; then
  note "only ${left}s left in this call, one phase takes ~${need}s: call again (the build is kept)"; exit 3
fi

RES="$WORK/gateway-$STAMP"
mkdir -p "$RES"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; uptime; "$PYTHON" --version;
  head -3 "$KIT/KIT.txt"; grep -m1 "model name" /proc/cpuinfo
  # what a core that slept costs to wake: the idle states' exit latencies (us), and the frequency governor
  echo "cpuidle driver: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)"
  for state in /sys/devices/system/cpu/cpu0/cpuidle/state*; do
    [ -d "$state" ] && echo "  $(cat "$state/name") latency $(cat "$state/latency") us disable $(cat "$state/disable")"
  done
  echo "governor: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo none)"
  if [ -n "${GATEWAY_CPUS:-}" ]; then echo "gateway CPUs: $GATEWAY_CPUS ($LOOPS; the rest on the others)"; fi
} >"$RES/environment.txt" 2>&1
note "gateway_overhead (from the wheel), ${left}s left"
(cd "$WORK" && timeout $((left - 20)) "$VENV/bin/python" "$HERE/../gateway_overhead.py" --python "$VENV/bin/python" \
  --llama-server "$BIN" --preset "${PRESET:-1b}" --ngl all --hardware hopper --gpus all \
  --design "${DESIGN:-paired}" --connections "${CONNECTIONS:-fresh}" --concurrencies "${CONCURRENCIES:-1,16,64}" --rounds "${ROUNDS:-4}" \
  --isl "${ISL:-128}" --osl "${OSL:-64}" --duration "${DURATION:-25}" --warmup "${WARMUP:-3}" --budget $((left - 70)) \
  --gateway-loops "$LOOPS" ${FLOOR:+--floor} "${BASELINE_ARGS[@]}" "${SERVE_ARGS[@]}" "${CPU_ARGS[@]}" \
  --json "$RES/gateway-overhead.json" --keep "$RES/runs" >"$RES/gateway-overhead.txt" 2>"$RES/gateway-overhead.err")
rc=$?
uptime >>"$RES/environment.txt"
cat "$RES/gateway-overhead.txt"; tail -5 "$RES/gateway-overhead.err" >&2
tar -czf "$OUT/h200-gateway-$STAMP.tar.gz" -C "$WORK" "$(basename "$RES")" && note "results: $OUT/h200-gateway-$STAMP.tar.gz"
exit $rc
