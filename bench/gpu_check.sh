#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and a CUDA build of torch: a starved and a healthy CUDA
# training job with DataLoader workers, `loadertop snapshot --json` on each, and checks that
# the GPU is mapped to the trainer, utilization is measured, and the starved run's GPU is
# less busy. Run from the repository root: bash bench/gpu_check.sh
set -euo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
$PY -m pip install -q -e . >/dev/null 2>&1 || true

run() {  # name, job flags...
  local name=$1; shift
  $PY -m loadertop.demo.job --device cuda --persistent --duration 120 "$@" >"$OUT/$name.log" 2>&1 &
  local pid=$!
  sleep 15
  $PY -m loadertop snapshot "$pid" --duration 15 --json >"$OUT/$name.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

run starved --workers 1 --item-ms 20 --batch-size 8 --step-ms 5
run healthy --workers 4 --batch-size 8 --step-ms 40

$PY - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
r = {name: json.load(open(f"{out}/{name}.json")) for name in ("starved", "healthy")}
util = {}
for name, report in r.items():
    t = report["trainers"][0]
    assert t["gpus"], f"{name}: trainer {t['pid']} not mapped to a GPU"
    u = t["gpus"][0]["utilization_percent"]
    assert u is not None, f"{name}: GPU utilization is null"
    util[name] = u
    print(f"{name}: data wait {t['data_wait_fraction']}, GPU{t['gpus'][0]['index']} {u:.0f}%, "
          f"findings {[f['id'] for f in report['findings']]}")
assert util["starved"] < util["healthy"], util
print("OK: GPU mapped, utilization measured, starved GPU less busy", util)
PY
