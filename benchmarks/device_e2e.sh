#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and no Docker (the lent H200): `top` and `bench` against the engine
# test double run as a plain process, while a torch matmul loop loads the GPU, so telemetry and the
# benchmark's energy-per-token path read a real driver. Writes everything under ${OUT:-/tmp/e2e}.
# Every step must have run (the double served, each command exited as it should, the load ran to its end,
# the bench record completed); otherwise it says which step and why, and exits 1.
set -uo pipefail
OUT="${OUT:-/tmp/e2e}"; mkdir -p "$OUT"
export METRALE_HOME=/tmp/mh METRALECTL_CONFIG_DIR=/tmp/mcfg PYTHONUNBUFFERED=1
URL=http://127.0.0.1:18888
double="" load=""
fail() {
  echo "device_e2e: NOT MEASURED: $*" >&2
  [ -n "$load" ] && kill "$load" 2>/dev/null
  [ -n "$double" ] && kill "$double" 2>/dev/null
  exit 1
}
DOUBLE_ITL_MS=10 python3 tests/engine_double/metrale_double.py serve test/double --port 18888 >"$OUT/double.log" 2>&1 &
double=$!
for _ in $(seq 100); do  # up to 20 s for /health 200 from the double itself (it may have lost the port)
  kill -0 "$double" 2>/dev/null || fail "the engine double exited: $(tail -n 2 "$OUT/double.log")"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && break
  sleep 0.2
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] || fail "the engine double never answered /health 200"
python3 -m metralectl top --once --json --url "$URL" >"$OUT/top_idle.json" 2>"$OUT/top_idle.err" \
  || fail "top --once (idle) exited $?: $(tail -n 2 "$OUT/top_idle.err")"
python3 - <<'PY' >"$OUT/load.log" 2>&1 &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 45
while time.time() < end:
    a @ a
    torch.cuda.synchronize()
print("DONE")
PY
load=$!
sleep 4
kill -0 "$load" 2>/dev/null || fail "the load (torch matmul) exited at once: $(tail -n 2 "$OUT/load.log")"
python3 -m metralectl top --once --json --url "$URL" >"$OUT/top_load.json" 2>"$OUT/top_load.err" \
  || fail "top --once (load) exited $?: $(tail -n 2 "$OUT/top_load.err")"
timeout 8 python3 -m metralectl top --record "$OUT/top.jsonl" --interval 0.5 --url "$URL" >/dev/null 2>"$OUT/top_record.err"
code=$?
[ "$code" = 124 ] || [ "$code" = 0 ] || fail "top --record exited $code: $(tail -n 2 "$OUT/top_record.err")"
[ -s "$OUT/top.jsonl" ] || fail "top --record wrote nothing to $OUT/top.jsonl"
python3 -m metralectl bench run long-decode --url "$URL" -p repeats=3 --format json >"$OUT/bench.json" 2>"$OUT/bench.err"
code=$?
echo "bench exit $code" >>"$OUT/bench.err"
[ "$code" = 0 ] || fail "bench run long-decode exited $code: $(tail -n 3 "$OUT/bench.err")"
wait "$load" || fail "the load (torch matmul) exited $?: $(tail -n 2 "$OUT/load.log")"
load=""
grep -q DONE "$OUT/load.log" || fail "the load did not run to its end: $(tail -n 2 "$OUT/load.log")"
python3 -m metralectl bench history --format json >"$OUT/history.json" 2>&1 || fail "bench history exited $?"
kill "$double" 2>/dev/null
double=""
python3 - "$OUT" <<'PY' || fail "the bench record or top's JSON is not what was measured"
import json, sys
out = sys.argv[1]
rec = json.load(open(f"{out}/bench.json"))
if rec.get("status") != "completed":
    sys.exit(f"the bench record says {rec.get('status')!r}, not completed")
def find(d, key):
    if isinstance(d, dict):
        for k, v in d.items():
            if k == key:
                yield v
            yield from find(v, key)
    elif isinstance(d, list):
        for v in d:
            yield from find(v, key)
print("energy:", json.dumps(list(find(rec, "energy"))[:2], indent=1)[:3000])
top = json.load(open(f"{out}/top_load.json"))
print("top gpu:", json.dumps(top.get("gpus"), indent=1)[:2500])
PY
