#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (docs/gpu.md): one device call of at most 10 minutes, planned for
# under 8. The machine's image has its own CUDA torch (2.11) and Python 3.12 but an older transformers (5.17) and
# pytest, and no package registry, so the lab's pinned pure-python wheels travel with the call:
#   bash scripts/device_wheels.sh            # here, before the call: downloads them into .whl/ (~30 MB, no torch)
# then call the device tool with carry [".whl"] and command `bash scripts/device_gpu_check.sh`.
# Steps, each under its own `timeout` (seconds): wheels, versions, device check, the shipped mini imported, the GPU
# exactness suite (Hypothesis profile `device`), a GPU bench of all 15 methods on the mini (--smoke), a short
# `prepare --device cuda` on a tiny target, the per-dtype lines. Every step prints `STEP <name> ok|FAILED|SKIP`
# and its seconds; logs land in $OUT.
# Exit: 0 every step passed; 1 a step failed (its log names it); 3 dry run: no CUDA here, the CUDA steps were
# skipped (what a CPU can check ran); 2 the environment is unusable (no python3 / torch).
# When to run: on a lent GPU device machine, as its one prepared check (docs/gpu.md).
set -uo pipefail
OUT="${OUT:-/tmp/dflash-gpu-check}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DFLASH_HOME=/tmp/dflash-home DFLASH_REPORTS="$OUT/reports" HF_HUB_OFFLINE=1
export DFLASH_HYPOTHESIS_PROFILE=device HF_HUB_DISABLE_PROGRESS_BARS=1
unset CI  # CI would load the `ci` Hypothesis profile (40 examples a property): too slow for one call
T0=$SECONDS
failed=0
skipped=0

step() {  # step NAME SECONDS COMMAND...: run it under `timeout`, log it, print one STEP line
  local name=$1 limit=$2; shift 2
  local t=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "STEP $name ok $((SECONDS - t))s"
  else
    [ "$rc" -eq 124 ] && echo "(timed out after ${limit}s)" >>"$OUT/$name.log"
    echo "STEP $name FAILED rc=$rc $((SECONDS - t))s (log: $OUT/$name.log)"
    tail -n 25 "$OUT/$name.log" | sed 's/^/    /'
    failed=1
  fi
}

skip() {
  echo "STEP $1 SKIP (no CUDA on this machine)"
  skipped=1
}

command -v python3 >/dev/null || { echo "error: no python3 on this machine" >&2; exit 2; }
if ls .whl/*.whl >/dev/null 2>&1; then
  step wheels 90 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/dflash-site .whl/*.whl
  export PYTHONPATH="/tmp/dflash-site:$PWD"
else
  echo "STEP wheels SKIP (no .whl/: the image's own transformers and pytest; run scripts/device_wheels.sh first)"
  export PYTHONPATH="$PWD"
fi
# pytest.ini's `strict = true` needs pytest 9; an older pytest warns on the key and `filterwarnings = error`
# aborts, so the suite runs with an ini written for the pytest that is here (same markers, same filters).
INI="$OUT/pytest-device.ini"
python3 - "$INI" <<'PY' || { echo "error: cannot import pytest or torch" >&2; exit 2; }
import sys, configparser, pytest
major = int(pytest.__version__.split(".")[0])
cp = configparser.ConfigParser(interpolation=None)
cp.read("pytest.ini")
if major < 9:
    cp["pytest"].pop("strict", None)
    cp["pytest"]["addopts"] = cp["pytest"].get("addopts", "") + " --strict-markers"
with open(sys.argv[1], "w") as f:
    cp.write(f)
PY
PYTEST=(python3 -m pytest -c "$INI" --rootdir . -p no:cacheprovider -q -rsf -o log_cli=false)
step versions 60 python3 -c "import sys, torch, transformers, pytest, hypothesis; print(sys.version.split()[0], \
'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), \
'transformers', transformers.__version__, 'pytest', pytest.__version__, 'hypothesis', hypothesis.__version__)"
cat "$OUT/versions.log"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  export DFLASH_REQUIRE_GPU=1
  step device_check 60 python3 -m dflash_core check --device cuda
  step import_mini 90 python3 -m dflash_core prepare --target mini --no-progress
  step gpu_exactness 200 "${PYTEST[@]}" -m "exactness and gpu" tests/runtime/test_gpu.py tests/runtime/test_exactness.py
  step gpu_bench 150 python3 -m dflash_core bench --device cuda --smoke -- --benchmark-storage="file:///tmp/bench-cuda"
  step dtypes 120 python3 scripts/device_dtypes.py --device cuda --dtypes float32,float16,bfloat16
  grep '^DTYPE ' "$OUT/dtypes.log" || true
  step tiny_ckpt 60 python3 -c "from dflash_core.testing import build_tiny_lab; build_tiny_lab('/tmp/tiny-lab')"
  step prepare_cuda 120 python3 -m dflash_core prepare --target /tmp/tiny-lab/ckpt --home /tmp/tiny-cuda-home \
    --device cuda --train-seeds 256 --train-budget 1 --no-progress
  python3 -c "import json,glob; d=json.load(open(glob.glob('/tmp/tiny-cuda-home/artifacts/*/manifest.json')[0])); \
print('PREPARE_CUDA', json.dumps({'device': d.get('device'), 'teacher': {k: d['teacher'].get(k) for k in \
('tokens', 'seconds')}}))" 2>/dev/null | tee -a "$OUT/prepare_cuda.log" || true
else
  for s in device_check import_mini gpu_exactness gpu_bench dtypes tiny_ckpt prepare_cuda; do skip "$s"; done
  # what the CPU can check of the GPU legs: they skip cleanly without CUDA (and fail under DFLASH_REQUIRE_GPU=1,
  # which tests/runtime/test_gpu_gate.py proves)
  step gpu_legs_skip 120 "${PYTEST[@]}" tests/runtime/test_gpu.py -k "device_check or negative_control"
fi
echo "TOTAL $((SECONDS - T0))s"
if [ "$failed" -ne 0 ]; then exit 1; fi
if [ "$skipped" -ne 0 ]; then exit 3; fi
exit 0
