"""`run --all-classes`: a model for use, not a benchmark run.

Once a verdict is in, the model to deploy should learn from every labelled class, not from
the half a benchmark run trains on: this trains the chosen method with the protocol's
settings (optimizer, budget, sampler, frozen trunk, the tuned configuration with --tuned) on
all classes of the dataset, and keeps its network as `run --save-model` does. Nothing is
tested (no class is left to test on), so it writes no result file: the model goes to
`<results-dir>/models/<protocol>/<run name>/seed<k>.model.pt`, outside `runs/`, which
`leaderboard` never reads, and its provenance says `all_classes` with the classes and images
it learned from and `test_metric: null`. `index` and `search` take it like any kept model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from harness.core import METHODS, HarnessError
from harness.data import Split, decoded_by, on_device, prepare_data
from harness.deploy.model import write_model
from harness.sweep.applicable import why_not_applicable
from harness.sweep.record import _describe_run, new_result
from harness.sweep.runner import kept_model
from harness.sweep.spec import RunSpec, resolve, run_context
from harness.train import train_model, with_cached_features

log = logging.getLogger(__name__)

MODELS = "models"


def fitted_path(results_dir: str | Path, protocol: str, run_name: str, seed: int) -> Path:
    """Where `run --all-classes` keeps a model: beside runs/, never inside it."""
    return Path(results_dir) / MODELS / protocol / run_name / f"seed{seed}.model.pt"


def fit_all_classes(spec: RunSpec, progress: bool = True) -> Path:
    """Train `spec` on every labelled class and write its kept model; returns its path."""
    spec = resolve(spec)
    ctx = run_context(spec, progress)
    protocol = ctx.protocol
    prepared = prepare_data(protocol, ctx.data_root)
    if why := why_not_applicable(spec.method, prepared.data, protocol.dataset.name):
        raise HarnessError(f"{why}: choose another method")
    parts = prepared.split
    every = np.arange(len(prepared.data), dtype=np.int64)
    classes = sorted({*parts.train_classes, *parts.validation_classes, *parts.test_classes})
    split = Split(every, np.zeros(0, np.int64), np.zeros(0, np.int64), classes, [], [])
    data = on_device(decoded_by(prepared.data, ctx.decoder, ctx.device, protocol), ctx.device)
    data = with_cached_features(ctx, data, split)
    record = new_result(spec, METHODS.get(spec.method))
    _describe_run(record, protocol, data, split, ctx.device)
    log.info("%s seed %d: training on all %d classes (%d images), no test", spec.method,
             spec.seed, len(classes), len(every))  # fmt: skip
    model, _ = train_model(ctx, spec.method, spec.hyperparameters, data, every)
    kept = kept_model(spec, ctx, model, record)
    kept.meta["provenance"]["test_metric"] = None
    kept.meta["provenance"]["all_classes"] = {
        "benchmark": False, "classes": len(classes), "images": len(every),
        "note": "trained on every labelled class: no test metrics; never read by leaderboard",
    }  # fmt: skip
    path = fitted_path(spec.results_dir, protocol.name, spec.run_name, spec.seed)
    write_model(path, kept)
    return path
