"""The whole `python -m harness cost` measurement of a protocol, as the record written to
results/cost/<protocol>.json: per method, scaling on random inputs (with its fits) and the
throughput of the training step; then the harness's overhead on one method.

Models come from `harness.train.model`, the runner's own builder: throughput and overhead time
the very model a run trains (the same seed, so the same initial backbone for every method).
The synthetic-scaling method is built for a context with room for the largest P classes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core import METHODS, HarnessError, MethodContext, protocol_hyperparameters
from harness.cost.fit import PowerFit, fit_summary, fits
from harness.cost.overhead import measure_overhead, overhead_method
from harness.cost.records import COST_SCHEMA, log_line
from harness.cost.scaling import (
    CELL_SECONDS,
    DEFAULT_REPEATS,
    SLOW_CALL,
    measure_scaling,
    parse_batch_sizes,
)
from harness.cost.throughput import (
    DEFAULT_STEPS,
    WARMUP_STEPS,
    measure_throughput,
    random_init,
)
from harness.data import prepare_data
from harness.records import environment
from harness.train import build_method, build_model, build_seeded_backbone

if TYPE_CHECKING:
    import torch

    from harness.core import Method, MethodContext, Protocol
    from harness.data import PreparedData
    from harness.train import Model

log = logging.getLogger(__name__)


@dataclass
class _Setup:
    """What every method's measurement shares: the protocol, its data, the seed, the
    resolved hyperparameters, and the contexts the methods are built for."""

    protocol: Protocol
    prepared: PreparedData
    device: torch.device
    seed: int
    hyper: dict[str, dict[str, Any]]
    context: MethodContext  # the real one, as in `run`
    synthetic: MethodContext  # room for the largest P random classes

    def model(self, name: str) -> Model:
        """The model `run` would train for this method (same builder, same seed)."""

        data = self.prepared.data
        return build_model(
            self.protocol, name, self.hyper[name], self.seed, self.device,
            in_channels=data.images.shape[1], num_classes=self.context.num_classes,
            num_coarse_classes=self.context.num_coarse_classes,
        )  # fmt: skip

    def synthetic_method(self, name: str) -> Method:
        import torch

        torch.manual_seed(self.seed)
        return build_method(name, self.synthetic, self.hyper[name], self.device)


def _setup(
    protocol: Protocol, prepared: PreparedData, names: Sequence[str], largest_p: int,
    device: torch.device,
) -> _Setup:  # fmt: skip

    seed = protocol.seeds[0]
    data, split = prepared.data, prepared.split
    hyper = {n: protocol_hyperparameters(protocol, n) for n in names}
    num_coarse = len(data.coarse_names) if data.coarse_names else None
    backbone = build_seeded_backbone(protocol, seed, device, data.images.shape[1])
    context = MethodContext(tuple(backbone.stage_dims), protocol.embedding_dim,
                            len(np.unique(data.labels[split.train])), num_coarse)  # fmt: skip
    # random classes need room for the largest P; a classifier head then has that many rows
    synthetic = dataclasses.replace(context, num_classes=max(context.num_classes, largest_p),
                                    num_coarse_classes=num_coarse or 4)  # fmt: skip
    return _Setup(protocol, prepared, device, seed, hyper, context, synthetic)


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
            "measurements": [], "throughput": None}  # fmt: skip


def _measure_method(
    setup: _Setup, name: str, batch_sizes: list[int], repeats: int, steps: int
) -> dict[str, Any]:
    """One method's entry: scaling and fits, then throughput; a failure is recorded in the
    entry (one broken method does not stop the others)."""

    spec, protocol = METHODS.get(name), setup.protocol
    entry = _method_entry(name, spec.version, spec.family, setup.hyper[name])
    try:
        method = setup.synthetic_method(name)
        if not method.trains:
            entry.update(status="not_applicable", reason="no loss: nothing is trained")
            log.info("cost %s: not applicable (no loss)", name)
            return entry
        t0 = time.perf_counter()
        cells = measure_scaling(
            method, setup.context.stage_dims, batch_sizes, protocol.sampler.images_per_class,
            num_classes=setup.synthetic.num_classes,
            num_coarse=setup.synthetic.num_coarse_classes, device=setup.device,
            repeats=repeats, seed=setup.seed,
        )  # fmt: skip
        fitted = fits(cells)
        entry.update(fit_summary(fitted), has_miner=method.miner is not None, measurements=cells)
        if method.miner is None:
            entry["reason"] = NO_MINER.get(spec.family)
        entry["fits"] = {key: f.as_dict() for key, f in fitted.items()}
        if spec.needs_coarse_labels and not setup.prepared.data.has_coarse:
            entry["reason"] = f"{protocol.dataset.name} has no coarse labels: no throughput"
        else:
            model = setup.model(name)
            entry["throughput"] = measure_throughput(
                model.backbone, model.method, setup.prepared, protocol, setup.device,
                steps=steps, seed=setup.seed,
            )  # fmt: skip
        log.info("cost %s: %s; %.1f s", name, log_line(entry), time.perf_counter() - t0)
    except (KeyboardInterrupt, HarnessError):
        raise
    except Exception as exc:  # one broken method does not stop the others
        entry.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        log.warning("cost %s failed: %s", name, entry["reason"])
    return entry


def measure_cost(
    protocol: Protocol,
    names: Sequence[str],
    batch_sizes: Sequence[int],
    *,
    device: torch.device,
    repeats: int = DEFAULT_REPEATS,
    steps: int = DEFAULT_STEPS,
    data_root: str | None = None,
    overhead: bool = True,
    breakdown: bool = False,
    overhead_on: str | None = None,
) -> dict[str, Any]:
    """Everything `python -m harness cost` measures, as the record written to
    results/cost/<protocol>.json. Method names must be registered. The overhead is measured
    on `overhead_on` if given, else on the first method whose throughput was measured."""

    sizes = parse_batch_sizes(batch_sizes, protocol.sampler.images_per_class)
    k = protocol.sampler.images_per_class
    started = time.perf_counter()
    timed = random_init(protocol)
    pretrained = protocol.backbone.pretrained != "none" or bool(protocol.backbone.weights_file)
    setup = _setup(timed, prepare_data(protocol, data_root), list(names), max(sizes) // k,
                   device)  # fmt: skip
    entries = [_measure_method(setup, name, sizes, repeats, steps) for name in names]
    record: dict[str, Any] = {
        "schema": COST_SCHEMA,
        "kind": "cost",
        "protocol": {"name": protocol.name, "version": protocol.version, "hash": protocol.hash,
                     "path": protocol.path},
        "settings": {"batch_sizes": sizes, "images_per_class": k, "repeats": repeats,
                     "cell_seconds": CELL_SECONDS, "slow_call_seconds": SLOW_CALL,
                     "throughput_steps": steps, "warmup_steps": WARMUP_STEPS,
                     "stage_dims": list(setup.context.stage_dims),
                     "embedding_dim": protocol.embedding_dim,
                     "synthetic_classes": setup.synthetic.num_classes, "seed": setup.seed,
                     "backbone_weights": "random (timing only)" if pretrained else "none"},
        "methods": entries,
        "overhead": _overhead(setup, entries, breakdown, overhead_on) if overhead else None,
    }  # fmt: skip
    record["seconds"] = round(time.perf_counter() - started, 1)
    record["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["environment"] = environment(device)
    return record


def _overhead(
    setup: _Setup, entries: list[dict[str, Any]], breakdown: bool, asked: str | None
) -> dict[str, Any] | None:
    """The harness-versus-bare-loop comparison on the chosen method (see overhead_method);
    None when no method's throughput was measured, or the asked one's was not."""
    measured = [e["method"] for e in entries if e["status"] == "ok" and e.get("throughput")]
    name = overhead_method(measured, asked)
    if name is None or name not in measured:
        if name is not None:
            log.warning("cost: no overhead measured: %s had no throughput measured", name)
        return None
    t0 = time.perf_counter()
    model = setup.model(name)
    result = measure_overhead(model.backbone, model.method, setup.prepared, setup.protocol,
                              setup.device, seed=setup.seed, breakdown=breakdown)  # fmt: skip
    result["method"] = name
    log.info("cost: harness/bare throughput %.3f (%s, %d steps x %d rounds); %.1f s",
             result["ratio"], name, result["steps"], result["rounds"],
             time.perf_counter() - t0)  # fmt: skip
    return result
