#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and no Docker (the lent H200): `top` and `bench` against the engine
# test double run as a plain process, while a torch matmul loop loads the GPU, so telemetry and the
# benchmark's energy-per-token path read a real driver. Writes everything under ${OUT:-/tmp/e2e}.
set -uo pipefail
OUT="${OUT:-/tmp/e2e}"; mkdir -p "$OUT"
export METRALE_HOME=/tmp/mh METRALECTL_CONFIG_DIR=/tmp/mcfg PYTHONUNBUFFERED=1
URL=http://127.0.0.1:18888
DOUBLE_ITL_MS=10 python3 tests/engine_double/metrale_double.py serve test/double --port 18888 >"$OUT/double.log" 2>&1 &
double=$!
sleep 2
python3 -m metralectl top --once --json --url "$URL" >"$OUT/top_idle.json" 2>"$OUT/top_idle.err"
python3 - <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 45
while time.time() < end:
    a @ a
    torch.cuda.synchronize()
PY
load=$!
sleep 4
python3 -m metralectl top --once --json --url "$URL" >"$OUT/top_load.json" 2>"$OUT/top_load.err"
timeout 8 python3 -m metralectl top --record "$OUT/top.jsonl" --interval 0.5 --url "$URL" >/dev/null 2>"$OUT/top_record.err"
python3 -m metralectl bench run long-decode --url "$URL" -p repeats=3 --format json >"$OUT/bench.json" 2>"$OUT/bench.err"
echo "bench exit $?" >>"$OUT/bench.err"
wait "$load"
python3 -m metralectl bench history --format json >"$OUT/history.json" 2>&1
kill "$double" 2>/dev/null
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rec = json.load(open(f"{out}/bench.json"))
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
