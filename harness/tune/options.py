"""How a `tune` command runs its studies: the same options for every method it tunes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.records import NO_TRACKING, TrackerConfig


@dataclass(frozen=True)
class TuneOptions:
    """The options of one `tune` command, shared by every method's study.

    folds: class-disjoint folds of the training classes (1: the protocol's own validation
    classes); storage: the Optuna storage URL (None: an SQLite file under
    <results_dir>/tuning/<protocol>/); sampler_seed: the TPE sampler's first seed; data_root,
    device: where the data and the trials run; max_steps: a cap on each trial's steps (a
    smoke study, kept apart from the full one); progress: Optuna's bar; engine: "local"
    (trials one after another here) or "ray" (trials as Ray tasks, on a cluster at
    `address`, each with cpus_per_trial CPUs and gpus_per_trial GPUs); processes: with the
    local engine, how many methods' studies run side by side, each in a process of its own
    (harness.tune.processes); tracking: the tracker of the study (one tracker run) and its
    trials (its child runs)."""

    folds: int = 1
    storage: str | None = None
    results_dir: str | Path = "results"
    sampler_seed: int = 0
    data_root: str | None = None
    device: str = "auto"
    max_steps: int | None = None
    progress: bool = False
    engine: str = "local"
    address: str | None = None
    cpus_per_trial: int = 1
    gpus_per_trial: float = 0.0
    processes: int = 1
    tracking: TrackerConfig = NO_TRACKING
