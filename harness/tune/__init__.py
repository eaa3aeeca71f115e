"""Equal-budget tuning on validation classes (Musgrave et al., "A Metric Learning Reality
Check", 2020): Optuna studies (`study`), one trial's training on class folds (`trial`), the
best configuration written where `run --tuned` reads it (`overlay`), trials as Ray tasks
(`ray`), studies side by side in local processes (`processes`). The test split is never
embedded."""

from harness.tune.options import TuneOptions
from harness.tune.overlay import OVERLAY_SCHEMA, study_figure, write_overlay
from harness.tune.processes import tune
from harness.tune.study import (
    default_storage,
    needs_validation,
    open_study,
    tune_method,
)
from harness.tune.trial import (
    PRUNER,
    Trainer,
    class_folds,
    objective,
    pruner_settings,
    run_trial,
    suggest,
)

__all__ = [
    "OVERLAY_SCHEMA",
    "PRUNER",
    "Trainer",
    "TuneOptions",
    "class_folds",
    "default_storage",
    "needs_validation",
    "objective",
    "open_study",
    "pruner_settings",
    "run_trial",
    "study_figure",
    "suggest",
    "tune",
    "tune_method",
    "write_overlay",
]
