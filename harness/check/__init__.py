"""CI's regression check: rerun the small `regression` protocol, compare with the baselines.
It runs methods, so it is not reporting: the rerun (`rerun`: check, update_baselines), the
baseline files (`baselines`), which machine made the runs (`machine`), the comparison, exact
or statistical (`compare`), and the check's text (`verdict`) each have a file.

The baseline file (results/reference/baselines/<protocol>.json, committed beside the other
reference results) holds every method's metrics for several seeds, and the fingerprint of the
machine that made them (harness/records/fingerprint.py). Runs are pinned to one torch thread
per worker process, so the core count does not matter. The check's own runs go to a temporary
folder (deleted afterwards; kept and named only when the check breaks off), so a check
changes no file of the clone; only `--update` writes, the baseline file.

- **exact** mode, on a machine with the baseline's fingerprint, or with the baseline's pinned
  numerics (any x86-64 processor with AVX2 and FMA; harness.check.pinned): training is deterministic
  there, so every check seed must reproduce its recorded value bit for bit, up to EXACT_RTOL
  (1e-12): the metric code may reorder its float64 sums (issue 12's one-pass metrics agree
  with the previous code to 4.4e-15), while any change in training moves a metric by far
  more (about 1e-4 and up). Any other difference is a change (better or worse) and fails
  until `--update --reason` records it.
- **auto** (the default) on any other machine: a row (method, metric) whose check-seed values
  all equal the recorded ones (up to EXACT_RTOL) passes as exact: the numbers reproduced, so
  nothing regressed (a processor of the same family often rounds alike). Only the rows whose
  numbers differ get the statistical test below; when every number matches the check says
  exact. `--mode statistical` tests every row statistically, `--mode exact` none.
- **statistical** mode, on any other machine: another processor rounds differently and
  training amplifies that into seed-noise-sized differences, so single values cannot be
  compared. For each metric, the mean over the n check seeds is compared with the mean over
  the baseline's N seeds by a one-sided two-sample t-test with pooled variance (Student's t,
  N + n - 2 degrees of freedom), Bonferroni-corrected over all rows so that the whole check
  raises a false alarm with probability at most ALPHA when nothing regressed. The t-test
  treats the two sets of runs as independent draws; the check seeds are among the baseline's,
  and runs of one seed on two machines are positively correlated, which only lowers the
  false-alarm rate further. A metric regresses when its mean falls below the baseline mean by
  more than the bound; the bound is the smallest drop the check can see on this machine. A
  method whose bound on MAP@R exceeds WATCH_DROP is reported as too noisy to guard. The
  Bonferroni count is every comparable row, also those that passed as exact: the bounds are
  those of a wholly statistical check, never narrower.

The report is short by default (machines, mode, a summary, and only the rows that failed,
changed or improved); `full=True` (`check --full`) adds every row and the detectable drops.
"""

from harness.check.baselines import BASELINE_DIR, BASELINE_SEEDS
from harness.check.compare import same_metrics
from harness.check.rerun import check, update_baselines

__all__ = ["BASELINE_DIR", "BASELINE_SEEDS", "check", "same_metrics", "update_baselines"]
