"""Equal-budget tuning on validation classes (Musgrave et al., "A Metric Learning Reality
Check", 2020): every method gets the same number of Optuna trials over the search space its
file declares, each trial scored on classes carved from the training classes; the test split
is never embedded.

- Objective: the protocol's selection metric (`evaluation.select_by`) on the validation
  classes, at the best epoch (the epoch the runner's model selection keeps); with K folds,
  the training and validation classes are pooled and split into K class-disjoint folds, each
  validating a model trained on the other K - 1, and the objective is the mean over folds.
- Sampler: TPE, seeded (seed + the number of trials so far, so that a resumed study does not
  propose its first trials again); the first trial of a new study is the paper default.
- Pruner: median (a trial whose validation so far is below the median of earlier trials at
  the same epoch stops, from half its epochs on), recorded with the study.
- Storage: an Optuna RDB (SQLite under <results-dir>/tuning/ by default), so an interrupted
  study resumes, and workers sharing a storage URL share a study; a study ends with exactly
  N finished (complete or pruned) trials. A training failure is a finished trial scored 0.
- Output: the best hyperparameters as an overlay (<results-dir>/tuning/<protocol>/<method>.yaml)
  that `run --tuned` applies, and a figure of the objective per trial.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.core import (
    METHODS,
    HarnessError,
    MethodSpec,
    Protocol,
    load_protocol,
    protocol_hyperparameters,
)
from harness.data import check_data_root
from harness.records import Tracker, child_config, open_tracker
from harness.sweep import check_protocol, import_ray, tuning_dir
from harness.tune.options import TuneOptions
from harness.tune.overlay import write_overlay
from harness.tune.ray import optimize_on_ray
from harness.tune.trial import Trainer, objective, pruner_settings, suggest

DEFAULT = TuneOptions()

log = logging.getLogger(__name__)


def default_storage(results_dir: str | Path, protocol: str) -> str:
    return f"sqlite:///{(tuning_dir(results_dir, protocol) / 'studies.db').resolve()}"


def needs_validation(protocol: Protocol) -> None:
    if protocol.split.validation_fraction <= 0:
        raise HarnessError(
            f"protocol {protocol.name} carves no validation classes (split.validation_fraction "
            "and tuning.validation_fraction are 0), and tuning must never see the test classes; "
            "set tuning.validation_fraction (e.g. 0.3) in its YAML, or tune under a protocol "
            "with split.validation_fraction > 0 (e.g. --protocol tuning)"
        )


def tuning_view(protocol: Protocol) -> Protocol:
    """The protocol a study validates under: the protocol itself when its split carves
    validation classes; else, with `tuning.validation_fraction`, the same protocol with that
    fraction of its training classes carved (the tuned configuration then trains under the
    protocol itself, on all of them); else a one-line refusal."""
    if protocol.split.validation_fraction <= 0 and protocol.tuning.validation_fraction > 0:
        split = dataclasses.replace(protocol.split,
                                    validation_fraction=protocol.tuning.validation_fraction)  # fmt: skip
        protocol = dataclasses.replace(protocol, split=split)
    needs_validation(protocol)
    return protocol


def tune_method(
    protocol: Protocol,
    method: str,
    trials: int,
    options: TuneOptions = DEFAULT,
    runs_under: Protocol | None = None,
) -> Path:
    """Run (or resume) one method's study to `trials` finished trials (here, or as Ray tasks
    with options.engine "ray"); write its overlay and figure, and return the overlay's path.
    `runs_under`: the protocol the tuned configuration trains under when it is not the one
    validated (tuning_view), whose hash the overlay records."""
    needs_validation(protocol)
    spec = METHODS.get(method)
    base = protocol_hyperparameters(protocol, method)
    storage = options.storage or default_storage(options.results_dir, protocol.name)
    options = dataclasses.replace(options, storage=storage)
    study = open_study(protocol, spec, options)
    if not study.trials and spec.search:  # the paper's configuration is always tried
        study.enqueue_trial({k: base[k] for k in spec.search})
    trainer = Trainer(protocol, method, options.folds, options.data_root, options.device,
                      options.max_steps)  # fmt: skip
    done = _finished(study)
    if done < trials:
        log.info("%s: %d of %d trials done; running %d", method, done, trials, trials - done)
        with study_tracker(protocol, spec, study, options) as tracker:
            tracking = child_config(options.tracking, tracker)
            _optimize(study, dataclasses.replace(trainer, tracking=tracking), base, spec, trials,
                      options)  # fmt: skip
    return write_overlay(study, protocol, spec, base, options, runs_under or protocol)


FINISHED = ("COMPLETE", "PRUNED")  # the trial states a study counts to its N


def _optimize(study: Any, trainer: Trainer, base: dict[str, Any], spec: MethodSpec,
              trials: int, options: TuneOptions) -> None:  # fmt: skip
    """Run the study to `trials` finished trials, here or as Ray tasks."""
    import optuna

    finished = tuple(optuna.trial.TrialState[state] for state in FINISHED)
    if options.engine == "ray":
        optimize_on_ray(study, trainer, lambda trial: suggest(trial, base, spec.search), trials,
                        options)  # fmt: skip
        return
    study.optimize(objective(trainer, base, spec.search), n_trials=trials - _finished(study),
                   catch=(),
                   show_progress_bar=options.progress,
                   callbacks=[optuna.study.MaxTrialsCallback(trials, states=finished)])  # fmt: skip


def _finished(study: Any) -> int:
    """The study's finished (complete or pruned) trials."""
    return sum(trial.state.name in FINISHED for trial in study.get_trials(deepcopy=False))


@contextmanager
def study_tracker(
    protocol: Protocol, spec: MethodSpec, study: Any, options: TuneOptions
) -> Iterator[Tracker]:
    """The study's tracker run (its trials are child runs), named by the study, so that a
    resumed study goes on in it; each trial's objective logged at its number at the end."""
    tracker = open_tracker(options.tracking)
    key = hashlib.sha256(study.study_name.encode()).hexdigest()[:10]
    tracker.start(f"tune/{protocol.name}/{spec.name}", key, {
        "protocol": protocol.name, "protocol_version": protocol.version,
        "protocol_hash": protocol.hash, "method": spec.name, "folds": options.folds,
        "device": options.device, "precision": protocol.precision,
        "max_steps": options.max_steps, "search": sorted(spec.search),
    })  # fmt: skip
    status = "KILLED"
    try:
        yield tracker
        for trial in study.get_trials(deepcopy=False):
            if trial.state.name in FINISHED and trial.value is not None:
                tracker.log_epoch(trial.number, {"tune/objective": trial.value})
        status = "FINISHED"
    finally:
        tracker.close(status)


def open_study(protocol: Protocol, spec: MethodSpec, options: TuneOptions) -> Any:
    """The method's study in options.storage (created or loaded), with its seeded TPE
    sampler; a study of capped trials (--max-steps) is another study, never resumed as a full
    one."""
    import optuna

    storage, max_steps = str(options.storage), options.max_steps

    if storage.startswith("sqlite:///"):
        Path(storage[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = f"{protocol.name}@{protocol.hash}/{spec.name}@v{spec.version}/folds{options.folds}"
    if max_steps:
        name += f"/max_steps{max_steps}"
    study = optuna.create_study(
        study_name=name, storage=storage, load_if_exists=True, direction="maximize",
        pruner=optuna.pruners.MedianPruner(**pruner_settings(protocol)),
    )  # fmt: skip
    # seeded, and seeded anew on a resume (a sampler restarted with the first seed would
    # propose the trials it already proposed again)
    study.sampler = optuna.samplers.TPESampler(seed=options.sampler_seed + len(study.trials))
    return study


def checked(
    protocol_name: str, methods: list[str], trials: int, options: TuneOptions = DEFAULT
) -> tuple[Protocol, Protocol]:
    """(the protocol the studies validate under, the protocol tuned runs train under), once
    every input is checked: bad input fails here, before any trial."""
    if options.engine == "ray":
        if options.processes > 1:
            raise HarnessError("--processes runs studies side by side on this machine; with "
                               "--engine ray the trials already run as Ray tasks: drop "
                               "--processes")  # fmt: skip
        import_ray()  # say how to install it before anything runs
    runs_under = load_protocol(protocol_name)
    protocol = tuning_view(runs_under)
    if trials < 1 or not math.isfinite(trials):
        raise HarnessError(f"--trials must be at least 1, got {trials}")
    check_protocol(protocol, methods)  # unknown names and bad values fail before any training
    check_data_root(protocol, options.data_root)  # and a missing --data-root
    return protocol, runs_under
