"""One trial: train a configuration on the training classes of each fold and score it on that
fold's validation classes (never the test split), reporting every epoch for pruning.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from harness.core import HarnessError, Protocol, RunContext, TrainingFailed, resolve_device
from harness.data import Split, prepare_data
from harness.evaluate import selection_score
from harness.records import NO_TRACKING, Tracker, TrackerConfig, open_tracker
from harness.train import EpochHooks, train_model, with_cached_features

# a trial stops when its validation from the warm-up's last epoch on is below the median of the trials
# before it at the same epoch, once 3 trials have finished (earlier epochs rank
# configurations by how fast they start, not where they end: with a warm-up of 1 epoch, 4 of
# 8 triplet trials were pruned at epoch 2 within 0.002 of the median)
PRUNER = {"n_startup_trials": 3, "n_warmup_steps": 3}


def pruner_settings(protocol: Protocol) -> dict[str, int]:
    """The median pruner's settings for a protocol's study: no trial stops before it has
    trained half its epochs (3 at least; optuna prunes from step n_warmup_steps on). A fixed warm-up of 3 epochs let a 30-epoch photo protocol's study
    judge 17 of 20 contrastive trials on their first tenth of training; a trial on cached
    features costs seconds, so waiting for the second half is cheap."""
    return {**PRUNER, "n_warmup_steps": max(PRUNER["n_warmup_steps"], protocol.budget.epochs // 2)}


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


def without_test(prepared: Any) -> tuple[Any, Split]:
    """The data of the training and validation classes only, and its split (test empty):
    what a calibration or a study on cached features works on, so that the test classes are
    never embedded, and changing their images or labels cannot change a number."""
    split = prepared.split
    keep = np.sort(np.concatenate([split.train, split.validation]))
    data = prepared.data.subset(keep)
    position = {int(row): n for n, row in enumerate(keep)}
    train = np.array([position[int(r)] for r in split.train], dtype=np.int64)
    validation = np.array([position[int(r)] for r in split.validation], dtype=np.int64)
    return data, Split(train, validation, np.zeros(0, np.int64), split.train_classes,
                       split.validation_classes, [])  # fmt: skip


# (protocol hash, data root) -> (data with its cached features, split): a study's trials
# share one process, and each trial after the first loads nothing
_PREPARED: dict[tuple[str, str | None], tuple[Any, Split]] = {}


def trial_data(ctx: RunContext, protocol: Protocol, data_root: str | None) -> tuple[Any, Split]:
    """The data a trial trains and validates on, prepared once per process. On a cached trunk
    (`features:`), the test classes are dropped before the trunk runs, as a calibration does."""
    key = (protocol.hash, data_root)
    if key not in _PREPARED:
        prepared = prepare_data(protocol, data_root)
        data, split = (without_test(prepared) if protocol.features.cached
                       else (prepared.data, prepared.split))  # fmt: skip
        _PREPARED.clear()  # one protocol's data in memory at a time
        _PREPARED[key] = (with_cached_features(ctx, data, split), split)
    return _PREPARED[key]


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
    tracking: TrackerConfig = NO_TRACKING  # the study's: each trial a child run of it
    # a trial's tracker hears each epoch's numbers (set by run_trial, where the trial runs)
    epoch_stats: Callable[[int, dict[str, float]], None] | None = None

    def fold_stats(self, fold: int) -> Callable[[int, dict[str, float]], None] | None:
        """The tracker's epoch hook for one fold (its numbers under fold<k>/ with folds)."""
        if self.epoch_stats is None:
            return None
        hook = self.epoch_stats
        prefix = f"fold{fold}/" if self.folds > 1 else ""
        return lambda step, values: hook(step, {prefix + k: v for k, v in values.items()})

    def __call__(self, hyper: dict[str, Any], report: Callable[[int, float], None]) -> list[float]:
        ctx = RunContext(self.protocol, self.protocol.seeds[0], resolve_device(self.device),
                         max_steps=self.max_steps, data_root=self.data_root)  # fmt: skip
        data, split = trial_data(ctx, self.protocol, self.data_root)
        scores = []
        for fold, (train_idx, val_idx) in enumerate(class_folds(split, data.labels,
                                                                self.folds)):  # fmt: skip
            values: list[float] = []

            def on_validation(value: float, fold: int = fold, values: list = values) -> None:
                values.append(value)
                report(fold * 10_000 + len(values), value)

            model, stats = train_model(ctx, self.method, hyper, data, train_idx, val_idx,
                                       hooks=EpochHooks(on_validation=on_validation,
                                                        on_epoch_stats=self.fold_stats(fold)))  # fmt: skip
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

    with trial_tracker(trainer, trial, hyper) as tracker:
        try:
            scores = dataclasses.replace(trainer, epoch_stats=tracker.log_epoch)(hyper, report)
        except TrainingFailed as exc:
            trial.set_user_attr("failure", str(exc))
            tracker.log_final(0, {"objective": 0.0}, [])
            return 0.0
        trial.set_user_attr("fold_scores", scores)
        value = float(np.mean(scores))
        tracker.log_final(0, {"objective": value, **{f"fold{k}/score": v for k, v in
                                                      enumerate(scores)}}, [])  # fmt: skip
        return value


@contextmanager
def trial_tracker(trainer: Trainer, trial: Any, hyper: dict[str, Any]) -> Iterator[Tracker]:
    """The trial's tracker run, a child of the study's (null when the study is untracked);
    closed FINISHED when the trial ends (complete, failed or pruned), else KILLED."""
    import optuna

    tracker = open_tracker(trainer.tracking)
    key = hashlib.sha256(f"{trainer.tracking.parent}/{trial.number}".encode()).hexdigest()[:10]
    tracker.start(f"trial{trial.number}", key, {"trial": trial.number, "method": trainer.method,
                  **{f"hp.{k}": v for k, v in hyper.items()}})  # fmt: skip
    status = "KILLED"
    try:
        yield tracker
        status = "FINISHED"
    except optuna.TrialPruned:
        status = "FINISHED"
        raise
    finally:
        tracker.close(status)


def objective(trainer: Trainer, base: dict[str, Any], search: dict[str, Any]) -> Callable:
    return lambda trial: run_trial(trainer, trial, suggest(trial, base, search))
