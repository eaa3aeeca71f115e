"""Timing every registered method at a calibration candidate's settings, so that the
candidate's estimated sweep counts each method at its own cost.

A calibration trains only its reference methods, but the sweep it budgets trains every
registered method, and their costs differ by far more than the reference methods' do: PDDM's
learned scorers cost m^2 x D a step (m the batch, D the embedding), HDC evaluates three
concatenated embeddings. Projecting every method from the reference methods' mean time per
run missed that by a factor of about 5 on a 4096-d embedding.

The probe trains each registered method `PROBE_STEPS` steps on the candidate's cached
features (its training classes) and times one step, and times its evaluation on the
validation classes: the protocol's whole evaluation (what a sweep's run computes), and for
the reference methods the selection metric alone (what their calibration runs scored). Settings that do not change what a
step or an evaluation costs (the budget, the optimizer, the schedule) share one probe.

A method's seconds per run at a candidate are then the reference methods' mean training
seconds per run (their measured run time less their selection scoring), times the method's
step time over the reference methods' mean step time, plus the method's own evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from harness.core import METHODS, RunContext, TrainingFailed, protocol_hyperparameters

log = logging.getLogger(__name__)

PROBE_STEPS = 6
# settings that change neither what one training step costs nor what an evaluation costs
UNTIMED = ("budget.", "optimizer.", "schedule.")


def probe_id(candidate: dict[str, Any]) -> str:
    """The candidate's settings that a step's or an evaluation's cost depends on: candidates
    that share them share one probe."""
    return ", ".join(f"{k}={v}" for k, v in candidate.items() if not k.startswith(UNTIMED)) or "-"


def probe_methods(ctx: RunContext, data: Any, split: Any, probe: dict[str, Any],
                  reference: list[str], written: Any = None) -> None:  # fmt: skip
    """Time every registered method not yet in `probe` (method -> {step_seconds,
    eval_seconds}, and select_seconds for the `reference` methods, whose calibration runs
    include it) on `data` (cached features; split: training and validation classes).
    `written` is called after each method, so an interrupted probe resumes."""
    from harness.evaluate import evaluate, selection_score
    from harness.train import train_model

    ctx = dataclasses.replace(ctx, max_steps=PROBE_STEPS)
    images, labels = data.images[split.validation], data.labels[split.validation]
    for name in METHODS.names():
        if name in probe:
            continue
        if METHODS.get(name).needs_coarse_labels and data.coarse_labels is None:
            probe[name] = {"not_applicable": "needs coarse labels"}  # a sweep skips it at once
            continue
        try:
            model, stats = train_model(ctx, name, protocol_hyperparameters(ctx.protocol, name),
                                       data, split.train)  # fmt: skip
        except TrainingFailed as exc:  # timed as the reference methods' mean
            probe[name] = {"failure": str(exc)}
            log.info("probe: %s failed (%s): counted at the reference methods' cost", name, exc)
            continue
        started = time.perf_counter()
        evaluate(ctx, model.backbone, model.method, images, labels)
        probe[name] = {"step_seconds": round(stats.train_seconds / max(1, stats.steps), 5),
                       "eval_seconds": round(time.perf_counter() - started, 4)}  # fmt: skip
        if name in reference:  # what a calibration run spent scoring, besides training
            started = time.perf_counter()
            selection_score(ctx, model.backbone, model.method, images, labels)
            probe[name]["select_seconds"] = round(time.perf_counter() - started, 4)
        log.info("probe: %s %.3f s a step, evaluation %.2f s", name,
                 probe[name]["step_seconds"], probe[name]["eval_seconds"])  # fmt: skip
        if written is not None:
            written()


def all_timed(probe: dict[str, Any], methods: list[str] | tuple[str, ...]) -> bool:
    """Whether the probe timed a step of every reference method: only then is each method
    counted at its own cost (run_seconds is None otherwise)."""
    return bool(methods) and all("step_seconds" in probe.get(m, {}) for m in methods)


def run_seconds(runs: dict[str, Any], probe: dict[str, Any], methods: list[str],
                scale: dict[str, float]) -> dict[str, float] | None:  # fmt: skip
    """Each probed method's seconds per run of the full sweep: the reference `methods`'
    mean training seconds per run (their run seconds in `runs` less their selection scoring)
    x the method's step time over theirs, x scale["train"], plus its evaluation x
    scale["eval"]. A method whose probe failed counts at the reference methods' mean, one the
    protocol cannot run (coarse labels it lacks) at 0. None when
    a reference method is not probed (nothing to compare with)."""
    if not all_timed(probe, methods):
        return None
    timed = list(methods)
    train = float(np.mean([max(0.0, runs[m]["seconds"] - probe[m]["select_seconds"])
                           for m in timed]))  # fmt: skip
    step = float(np.mean([probe[m]["step_seconds"] for m in timed]))
    evals = float(np.mean([probe[m]["eval_seconds"] for m in timed]))
    out = {}
    for name, p in probe.items():
        if "not_applicable" in p:
            out[name] = 0.0
            continue
        ratio = p["step_seconds"] / step if "step_seconds" in p and step > 0 else 1.0
        own_eval = p.get("eval_seconds", evals)
        out[name] = train * ratio * scale["train"] + own_eval * scale["eval"]
    return out


def scales(sizes: dict[str, int]) -> dict[str, float]:
    """From the calibration's data to the protocol's: training time grows with the training
    images (an epoch's steps); evaluation with the square of the images retrieved among
    (all-vs-all: every pair is scored), the test images against the validation images. On
    committed birds runs (512-d) the square still fell short for the learned scorers (test
    over validation evaluation: 17x for pddm_score and lmdm_score, square 10.8x, linear
    3.3x) and overshot the cheap methods (6.3x for contrastive)."""
    ratio = (sizes["images"] - sizes["train"]) / max(
        1, sizes["calibration_images"] - sizes["calibration_train"]
    )
    return {"train": sizes["train"] / max(1, sizes["calibration_train"]), "eval": ratio**2}
