"""What a method costs: how its mining and loss grow with the batch size m, the training
throughput it allows, and what the harness's own training loop adds on top of bare PyTorch.

`python -m harness cost` measures, for each method and each batch size m = P x K (K fixed by
the protocol's sampler, so m must be a multiple of K):

- scaling (`scaling.py`), on random inputs: the miner's work counts and the mining and loss
  (forward + backward) times, CUDA-synchronised, median over the repeats;
- the growth exponent b of cost ~ a * m^b (`fit.py`: the fit and the rule that names a
  complexity class, or says "unclear" when the fit does not support one; times are fitted
  above their fixed per-call cost); sizes whose call would take too long or not fit in
  memory (`memory.py`) are skipped by an estimate;
- throughput (`throughput.py`) on the protocol's real data: images per second and step time
  of the harness's own training step, with its own optimizer, sampler and feeder (the parts
  `harness.train.start_training` gives `harness.train.train`), and the share of it spent in
  mining + loss; the methods are timed in interleaved rounds (`rounds.py`), the fastest
  round of each kept, and checked against each other (`consistency.py`: methods whose
  mining + loss is a small share of the step must agree, or the measurement was disturbed);
- scaling across devices (`devices.py`, `--devices 1,2,...`): one method's training step
  under torchrun on N processes against one, as speedup and efficiency;
- harness overhead (`overhead.py`): `harness.train.train` against a hand-written loop doing
  the same steps on the same model and batches, alternated, as a throughput ratio (the bare
  loop is the one training setup written out here: it is the yardstick);
- the data pipeline (`pipeline.py`, `--pipeline`): the run's feeder's images/s per worker
  count and the data-wait share of the harness's step.

`measure.py` runs all of it for a protocol; `records.py` writes results/cost/<protocol>.json
(merged with the file there when it was measured comparably, else archiving it).
`harness.report` renders the records as markdown for the leaderboard and draws the figure;
the command line (and all printing) is in `harness.cli`.
"""

from harness.cost.consistency import SHARE_LIMIT, SPREAD_LIMIT, consistency
from harness.cost.devices import DEFAULT_COUNTS, measure_devices, parse_counts
from harness.cost.fit import COMPLEXITIES, FIXED_MULTIPLE, PowerFit, fit_power_law, fit_time, fits
from harness.cost.measure import CostOptions, measure_cost
from harness.cost.overhead import (
    OVERHEAD_PIECES,
    OVERHEAD_TARGET,
    measure_overhead,
    overhead_method,
)
from harness.cost.pipeline import measure_pipeline, parse_workers
from harness.cost.records import (
    COST_SCHEMA,
    cost_path,
    devices_path,
    figure_path,
    format_number,
    incomparable,
    log_line,
    merge_cost,
    provenance,
    read_cost,
    replace_record,
    save_cost,
    write_cost,
)
from harness.cost.rounds import fastest, interleaved, round_order
from harness.cost.scaling import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_REPEATS,
    measure_scaling,
    parse_batch_sizes,
)
from harness.cost.throughput import (
    DEFAULT_ROUNDS,
    DEFAULT_STEPS,
    cost_context,
    measure_throughput,
    throughput_rounds,
)

__all__ = [
    "COMPLEXITIES",
    "COST_SCHEMA",
    "CostOptions",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_COUNTS",
    "DEFAULT_REPEATS",
    "DEFAULT_ROUNDS",
    "DEFAULT_STEPS",
    "FIXED_MULTIPLE",
    "OVERHEAD_PIECES",
    "OVERHEAD_TARGET",
    "PowerFit",
    "SHARE_LIMIT",
    "SPREAD_LIMIT",
    "consistency",
    "fastest",
    "fit_time",
    "interleaved",
    "round_order",
    "throughput_rounds",
    "cost_context",
    "cost_path",
    "devices_path",
    "figure_path",
    "fit_power_law",
    "format_number",
    "log_line",
    "measure_pipeline",
    "parse_workers",
    "provenance",
    "fits",
    "incomparable",
    "measure_cost",
    "measure_devices",
    "measure_overhead",
    "measure_scaling",
    "measure_throughput",
    "merge_cost",
    "overhead_method",
    "parse_batch_sizes",
    "parse_counts",
    "read_cost",
    "replace_record",
    "save_cost",
    "write_cost",
]
