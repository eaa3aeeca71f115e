"""`tune --engine ray`: the study's trials as Ray tasks, against one Optuna storage.

The driver asks the sampler for each trial (so TPE stays seeded and sees every finished
trial), keeps as many trials in flight as the cluster has slots, and tells the study each
outcome; it never asks beyond `trials`, so a study ends with exactly that many finished
trials. A worker trains one configuration and reports its epochs to the storage (the median
pruner reads them there), so the storage must be reachable from the workers: the default
SQLite file on one machine, an RDB URL on a cluster. Interrupted, the driver records the
trials in flight as failed (not counted), as the local engine does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from harness.core import load_methods
from harness.sweep import TASK_RETRIES, import_ray, start_ray
from harness.tune.options import TuneOptions
from harness.tune.trial import Trainer, run_trial

log = logging.getLogger(__name__)


def trial_task(
    trainer: Trainer, study_name: str, storage: str, trial_id: int, hyper: dict, threads: int
) -> tuple[str, float | None]:
    """A Ray task: train one trial's configuration; ("complete", value) or ("pruned", None)."""
    import optuna

    load_methods()

    torch.set_num_threads(threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage)
    try:
        return "complete", run_trial(trainer, optuna.trial.Trial(study, trial_id), hyper)
    except optuna.TrialPruned:
        return "pruned", None


def optimize_on_ray(
    study: Any,
    trainer: Trainer,
    propose: Callable[[Any], dict[str, Any]],
    trials: int,
    options: TuneOptions,
) -> None:
    """Run `study` to `trials` finished (complete or pruned) trials as Ray tasks, each
    trial's hyperparameters from `propose(trial)`, at options.address with
    options.cpus_per_trial CPUs and options.gpus_per_trial GPUs per trial."""
    import optuna

    storage, cpus, gpus = str(options.storage), options.cpus_per_trial, options.gpus_per_trial

    ray = import_ray()
    started = start_ray(ray, options.address)
    task = ray.remote(trial_task).options(num_cpus=cpus, num_gpus=gpus,
                                          max_retries=TASK_RETRIES, retry_exceptions=False)  # fmt: skip
    state = optuna.trial.TrialState
    slots = max(1, int(ray.cluster_resources().get("CPU", 1) // cpus))
    in_flight: dict[Any, Any] = {}
    try:
        while True:
            done = len(study.get_trials(deepcopy=False, states=(state.COMPLETE, state.PRUNED)))
            while done + len(in_flight) < trials and len(in_flight) < slots:
                trial = study.ask()
                hyper = propose(trial)
                ref = task.remote(trainer, study.study_name, storage, trial._trial_id, hyper, cpus)
                in_flight[ref] = trial
            if not in_flight:
                return
            (ref,), _ = ray.wait(list(in_flight), num_returns=1)
            trial = in_flight.pop(ref)
            try:
                outcome, value = ray.get(ref)
            except Exception as exc:  # the trial's code crashed, or its worker died too often
                log.error("trial %d: %s", trial.number, str(exc).splitlines()[0])
                study.tell(trial, state=state.FAIL)
                continue
            if outcome == "pruned":
                study.tell(trial, state=state.PRUNED)
            else:
                study.tell(trial, value)
            log.info("trial %d: %s %s", trial.number, outcome, "" if value is None else value)
    except KeyboardInterrupt:
        for trial in in_flight.values():
            study.tell(trial, state=state.FAIL)
        raise
    finally:
        if started:
            ray.shutdown()
