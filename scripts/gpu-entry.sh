#!/usr/bin/env bash
# GPU container entry: device check first (fails without CUDA), then the same benchmark on cuda.
# When to run: never by hand: the GPU container's entry point (Dockerfile.gpu).
set -euo pipefail
python -m dflash_core check --device cuda
exec python -m dflash_core bench --device cuda "$@"
