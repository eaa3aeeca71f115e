#!/usr/bin/env bash
# The GPU checks of issue #13 ("The real job"), for a machine with a CUDA GPU: a lent H100
# (the device tool; docs/gpu.md) or a user's own. Each step has its own time limit and the
# steps go on after one fails; the whole call stays within $BUDGET seconds (default 560, under
# the device tool's 10 minutes a command). What they print goes to $OUT (the device tool's
# folder; else /tmp/gpu_checks): summary.txt (one line a step: rc and seconds) and
# gpu_checks.tar.gz (each step's log, the JSON records, the run results).
#
#   bash tests/benchmarks/gpu_checks.sh env tests smoke default eval60k   # call 1
#   bash tests/benchmarks/gpu_checks.sh pipeline pipeline_torch cost long long_torch compile
#   CUB100=DIR bash tests/benchmarks/gpu_checks.sh birds_cached birds_gpu   # call 3, repeated
#
# Wheels the machine lacks (pytorch-metric-learning, faiss-cpu) are installed from .whl/
# when it is there (tests/benchmarks/gpu_wheels.sh fetches them; carry .whl to the machine).
# DEVICE=cpu runs the same steps on a CPU at a tiny scale: a check of this script itself.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu_checks}
WORK=${WORK:-/tmp/gpu_work}
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-560}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK/logs" "$WORK/records"
START=$(date +%s)
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ "$DEVICE" = cpu ]; then  # the script's own check: tiny sizes, batches of 8
  CLASSES="40 4 5" WORKERS=1,2 PSTEPS=2 STEPS=4 LONG=6 N60K=3000 DIM=64 BATCHES=8
  PROTO=$WORK/fair_cub200_cpu.yaml
  $PY -c "import yaml; p = yaml.safe_load(open('protocols/fair_cub200.yaml'))
p['name'], p['sampler'] = 'fair_cub200_cpu', {'classes_per_batch': 4, 'images_per_class': 2}
p['budget'] = {'steps': 6}
yaml.safe_dump(p, open('$PROTO', 'w'))"
else
  CLASSES="100 20 30" WORKERS=4,8,16 PSTEPS=100 STEPS=100 LONG=300 N60K=60000 DIM=512
  BATCHES=28,56,112 PROTO=fair_cub200
fi
RES=$WORK/results
H="$PY -m harness"
CUB100=${CUB100:-../shared/data/cub100}  # the folder holding cub100.zip
if [ "$DEVICE" = cpu ]; then BIRDS="--method contrastive,untrained --max-steps 2"; else BIRDS=--all; fi

jpegs() {  # the generated CUB tree (500 x 375 JPEGs) and a random ResNet-50 for --weights
  [ -f "$WORK/jpegs/CUB_200_2011/images.txt" ] || $PY -c "import sys; sys.path.insert(0, 'tests')
from pathlib import Path; from jpeg_tree import cub_jpegs
cub_jpegs(Path('$WORK/jpegs'), *map(int, '$CLASSES'.split()))"
  [ -f "$WORK/r50.pt" ] || $PY -c "import torch, torchvision
torch.save(torchvision.models.resnet50().state_dict(), '$WORK/r50.pt')"
}

step_env() {
  nvidia-smi || true
  $PY -c "import sys, torch, torchvision; print(sys.version); print('torch', torch.__version__,
'torchvision', torchvision.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
  $PY -c "import faiss, pytorch_metric_learning as pml, timm; print('faiss', faiss.__version__,
'gpus', faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0, 'pml', pml.__version__,
'timm', timm.__version__)"
  $H --help >/dev/null && echo "harness imports"
}
step_tests() {  # -n 0: one process on the GPU, whatever pyproject's addopts say
  $PY -m pytest -q -p no:cacheprovider -n 0 -m "slow or not slow" tests/harness/test_devices_paths.py \
    tests/harness/metrics/test_metrics.py tests/harness/test_precision.py \
    tests/harness/data/test_torch_decode.py
}
step_smoke() { $H run --protocol smoke --all --device "$DEVICE" --results-dir "$RES"; }
step_default() {
  $H run --protocol default --method contrastive --device "$DEVICE" --results-dir "$RES"
}
step_eval60k() {
  $PY tests/benchmarks/bench_evaluation.py --n "$N60K" --dim "$DIM" --classes 11318 \
    --repeats 2 --device "$DEVICE"
}
step_pipeline() {
  jpegs && $H cost --pipeline --protocol "$PROTO" --data-root "$WORK/jpegs" \
    --workers "$WORKERS" --steps "$PSTEPS" --device "$DEVICE" --results-dir "$RES" --json \
    >"$WORK/records/pipeline_pil.json"
}
step_pipeline_torch() {
  jpegs && $H cost --pipeline --protocol "$PROTO" --data-root "$WORK/jpegs" \
    --workers "$WORKERS" --steps "$PSTEPS" --decoder torch --device "$DEVICE" \
    --results-dir "$WORK/results_torch" \
    --json >"$WORK/records/pipeline_torch.json"
}
step_cost() {  # harness.train against the bare loop on staged batches, same precision
  jpegs && $H cost --protocol "$PROTO" --data-root "$WORK/jpegs" --methods contrastive \
    --batch-sizes "$BATCHES" --steps "$STEPS" --device "$DEVICE" --results-dir "$RES"
}
step_long() {  # a few hundred steps fed by 16 workers: the data-wait share of a real run
  jpegs && $H run --protocol "$PROTO" --method contrastive --data-root "$WORK/jpegs" \
    --weights "$WORK/r50.pt" --seeds 0 --max-steps "$LONG" --workers 16 --device "$DEVICE" \
    --results-dir "$WORK/results_long" --force
}
step_long_torch() {
  jpegs && $H run --protocol "$PROTO" --method contrastive --data-root "$WORK/jpegs" \
    --weights "$WORK/r50.pt" --seeds 0 --max-steps "$LONG" --workers 16 --decoder torch \
    --device "$DEVICE" --results-dir "$WORK/results_long_torch" --force
}
step_compile() {
  jpegs && $H run --protocol "$PROTO" --method contrastive --data-root "$WORK/jpegs" \
    --weights "$WORK/r50.pt" --seeds 0 --max-steps "$LONG" --workers 16 --compile \
    --device "$DEVICE" --results-dir "$WORK/results_compile" --force
}

step_birds_cached() {  # the CPU protocol's feature cache built and read on the device
  $H run --protocol birds --method contrastive,hdc_contrastive --seeds 0 --data-root "$CUB100" \
    --device "$DEVICE" --results-dir "$WORK/results_birds_cached"
}
step_birds_gpu() {  # the sweep, resumable: each call goes on where the last one stopped
  # shellcheck disable=SC2086
  $H run --protocol birds_gpu $BIRDS --data-root "$CUB100" --device "$DEVICE" \
    --results-dir "$WORK/results_birds"
}

declare -A LIMIT=([env]=60 [tests]=300 [smoke]=300 [default]=240 [eval60k]=240 [pipeline]=240
  [pipeline_torch]=240 [cost]=300 [long]=240 [long_torch]=240 [compile]=300 [birds_cached]=200
  [birds_gpu]=560)
STEPS_ASKED=("$@")
[ ${#STEPS_ASKED[@]} -gt 0 ] || STEPS_ASKED=(env tests smoke default eval60k pipeline
  pipeline_torch cost long long_torch compile birds_cached birds_gpu)
for name in "${STEPS_ASKED[@]}"; do
  if [ -z "${LIMIT[$name]:-}" ]; then
    echo "unknown step $name; steps: ${!LIMIT[*]}" | tee -a "$OUT/summary.txt"
    continue
  fi
  left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 30 ]; then
    echo "$name skipped: ${left}s of the budget left" | tee -a "$OUT/summary.txt"
    continue
  fi
  limit=$((left < LIMIT[$name] ? left : LIMIT[$name]))
  begin=$(date +%s)
  export -f jpegs "step_$name"
  export PY H WORK DEVICE RES PROTO CLASSES WORKERS PSTEPS STEPS LONG N60K DIM BATCHES CUB100 BIRDS
  timeout "$limit" bash -c "step_$name" >"$WORK/logs/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $(($(date +%s) - begin))s (limit ${limit}s)" | tee -a "$OUT/summary.txt"
  tr '\r' '\n' <"$WORK/logs/$name.log" | grep -av '%|' | tail -n 4 | sed 's/^/    /'
done
tar -czf "$OUT/gpu_checks.tar.gz" -C "$WORK" --exclude='*.pt' --exclude='*checkpoint*' logs records \
  $(cd "$WORK" && ls -d results* 2>/dev/null | tr '\n' ' ')
echo "written: $OUT/summary.txt, $OUT/gpu_checks.tar.gz"
