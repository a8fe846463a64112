#!/usr/bin/env bash
# The one prepared GPU check for a lent device machine: device check, GPU exactness, smoke GPU
# benchmark; everything it prints and writes lands in $OUT. The machine has its own CUDA torch but an older
# transformers, so the pinned transformers wheel travels in .whl/ (see docs/gpu.md):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl transformers==5.24.0
# then call the device tool with carry [".whl"] and command `bash scripts/device_gpu_check.sh`.
# When to run: on a lent GPU device machine, as its one prepared check (docs/gpu.md).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CI=true DFLASH_REQUIRE_GPU=1 DFLASH_HOME=/tmp/dflash-home DFLASH_REPORTS="$OUT/reports"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
rc=0
python3 -m dflash_core check --device cuda 2>&1 | tee "$OUT/device_check.json" || rc=1
python3 -m pytest -m "exactness and gpu" -p no:cacheprovider -q -rs 2>&1 | tee "$OUT/gpu_exactness.log" || rc=1
# Smoke GPU benchmark on a tiny tokenized target built and prepared here in seconds (building the mini
# target takes ~8 min of CPU, too long for one device call; carry a prepared DFLASH_HOME to bench it instead).
python3 -c "from dflash_core.testing import build_tiny_lab; build_tiny_lab('/tmp/tiny-lab')" || rc=1
DFLASH_HOME=/tmp/tiny-lab/home python3 -m dflash_core bench --device cuda --target /tmp/tiny-lab/ckpt --smoke -- \
  --benchmark-storage="file:///tmp/bench-cuda" 2>&1 | tail -60 | tee "$OUT/gpu_bench.log" || rc=1
exit $rc
