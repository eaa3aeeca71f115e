#!/usr/bin/env bash
# The GPU checks: one command on a machine with one CUDA GPU, sized for 8 minutes on an H100
# (docs/gpu.md). The steps run in order of value, each under its own time limit, and go on
# after one fails; the whole command stays within $BUDGET seconds (default 480), the last step
# (birds_gpu) taking whatever the others left. summary.txt (one line a step: exit code and
# seconds) and gpu_checks.tar.gz (each step's log, the JSON records, the run results, the
# summary) are written to $OUT after every step, and again if the command is interrupted, so
# a run cut short still leaves the figures of the steps it finished.
#
#   bash tests/benchmarks/gpu_checks.sh                 # the default run: env tests ... birds_gpu
#   bash tests/benchmarks/gpu_checks.sh cost eval60k    # only these steps, in this order
#   bash tests/benchmarks/gpu_checks.sh birds_gpu       # more of the birds sweep (resumable)
#   bash tests/benchmarks/gpu_checks.sh --list          # the default steps and their limits
#
# Settings (environment): OUT (default /tmp/gpu_checks), WORK (the scratch folder, default
# /tmp/gpu_work; birds_gpu goes on from $WORK/results_birds), BUDGET (seconds, default 480),
# CUB100 (the folder holding cub100.zip, default ../shared/data/cub100), RESUME (an earlier
# gpu_checks.tar.gz: its birds_gpu results are unpacked into $WORK first, so that a fresh
# machine goes on with the sweep), PYTHON (default python3).
# Wheels in .whl/ (tests/benchmarks/gpu_wheels.sh downloads them) are installed first, for a
# machine without internet. DEVICE=cpu runs the same steps on a CPU at a tiny scale: a check
# of this script itself (tests/test_gpu_checks.py).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit

# The default run, most valuable first: the versions, then correctness on CUDA, then the
# measurements (cost, the data pipeline), then as much of the birds sweep as fits. eval60k
# took 137 s with one repeat on an H100 (2026-11-27): it runs by name only.
ORDER=(env tests smoke cost pipeline long birds_gpu)
OTHERS=(eval60k default pipeline_torch overhead long_torch compile birds_cached)  # by name
# Seconds per step. The default run's add up to 410, within BUDGET with RESERVE to spare.
declare -A LIMIT=([env]=20 [tests]=110 [smoke]=40 [cost]=70 [pipeline]=50
  [long]=45 [birds_gpu]=75
  [eval60k]=160 [default]=120 [pipeline_torch]=60 [overhead]=120 [long_torch]=60
  [compile]=150 [birds_cached]=200)
REST=birds_gpu  # this step may use all that is left of the budget
RESERVE=10      # seconds kept back for a killed step's grace period and the last archive
MIN_STEP=20     # a step with less than this left is skipped
BUDGET=${BUDGET:-480}

if [ "${1:-}" = --list ]; then
  echo "budget ${BUDGET}s, ${RESERVE}s of it kept back; the default steps in order, limits in s:"
  for name in "${ORDER[@]}"; do echo "$name ${LIMIT[$name]}"; done
  echo "$REST also takes what the steps before it leave of the budget."
  echo "by name only: $(for n in "${OTHERS[@]}"; do echo "$n ${LIMIT[$n]}"; done | paste -sd ,)"
  exit 0
fi

OUT=${OUT:-/tmp/gpu_checks}
WORK=${WORK:-/tmp/gpu_work}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
START=$(date +%s)
mkdir -p "$OUT" "$WORK/logs" "$WORK/records"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # a machine without internet: wheels from .whl/
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -n "${RESUME:-}" ] && [ ! -d "$WORK/results_birds" ]; then
  tar -xzf "$RESUME" -C "$WORK" results_birds || echo "RESUME: no results_birds/ in $RESUME"
fi

SLOWER=1
if [ "$DEVICE" = cpu ]; then  # the script's own check: tiny sizes, batches of 8
  SLOWER=4  # a busy CPU's tiny steps can take longer than an H100's real ones: 4x the limits
  CLASSES="40 4 5" WORKERS=1,2 PSTEPS=2 STEPS=4 LONG=6 N60K=3000 C60K=300 DIM=64 BATCHES=8
  SMOKE="--method contrastive,cosface,untrained"
  COST="--protocol smoke --method contrastive,cosface --batch-sizes 16 --repeats 1 --steps 2 --rounds 1"
  PROTO=$WORK/fair_cub200_cpu.yaml
  $PY -c "import yaml; p = yaml.safe_load(open('protocols/fair_cub200.yaml'))
p['name'], p['sampler'] = 'fair_cub200_cpu', {'classes_per_batch': 4, 'images_per_class': 2}
p['budget'] = {'steps': 6}
yaml.safe_dump(p, open('$PROTO', 'w'))"
  BIRDS="--method contrastive,untrained --max-steps 2"
else
  CLASSES="100 20 30" WORKERS=4,16 PSTEPS=16 STEPS=100 LONG=150 N60K=60000 C60K=9242 DIM=512
  COST="--protocol default --all --batch-sizes 64 --repeats 3 --steps 16 --rounds 2"
  BATCHES=28,56,112 PROTO=fair_cub200 BIRDS=--all SMOKE=--all
fi
RES=$WORK/results
H="$PY -m harness"
CUB100=${CUB100:-../shared/data/cub100}  # the folder holding cub100.zip

jpegs() {  # the generated CUB tree (500 x 375 JPEGs) and a random ResNet-50 for --weights
  [ -f "$WORK/jpegs/CUB_200_2011/images.txt" ] || $PY -c "import os, sys; sys.path.insert(0, 'tests')
from pathlib import Path; from jpeg_tree import cub_jpegs
cub_jpegs(Path('$WORK/jpegs'), *map(int, '$CLASSES'.split()), processes=os.cpu_count() or 1)"
  [ -f "$WORK/r50.pt" ] || $PY -c "import torch, torchvision
torch.save(torchvision.models.resnet50().state_dict(), '$WORK/r50.pt')"
}

step_env() {  # one process: the versions, what faiss sees, and the harness's imports
  nvidia-smi || true
  $PY -c "import sys, torch, torchvision; print(sys.version); print('torch', torch.__version__,
'torchvision', torchvision.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name() if torch.cuda.is_available() else '')
import faiss, pytorch_metric_learning as pml, timm; print('faiss', faiss.__version__,
'gpus', faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0, 'pml', pml.__version__,
'timm', timm.__version__)
from harness.cli.program import build_parser; build_parser(); print('harness imports')"
}
step_tests() {  # -n 0: one process on the GPU, whatever pyproject's addopts say
  $PY -m pytest -v -p no:cacheprovider -n 0 -m "slow or not slow" --durations=10 \
    tests/harness/test_devices_paths.py tests/harness/data/test_torch_decode.py \
    tests/harness/test_precision.py tests/harness/metrics/test_metrics.py \
    "tests/harness/test_birds.py::test_photos_in_memory_are_held_on_a_cuda_device_once" \
    "tests/harness/test_rerank.py::test_cuda_gives_the_cpus_distances" \
    "tests/test_deploy.py::test_cuda_embeds_photos_as_the_cpu_does"
}
step_smoke() {  # every method trains and is evaluated on the device
  # shellcheck disable=SC2086
  $H run --protocol smoke $SMOKE --device "$DEVICE" --results-dir "$RES"
}
step_default() {
  $H run --protocol default --method contrastive --device "$DEVICE" --results-dir "$RES"
}
step_eval60k() {  # SOP's size: evaluation on the device against one faiss flat search
  $PY tests/benchmarks/bench_evaluation.py --n "$N60K" --dim "$DIM" --classes "$C60K" \
    --repeats 1 --in-process --device "$DEVICE"
}
step_cost() {  # the cost table on the device: every method at the protocol's batch
  # shellcheck disable=SC2086
  $H cost $COST --device "$DEVICE" --results-dir "$RES" --json >"$WORK/records/cost.json"
}
step_pipeline() {  # decoded images/s per worker count, and the data-wait share of a step
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
step_overhead() {  # harness.train against the bare loop on staged batches, same precision
  jpegs && $H cost --protocol "$PROTO" --data-root "$WORK/jpegs" --method contrastive \
    --batch-sizes "$BATCHES" --steps "$STEPS" --device "$DEVICE" --results-dir "$RES"
}
step_long() {  # a real run fed by 16 workers: the data-wait share of its steps
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
step_birds_gpu() {  # the sweep, resumable: each run of this step skips the finished runs
  # shellcheck disable=SC2086
  $H run --protocol birds_gpu $BIRDS --data-root "$CUB100" --device "$DEVICE" \
    --results-dir "$WORK/results_birds"
}

archive() {  # the logs, records, results and summary; replaced whole, never half-written
  cp "$OUT/summary.txt" "$WORK/summary.txt"
  # shellcheck disable=SC2046
  tar -czf "$OUT/gpu_checks.tar.gz.tmp" -C "$WORK" --exclude='*.pt' --exclude='*checkpoint*' \
    summary.txt logs records $(cd "$WORK" && ls -d results* 2>/dev/null) &&
    mv -f "$OUT/gpu_checks.tar.gz.tmp" "$OUT/gpu_checks.tar.gz"
}
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
reap() {  # the step's process group (timeout's), gone before going on: 5 s, then killed
  local _
  for _ in $(seq 25); do
    kill -0 -- "-$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL -- "-$pid" 2>/dev/null
}
interrupted() {  # a signal: stop the step, note it, archive what there is
  trap - INT TERM
  if [ -n "${pid:-}" ]; then
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    reap
  fi
  say "${name:-?} interrupted after $(($(date +%s) - ${begin:-$START}))s"
  archive
  echo "written: $OUT/summary.txt, $OUT/gpu_checks.tar.gz"
  exit 130
}
trap interrupted INT TERM

STEPS_ASKED=("$@")
[ ${#STEPS_ASKED[@]} -gt 0 ] || STEPS_ASKED=("${ORDER[@]}")
say "# $(date -u +%FT%TZ) DEVICE=$DEVICE BUDGET=${BUDGET}s: ${STEPS_ASKED[*]}"
export -f jpegs
export PY H WORK DEVICE RES PROTO CLASSES WORKERS PSTEPS STEPS LONG N60K C60K DIM BATCHES CUB100 \
  BIRDS COST SMOKE
for name in "${STEPS_ASKED[@]}"; do
  pid=
  if [ -z "${LIMIT[$name]:-}" ]; then
    say "unknown step $name; steps: ${ORDER[*]}; by name only: ${OTHERS[*]}"
    continue
  fi
  left=$((BUDGET - RESERVE - ($(date +%s) - START)))
  if [ "$left" -lt "$MIN_STEP" ]; then
    say "$name skipped: ${left}s of the budget left"
    archive
    continue
  fi
  limit=$((SLOWER * LIMIT[$name]))
  limit=$((left < limit ? left : limit))
  [ "$name" != "$REST" ] || limit=$left
  begin=$(date +%s)
  export -f "step_$name"
  timeout -k 5 "$limit" bash -c "step_$name" >"$WORK/logs/$name.log" 2>&1 &
  pid=$!
  wait "$pid"
  rc=$?
  reap
  say "$name rc=$rc $(($(date +%s) - begin))s (limit ${limit}s)"
  tr '\r' '\n' <"$WORK/logs/$name.log" | grep -av '%|' | tail -n 4 | sed 's/^/    /'
  archive
done
pid=
archive
echo "written: $OUT/summary.txt, $OUT/gpu_checks.tar.gz"
