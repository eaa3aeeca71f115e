"""The whole `python -m harness cost` measurement of a protocol, as the record written to
results/cost/<protocol>.json: per method, scaling on random inputs (with its fits); then the
throughput of the training step, every method once per round in interleaved rounds, the
fastest round kept; the consistency check of those throughputs; then the harness's overhead
on one method.

Models come from `harness.train.build_model`, the runner's own builder, and are trained by
the harness's own loop parts (`harness.train.start_training`, `harness.train.train`):
throughput and overhead time the very model and step a run trains (the same seed, so the
same initial backbone for every method).
The synthetic-scaling method is built for a context with room for the largest P classes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core import METHODS, HarnessError, MethodContext, protocol_hyperparameters
from harness.cost.consistency import consistency
from harness.cost.fit import FIXED_MULTIPLE, PowerFit, fit_summary, fits
from harness.cost.overhead import measure_overhead, overhead_method
from harness.cost.records import COST_SCHEMA, log_line
from harness.cost.scaling import (
    CELL_SECONDS,
    DEFAULT_BATCH_SIZES,
    DEFAULT_REPEATS,
    MAX_CALL_SECONDS,
    MEMORY_SHARE,
    SLOW_CALL,
    measure_fixed_cost,
    measure_scaling,
    parse_batch_sizes,
)
from harness.cost.throughput import (
    DEFAULT_ROUNDS,
    DEFAULT_STEPS,
    WARMUP_STEPS,
    random_init,
    throughput_rounds,
    training_set,
)
from harness.data import prepare_data
from harness.records import environment
from harness.train import build_method, build_model, build_seeded_backbone

if TYPE_CHECKING:
    from harness.core import Method, RunContext
    from harness.data import PreparedData
    from harness.train import Model, TrainingSet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CostOptions:
    """What `python -m harness cost` measures and how long: the batch sizes m of the
    scaling, its timed calls per size (at most), the training steps timed per method and
    round for throughput, the interleaved throughput rounds, whether to compare the harness
    with the bare loop (`overhead`), with each piece of bookkeeping alone (`breakdown`), and
    on which method (`overhead_on`; None: the first method whose throughput was measured)."""

    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES
    repeats: int = DEFAULT_REPEATS
    steps: int = DEFAULT_STEPS
    rounds: int = DEFAULT_ROUNDS
    overhead: bool = True
    breakdown: bool = False
    overhead_on: str | None = None


@dataclass
class _Setup:
    """What every method's measurement shares: the run context (the protocol with a random
    backbone, the seed, the device), the data, the resolved hyperparameters, and the contexts
    the methods are built for."""

    ctx: RunContext
    prepared: PreparedData
    data: TrainingSet
    hyper: dict[str, dict[str, Any]]
    context: MethodContext  # the real one, as in `run`
    synthetic: MethodContext  # room for the largest P random classes

    def model(self, name: str) -> Model:
        """The model `run` would train for this method (same builder, same seed)."""

        return build_model(
            self.ctx, name, self.hyper[name], in_channels=self.prepared.data.images.shape[1],
            num_classes=self.context.num_classes,
            num_coarse_classes=self.context.num_coarse_classes,
        )  # fmt: skip

    def synthetic_method(self, name: str) -> Method:
        import torch

        torch.manual_seed(self.ctx.seed)
        return build_method(name, self.synthetic, self.hyper[name], self.ctx.device)


def _setup(ctx: RunContext, prepared: PreparedData, names: Sequence[str], largest_p: int) -> _Setup:
    """The shared setup for `names` under `ctx` (whose protocol is the one timed)."""
    data, split = prepared.data, prepared.split
    hyper = {n: protocol_hyperparameters(ctx.protocol, n) for n in names}
    num_coarse = len(data.coarse_names) if data.coarse_names else None
    backbone = build_seeded_backbone(ctx, data.images.shape[1])
    context = MethodContext(tuple(backbone.stage_dims), ctx.protocol.embedding_dim,
                            len(np.unique(data.labels[split.train])), num_coarse)  # fmt: skip
    # random classes need room for the largest P; a classifier head then has that many rows
    synthetic = dataclasses.replace(context, num_classes=max(context.num_classes, largest_p),
                                    num_coarse_classes=num_coarse or 4)  # fmt: skip
    return _Setup(ctx, prepared, training_set(prepared), hyper, context, synthetic)


# What a method with no miner does instead, by family: the cost table's note
NO_MINER = {
    "proxies": "no miner: the loss scores the m embeddings against the C classes' weights, O(m C)",
    "batch": "no miner: the loss reads the whole batch's similarities at once",
}


def _method_entry(name: str, version: int, family: str, hyper: dict[str, Any]) -> dict[str, Any]:
    """Every key present from the start, so not-applicable and failed methods keep the
    schema (None: nothing measured)."""
    empty = fit_summary(dict.fromkeys(("evaluated", "tuples", "mining_time", "loss_time"),
                                      PowerFit(None, None, None, None, [], "none")))  # fmt: skip
    return {"method": name, "version": version, "family": family, "hyperparameters": hyper,
            "status": "ok", "reason": None, **empty, "has_miner": None, "fits": None,
            "fixed_cost": None, "measurements": [], "throughput": None}  # fmt: skip


def _measure_method(setup: _Setup, name: str, options: CostOptions) -> dict[str, Any]:
    """One method's entry with its scaling and fits (its throughput comes later, in the
    interleaved rounds: `_wants_throughput`); a failure is recorded in the entry (one broken
    method does not stop the others). `options.batch_sizes`: parsed."""

    spec, protocol = METHODS.get(name), setup.ctx.protocol
    entry = _method_entry(name, spec.version, spec.family, setup.hyper[name])
    try:
        method = setup.synthetic_method(name)
        if not method.trains:
            entry.update(status="not_applicable", reason="no loss: nothing is trained")
            log.info("cost %s: not applicable (no loss)", name)
            return entry
        t0 = time.perf_counter()
        fixed = _fixed_cost(setup, name, method, options.repeats)
        cells = measure_scaling(setup.ctx, method, setup.synthetic, options.batch_sizes,
                                repeats=options.repeats)  # fmt: skip
        fitted = fits(cells, fixed)
        entry.update(fit_summary(fitted), has_miner=method.miner is not None, measurements=cells,
                     fixed_cost=fixed)  # fmt: skip
        if method.miner is None:
            entry["reason"] = NO_MINER.get(spec.family)
        entry["fits"] = {key: f.as_dict() for key, f in fitted.items()}
        if spec.needs_coarse_labels and not setup.prepared.data.has_coarse:
            entry["reason"] = f"{protocol.dataset.name} has no coarse labels: no throughput"
        log.info("cost %s: %s; %.1f s", name, log_line(entry), time.perf_counter() - t0)
    except (KeyboardInterrupt, HarnessError):
        raise
    except Exception as exc:  # one broken method does not stop the others
        entry.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        log.warning("cost %s failed: %s", name, entry["reason"])
    return entry


def _fixed_cost(setup: _Setup, name: str, method: Method, repeats: int) -> dict[str, Any] | None:
    """The method's call on its smallest batch (scaling.measure_fixed_cost); None when that
    batch does not suit it (a plugin's method may need more classes): the time fits then
    take the smallest size measured for the fixed cost."""
    try:
        return measure_fixed_cost(setup.ctx, method, setup.synthetic, repeats=repeats)
    except (KeyboardInterrupt, HarnessError):
        raise
    except Exception as exc:
        log.warning("cost %s: no call on the smallest batch (%s: %s); the time fits take the "
                    "smallest size measured for the fixed cost", name, type(exc).__name__,
                    exc)  # fmt: skip
        return None


def _wants_throughput(setup: _Setup, entry: dict[str, Any]) -> bool:
    """Whether the method's throughput is measured: it trains, its scaling did not fail, and
    the data has the coarse labels it needs."""
    spec = METHODS.get(entry["method"])
    return entry["status"] == "ok" and not (
        spec.needs_coarse_labels and not setup.prepared.data.has_coarse
    )


def _throughputs(setup: _Setup, entries: list[dict[str, Any]], options: CostOptions) -> None:
    """Every measured method's throughput into its entry, timed in interleaved rounds
    (throughput.throughput_rounds); a method that fails there is marked failed."""
    wanted = {e["method"]: e for e in entries if _wants_throughput(setup, e)}
    if not wanted:
        return
    t0 = time.perf_counter()
    models = {name: functools.partial(setup.model, name) for name in wanted}
    measured, failures = throughput_rounds(setup.ctx, models, setup.data, steps=options.steps,
                                           rounds=options.rounds)  # fmt: skip
    for name, entry in wanted.items():
        if name in failures:
            entry.update(status="failed", reason=f"throughput: {failures[name]}")
        else:
            entry["throughput"] = measured.get(name)
    log.info("cost: throughput of %d method(s), %d interleaved round(s) of %d steps; %.1f s",
             len(wanted), options.rounds, options.steps, time.perf_counter() - t0)  # fmt: skip


def measure_cost(
    ctx: RunContext, names: Sequence[str], options: CostOptions = CostOptions()
) -> dict[str, Any]:
    """Everything `python -m harness cost` measures under `ctx` (see cost_context), as the
    record written to results/cost/<protocol>.json. Method names must be registered. The
    overhead is measured on `options.overhead_on` if given, else on the first method whose
    throughput was measured. The backbone is timed randomly initialised (random_init)."""

    protocol, k = ctx.protocol, ctx.protocol.sampler.images_per_class
    options = dataclasses.replace(options, batch_sizes=parse_batch_sizes(options.batch_sizes, k))
    sizes = list(options.batch_sizes)
    started, load_at_start = time.perf_counter(), _load_average()
    pretrained = protocol.backbone.pretrained != "none" or bool(protocol.backbone.weights_file)
    setup = _setup(ctx.replace(protocol=random_init(protocol)),
                   prepare_data(protocol, ctx.data_root), list(names), max(sizes) // k)  # fmt: skip
    entries = [_measure_method(setup, name, options) for name in names]
    _throughputs(setup, entries, options)
    record: dict[str, Any] = {
        "schema": COST_SCHEMA,
        "kind": "cost",
        "protocol": {"name": protocol.name, "version": protocol.version, "hash": protocol.hash,
                     "path": protocol.path},
        "settings": {"batch_sizes": sizes, "images_per_class": k, "repeats": options.repeats,
                     "cell_seconds": CELL_SECONDS, "slow_call_seconds": SLOW_CALL,
                     "max_call_seconds": MAX_CALL_SECONDS, "memory_share": MEMORY_SHARE,
                     "fixed_multiple": FIXED_MULTIPLE,
                     "throughput_steps": options.steps, "warmup_steps": WARMUP_STEPS,
                     "throughput_rounds": options.rounds,
                     "stage_dims": list(setup.context.stage_dims),
                     "embedding_dim": protocol.embedding_dim,
                     "synthetic_classes": setup.synthetic.num_classes, "seed": setup.ctx.seed,
                     "backbone_weights": "random (timing only)" if pretrained else "none"},
        "methods": entries,
        "consistency": consistency(entries),
        "overhead": _overhead(setup, entries, options) if options.overhead else None,
    }  # fmt: skip
    record["seconds"] = round(time.perf_counter() - started, 1)
    # the machine's 1-minute load average at the start and end: other processes' share of it
    record["load_average"] = {"start": load_at_start, "end": _load_average(),
                              "cpus": os.cpu_count()}  # fmt: skip
    # to the microsecond: a merged file tells its measurements apart by this stamp, and two
    # quick runs of the command can fall within one second
    record["created_at"] = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    record["environment"] = environment(ctx.device)
    return record


def _load_average() -> float | None:
    """The machine's 1-minute load average (None where the system does not say)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _overhead(
    setup: _Setup, entries: list[dict[str, Any]], options: CostOptions
) -> dict[str, Any] | None:
    """The harness-versus-bare-loop comparison on the chosen method (see overhead_method);
    None when no method's throughput was measured, or the asked one's was not."""
    measured = [e["method"] for e in entries if e["status"] == "ok" and e.get("throughput")]
    name = overhead_method(measured, options.overhead_on)
    if name is None or name not in measured:
        if name is not None:
            log.warning("cost: no overhead measured: %s had no throughput measured", name)
        return None
    t0 = time.perf_counter()
    result = measure_overhead(setup.ctx, setup.model(name), setup.data,
                              breakdown=options.breakdown)  # fmt: skip
    result["method"] = name
    log.info("cost: harness/bare throughput %.3f (%s, %d steps x %d rounds); %.1f s",
             result["ratio"], name, result["steps"], result["rounds"],
             time.perf_counter() - t0)  # fmt: skip
    return result
