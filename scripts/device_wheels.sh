#!/usr/bin/env bash
# When to run: here, before a lent GPU call (docs/gpu.md).
# Run here, before a lent GPU call: downloads the lab's pinned wheels for the device image (Python 3.12, x86_64
# manylinux) into .whl/ (git-ignored via .git/info/exclude), which the call carries (carry [".whl"]) and
# scripts/device_gpu_check.sh installs with --no-index. No torch: the image's own CUDA torch is used (a CUDA torch
# wheel is gigabytes, the carry limit 64 MiB); numpy is left out too (the image's torch was built against its own).
# About 30 MB: transformers and its pure-python dependencies, tokenizers / safetensors / regex / hf-xet / pyyaml
# (small abi3 or cp312 wheels), pytest, hypothesis and pytest-benchmark at the versions this lab pins.
set -euo pipefail
dest="${1:-.whl}"
mkdir -p "$dest"
exclude="$(git rev-parse --git-path info/exclude)"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$dest" \
  transformers==5.24.0 tokenizers==0.23.3 huggingface_hub==2.5.0 safetensors==0.8.0 \
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 hypothesis==6.170.29 pytest-benchmark==5.3.1
rm -f "$dest"/numpy-*.whl
du -sh "$dest"
