#!/usr/bin/env bash
# One short run on a GPU machine (16 cores, one GPU): bench/gpu_check.sh, a CUDA training job
# tuned in place (watch(tune=True)) on 16 cores, and a few rows of the tuning and advice
# benches. Each part writes its output under $OUT (or a temporary folder) as it finishes,
# so a run cut short still says what it saw. Run from the repository root.
set -uo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PIP_NO_INDEX=1
# py-spy, where the machine has none: its wheel carried in .whl/ (see the device tool's README).
if ! command -v py-spy >/dev/null && ls .whl/py_spy-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/py_spy-*.whl && \
    export PYTHONPATH=$PYTHONPATH:/tmp/site PATH=$PATH:/tmp/site/bin
fi
nproc | tee "$OUT/machine.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/machine.txt"

echo "== gpu_check"
OUT=$OUT bash bench/gpu_check.sh 2>&1 | tee "$OUT/gpu_check.txt"

echo "== a CUDA job tuned in place: 1 worker for 20 ms items, a 5 ms GPU step"
$PY -m loadertop.demo.job --device cuda --workers 1 --item-ms 20 --batch-size 8 --step-ms 5 --persistent \
    --tune --epoch-items 800 --duration 60 --truth "$OUT/tuned.json" >"$OUT/tuned.log" 2>&1
$PY - "$OUT/tuned.json" <<'PY' | tee "$OUT/tuned.txt"
import json, sys
t = json.load(open(sys.argv[1]))
log = t["log"]
epochs = sorted({row[4] for row in log})
for e in epochs:
    rows = [r for r in log if r[4] == e]
    if len(rows) > 1:
        print(f"epoch {e + 1}: {(rows[-1][3] - rows[0][3]) / (rows[-1][0] - rows[0][0]):.1f} steps/s")
tune = t.get("tune") or {}
for d in tune.get("decisions", []):
    print(d["text"])
print("state", tune.get("state"), "setting", tune.get("setting"), "cost_s", tune.get("cost_s"),
      "of", round(t["elapsed_s"], 1), "s")
PY

echo "== bench/autotune.py cpu_bound on 16 cores"
timeout 200 $PY bench/autotune.py --cases cpu_bound --epochs 8 --seconds 6 --warmup 2 --json "$OUT/autotune.json" \
    2>&1 | tee "$OUT/autotune.txt"

echo "== bench/advice.py images on 16 cores"
timeout 170 $PY bench/advice.py --cases images --seconds 6 --warmup 2 --json "$OUT/advice.json" \
    2>&1 | tee "$OUT/advice.txt"
