#!/usr/bin/env bash
# GPU container entry: device check first (fails without CUDA), then the same benchmark on cuda.
set -euo pipefail
python -m dflash_core check --device cuda
exec python -m dflash_core bench --device cuda "$@"
