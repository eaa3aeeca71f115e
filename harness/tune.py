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
  the same epoch stops), recorded with the study.
- Storage: an Optuna RDB (SQLite under <results-dir>/tuning/ by default), so an interrupted
  study resumes, and workers sharing a storage URL share a study; a study ends with exactly
  N finished (complete or pruned) trials. A training failure is a finished trial scored 0.
- Output: the best hyperparameters as an overlay (<results-dir>/tuning/<protocol>/<method>.yaml)
  that `run --tuned` applies, and a figure of the objective per trial.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from harness.devices import resolve_device
from harness.errors import HarnessError
from harness.evaluate import selection_score
from harness.method import METHODS, protocol_hyperparameters
from harness.preflight import check_protocol
from harness.protocol import Protocol, load_protocol
from harness.runner import prepare_data, train_model
from harness.splits import Split
from harness.train import TrainingFailed

log = logging.getLogger(__name__)
OVERLAY_SCHEMA = 1
# a trial stops when its validation from epoch 4 on is below the median of the trials before
# it at the same epoch, once 3 trials have finished (earlier epochs rank configurations by
# how fast they start, not where they end: with a warm-up of 1 epoch, 4 of 8 triplet trials
# were pruned at epoch 2 within 0.002 of the median)
PRUNER = {"n_startup_trials": 3, "n_warmup_steps": 3}


def tuning_dir(results_dir: str | Path, protocol: str) -> Path:
    return Path(results_dir) / "tuning" / protocol


def overlay_path(
    results_dir: str | Path, protocol: str, method: str, max_steps: int | None = None
) -> Path:
    """Where a study's best configuration goes; a capped study (--max-steps) has its own
    file, so a smoke study never replaces the full one."""
    capped = f".max_steps{max_steps}" if max_steps else ""
    return tuning_dir(results_dir, protocol) / f"{method}{capped}.yaml"


def default_storage(results_dir: str | Path, protocol: str) -> str:
    return f"sqlite:///{(tuning_dir(results_dir, protocol) / 'studies.db').resolve()}"


def needs_validation(protocol: Protocol) -> None:
    if protocol.split.validation_fraction <= 0:
        raise HarnessError(
            f"protocol {protocol.name} carves no validation classes (split.validation_fraction "
            "is 0), and tuning must never see the test classes; tune under a protocol with "
            "split.validation_fraction > 0 (e.g. --protocol tuning)"
        )


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
        prepared = prepare_data(self.protocol, self.data_root)
        data, device = prepared.data, resolve_device(self.device)
        seed = self.protocol.seeds[0]
        scores = []
        for fold, (train_idx, val_idx) in enumerate(class_folds(prepared.split, data.labels,
                                                                self.folds)):  # fmt: skip
            values: list[float] = []

            def on_validation(value: float, fold: int = fold, values: list = values) -> None:
                values.append(value)
                report(fold * 10_000 + len(values), value)

            model, stats = train_model(self.protocol, self.method, hyper, seed, device, data,
                                       train_idx, val_idx, on_validation=on_validation,
                                       max_steps=self.max_steps)  # fmt: skip
            scores.append(
                max(stats.validation) if stats.validation else selection_score(
                    model.backbone, model.method, data.images[val_idx], data.labels[val_idx],
                    self.protocol, device, seed)
            )  # fmt: skip
        return scores


def tune_method(
    protocol: Protocol,
    method: str,
    trials: int,
    *,
    folds: int = 1,
    storage: str | None = None,
    results_dir: str | Path = "results",
    sampler_seed: int = 0,
    data_root: str | None = None,
    device: str = "auto",
    max_steps: int | None = None,
    progress: bool = False,
    engine: str = "local",
    address: str | None = None,
    cpus_per_trial: int = 1,
    gpus_per_trial: float = 0.0,
) -> Path:
    """Run (or resume) one method's study to `trials` finished trials (here, or as Ray tasks
    with engine="ray"); write its overlay and figure, and return the overlay's path."""
    import optuna

    needs_validation(protocol)
    spec = METHODS.get(method)
    base = protocol_hyperparameters(protocol, method)
    storage = storage or default_storage(results_dir, protocol.name)
    study = open_study(protocol, method, spec.version, folds, storage, sampler_seed, max_steps)
    if not study.trials and spec.search:  # the paper's configuration is always tried
        study.enqueue_trial({k: base[k] for k in spec.search})
    trainer = Trainer(protocol, method, folds, data_root, device, max_steps)
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    done = len(study.get_trials(deepcopy=False, states=finished))
    if done < trials:
        log.info("%s: %d of %d trials done; running %d", method, done, trials, trials - done)
    if engine == "ray" and done < trials:
        from harness.tune_ray import optimize_on_ray

        optimize_on_ray(study, storage, trainer, base, spec.search, trials, address,
                        cpus_per_trial, gpus_per_trial)  # fmt: skip
    elif done < trials:
        study.optimize(objective(trainer, base, spec.search), n_trials=trials - done, catch=(),
                       show_progress_bar=progress,
                       callbacks=[optuna.study.MaxTrialsCallback(trials, states=finished)])  # fmt: skip
    return write_overlay(study, protocol, method, spec.version, base, folds, storage, results_dir,
                         max_steps)  # fmt: skip


def open_study(
    protocol: Protocol, method: str, version: int, folds: int, storage: str, sampler_seed: int,
    max_steps: int | None = None,
) -> Any:  # fmt: skip
    """The method's study in `storage` (created or loaded), with its seeded TPE sampler; a
    study of capped trials (--max-steps) is another study, never resumed as a full one."""
    import optuna

    if storage.startswith("sqlite:///"):
        Path(storage[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = f"{protocol.name}@{protocol.hash}/{method}@v{version}/folds{folds}"
    if max_steps:
        name += f"/max_steps{max_steps}"
    study = optuna.create_study(
        study_name=name, storage=storage, load_if_exists=True, direction="maximize",
        pruner=optuna.pruners.MedianPruner(**PRUNER),
    )  # fmt: skip
    # seeded, and seeded anew on a resume (a sampler restarted with the first seed would
    # propose the trials it already proposed again)
    study.sampler = optuna.samplers.TPESampler(seed=sampler_seed + len(study.trials))
    return study


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


def write_overlay(
    study: Any,
    protocol: Protocol,
    method: str,
    version: int,
    base: dict[str, Any],
    folds: int,
    storage: str,
    results_dir: str | Path,
    max_steps: int | None = None,
) -> Path:
    """The study's best configuration as a protocol overlay, and its figure (a capped study's
    overlay says so, and `run --tuned` refuses it)."""
    import optuna

    COMPLETE, PRUNED = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED  # noqa: N806
    states = study.get_trials(deepcopy=False)
    complete = [t for t in states if t.state == COMPLETE]
    if not complete:
        raise HarnessError(f"the {method} study has no complete trial yet; run tune again")
    best = max(complete, key=lambda t: t.value)
    path = overlay_path(results_dir, protocol.name, method, max_steps)
    figure = path.with_suffix(".png")
    title = f"{method} on {protocol.name}: {protocol.evaluation.select_by}"
    study_figure([t for t in states if t.state in (COMPLETE, PRUNED)], figure, title)
    record = {
        "schema": OVERLAY_SCHEMA,
        "protocol": protocol.name, "protocol_version": protocol.version,
        "protocol_hash": protocol.hash, "method": method, "method_version": version,
        "hyperparameters": {**base, **best.params},
        "study": {
            "name": study.study_name, "storage": _recorded_storage(storage, results_dir),
            "folds": folds,
            "objective": f"{protocol.evaluation.select_by} on validation classes (best epoch"
                         f"{', mean over folds' if folds > 1 else ''})",
            "sampler": "TPE (seeded)", "pruner": f"median {PRUNER}", "searched": sorted(best.params),
            "trials": sum(t.state in (COMPLETE, PRUNED) for t in states),
            "complete": len(complete),
            "pruned": sum(t.state == PRUNED for t in states),
            "interrupted": sum(t.state == optuna.trial.TrialState.FAIL for t in states),
            "best_trial": best.number, "best_value": round(float(best.value), 6),
            "paper_default_value": _default_value(complete, base),
            "figure": figure.name,
        } | ({"max_steps": max_steps} if max_steps else {}),
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    header = "# Generated by `harness tune`: the best configuration found on validation classes.\n"
    tmp.write_text(header + yaml.safe_dump(record, sort_keys=False), encoding="utf-8")
    tmp.replace(path)
    return path


def _default_value(trials: list[Any], base: dict[str, Any]) -> float | None:
    for t in trials:
        if all(base.get(k) == v for k, v in t.params.items()):
            return round(float(t.value), 6)
    return None


def _recorded_storage(url: str, results_dir: str | Path) -> str:
    """The storage as a record may say it: without its password, and an SQLite file inside the
    results folder relative to it (`sqlite:///<results-dir>/...`), so the record does not
    carry this machine's paths."""
    if url.startswith("sqlite:///"):
        file = Path(url[len("sqlite:///") :]).resolve()
        if file.is_relative_to(Path(results_dir).resolve()):
            return f"sqlite:///<results-dir>/{file.relative_to(Path(results_dir).resolve())}"
    return _safe_url(url)


def _safe_url(url: str) -> str:
    """A storage URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def study_figure(trials: list[Any], out: Path, title: str) -> None:
    """Objective per trial (pruned trials at the value they were stopped at, as crosses) and
    the best complete value so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    complete = [t for t in trials if t.state.name == "COMPLETE"]
    pruned = [t for t in trials if t.state.name == "PRUNED" and t.intermediate_values]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([t.number for t in complete], [t.value for t in complete], "o", label="trial")
    if pruned:
        last = [t.intermediate_values[max(t.intermediate_values)] for t in pruned]
        ax.plot([t.number for t in pruned], last, "x", color="grey",
                label="pruned (value when stopped)")  # fmt: skip
    best = np.maximum.accumulate([t.value for t in complete])
    ax.step([t.number for t in complete], best, where="post", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("validation objective")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def load_overlay(
    results_dir: str | Path, protocol: Protocol, method: str, max_steps: int | None = None
) -> dict[str, Any]:
    """The tuned configuration of `method` under `protocol`; a clear error when there is none,
    it was tuned under another version of the protocol or method, or its trials were capped
    (--max-steps) and this run (`max_steps`) is not. A capped run takes the study capped
    alike, else the full study, else the capped study of the most steps."""
    path = overlay_path(results_dir, protocol.name, method)
    if max_steps:
        capped = sorted(tuning_dir(results_dir, protocol.name).glob(f"{method}.max_steps*.yaml"),
                        key=lambda p: int(p.stem.rsplit("max_steps", 1)[1]))  # fmt: skip
        same = overlay_path(results_dir, protocol.name, method, max_steps)
        if same.is_file():
            path = same
        elif not path.is_file() and capped:
            path = capped[-1]
    if not path.is_file():
        raise HarnessError(f"no tuned configuration for {method} under {protocol.name} ({path}); "
                           f"run `harness tune --protocol {protocol.name} --method {method}` first")  # fmt: skip
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if data.get("protocol_hash") != protocol.hash:
        raise HarnessError(f"{path} was tuned under protocol hash {data.get('protocol_hash')}, "
                           f"not {protocol.hash}; tune again")  # fmt: skip
    if data.get("method_version") != METHODS.get(method).version:
        raise HarnessError(f"{path} was tuned for {method} v{data.get('method_version')}; "
                           f"it is now v{METHODS.get(method).version}: tune again")  # fmt: skip
    capped = (data.get("study") or {}).get("max_steps")
    if capped and not max_steps:
        raise HarnessError(f"{path} comes from trials capped at --max-steps {capped} (a smoke "
                           "study) and this run is not capped: tune again without --max-steps")  # fmt: skip
    data["path"] = str(path)
    return data


def tune(protocol_name: str, methods: list[str], trials: int, **options: Any) -> dict[str, Path]:
    """Tune each method with the same number of trials; returns the overlay per method."""
    if options.get("engine") == "ray":
        from harness.engines import import_ray

        import_ray()  # say how to install it before anything runs
    protocol = load_protocol(protocol_name)
    needs_validation(protocol)
    if trials < 1 or not math.isfinite(trials):
        raise HarnessError(f"--trials must be at least 1, got {trials}")
    check_protocol(protocol, methods)  # unknown names and bad values fail before any training
    return {m: tune_method(protocol, m, trials, **options) for m in methods}


def add_parser(sub: Any) -> None:
    from harness.argtypes import positive_int

    tn = sub.add_parser("tune", help="equal-budget Optuna tuning on validation classes")
    tn.add_argument("--protocol", required=True, help="protocol name or YAML path (needs "
                    "split.validation_fraction > 0)")  # fmt: skip
    tn.add_argument("--method", required=True, help="NAME[,NAME...]")
    tn.add_argument("--trials", type=positive_int, required=True, help="trials per method")
    tn.add_argument("--folds", type=positive_int, default=1,
                    help="class-disjoint folds of the training classes (default 1)")  # fmt: skip
    tn.add_argument("--storage", help="Optuna storage URL (default: an SQLite file under "
                    "<results-dir>/tuning/<protocol>/); share one to run several workers")  # fmt: skip
    tn.add_argument("--results-dir", default="results")
    tn.add_argument("--data-root", help="folder holding the dataset's files")
    tn.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    tn.add_argument("--max-steps", type=positive_int, help="cap each trial's steps (smoke)")
    tn.add_argument("--engine", default="local", choices=["local", "ray"],
                    help="local: trials one after another here; ray: trials as Ray tasks")  # fmt: skip
    tn.add_argument("--address", help="with --engine ray: an existing cluster (default: local)")
    tn.add_argument("--cpus-per-trial", type=positive_int, default=1,
                    help="with --engine ray: CPUs (and torch threads) per trial")  # fmt: skip
    tn.add_argument("--gpus-per-trial", type=float, default=0.0,
                    help="with --engine ray: GPUs per trial")  # fmt: skip


def cmd_tune(args: Any) -> int:
    import signal
    import sys

    import methods  # noqa: F401  (registers every method)
    from harness.cli import _terminate

    names = [m.strip() for m in args.method.split(",") if m.strip()]
    previous = signal.signal(signal.SIGTERM, _terminate)  # SIGTERM stops like Ctrl-C
    try:
        written = tune(args.protocol, names, args.trials, folds=args.folds, storage=args.storage,
                       results_dir=args.results_dir, data_root=args.data_root,
                       device=args.device, max_steps=args.max_steps, progress=not args.quiet,
                       engine=args.engine, address=args.address,
                       cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial)  # fmt: skip
    except KeyboardInterrupt:
        print("\ninterrupted: finished trials are kept in the study (the interrupted one is "
              "recorded as failed); run the same command again to resume", file=sys.stderr)  # fmt: skip
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    for name, path in written.items():
        study = yaml.safe_load(path.read_text(encoding="utf-8"))["study"]
        print(f"{name}: best {study['best_value']:.4f} (trial {study['best_trial']}; paper "
              f"default {study['paper_default_value']}) of {study['trials']} trials -> {path}")  # fmt: skip
    return 0
