"""One trial: train a configuration on the training classes of each fold and score it on that
fold's validation classes (never the test split), reporting every epoch for pruning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from harness.core import HarnessError, Protocol, RunContext, TrainingFailed, resolve_device
from harness.data import Split, prepare_data
from harness.evaluate import selection_score
from harness.train import EpochHooks, train_model

# a trial stops when its validation from epoch 4 on is below the median of the trials before
# it at the same epoch, once 3 trials have finished (earlier epochs rank configurations by
# how fast they start, not where they end: with a warm-up of 1 epoch, 4 of 8 triplet trials
# were pruned at epoch 2 within 0.002 of the median)
PRUNER = {"n_startup_trials": 3, "n_warmup_steps": 3}


def class_folds(
    split: Split, labels: np.ndarray, folds: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train indices, validation indices) per fold. One fold: the protocol's own split. K:
    the training and validation classes pooled and dealt into K class-disjoint folds (a fixed
    seeded shuffle of the sorted classes), each the validation set of one fold."""
    if folds == 1:
        return [(split.train, split.validation)]
    pool = np.concatenate([split.train, split.validation])
    classes = np.unique(labels[pool])
    if len(classes) < 2 * folds:
        raise HarnessError(f"--folds {folds} needs at least {2 * folds} training classes; "
                           f"this protocol has {len(classes)}")  # fmt: skip
    shuffled = np.random.default_rng(0).permutation(classes)
    out = []
    for k in range(folds):
        held = np.isin(labels[pool], shuffled[k::folds])
        out.append((np.sort(pool[~held]), np.sort(pool[held])))
    return out


@dataclasses.dataclass
class Trainer:
    """Trains one configuration per fold and returns the per-fold best validation scores;
    `report(step, value)` is called after every epoch (for pruning)."""

    protocol: Protocol
    method: str
    folds: int
    data_root: str | None
    device: str
    max_steps: int | None = None

    def __call__(self, hyper: dict[str, Any], report: Callable[[int, float], None]) -> list[float]:
        ctx = RunContext(self.protocol, self.protocol.seeds[0], resolve_device(self.device),
                         max_steps=self.max_steps, data_root=self.data_root)  # fmt: skip
        prepared = prepare_data(self.protocol, self.data_root)
        data = prepared.data
        scores = []
        for fold, (train_idx, val_idx) in enumerate(class_folds(prepared.split, data.labels,
                                                                self.folds)):  # fmt: skip
            values: list[float] = []

            def on_validation(value: float, fold: int = fold, values: list = values) -> None:
                values.append(value)
                report(fold * 10_000 + len(values), value)

            model, stats = train_model(ctx, self.method, hyper, data, train_idx, val_idx,
                                       hooks=EpochHooks(on_validation=on_validation))  # fmt: skip
            scores.append(
                max(stats.validation) if stats.validation else selection_score(
                    ctx, model.backbone, model.method, data.images[val_idx], data.labels[val_idx])
            )  # fmt: skip
        return scores


def suggest(trial: Any, base: dict[str, Any], search: dict[str, Any]) -> dict[str, Any]:
    """The trial's hyperparameters: the paper's, with the searched ones suggested."""
    return {**base, **{k: rng.suggest(trial, k) for k, rng in search.items()}}


def run_trial(trainer: Trainer, trial: Any, hyper: dict[str, Any]) -> float:
    """Train one configuration, reporting each epoch (pruning raises optuna.TrialPruned); the
    mean validation score over folds, or 0 for a run that failed (reason kept on the trial)."""
    import optuna

    def report(step: int, value: float) -> None:
        trial.report(value, step)
        if trial.should_prune():
            raise optuna.TrialPruned()

    try:
        scores = trainer(hyper, report)
    except TrainingFailed as exc:
        trial.set_user_attr("failure", str(exc))
        return 0.0
    trial.set_user_attr("fold_scores", scores)
    return float(np.mean(scores))


def objective(trainer: Trainer, base: dict[str, Any], search: dict[str, Any]) -> Callable:
    return lambda trial: run_trial(trainer, trial, suggest(trial, base, search))
