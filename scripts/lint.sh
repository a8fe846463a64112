#!/usr/bin/env bash
# Static checks that run in CI (no Docker engine or GitHub runner needed):
# ruff on the code, hadolint on the Dockerfiles, and the workflows and compose file validated offline
# against the GitHub-workflow and compose-spec JSON schemas that check-jsonschema ships.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check dflash_core tests benchmarks conftest.py
hadolint Dockerfile.cpu Dockerfile.gpu
check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
bash -n lab .ci/run scripts/gpu-entry.sh
echo "lint: ok"
