"""What a method costs: how its mining and loss grow with the batch size m, the training
throughput it allows, and what the harness's own training loop adds on top of bare PyTorch.

`python -m harness cost` measures, for each method and each batch size m = P x K (K fixed by
the protocol's sampler, so m must be a multiple of K):

- scaling, on random inputs: random stage features [m, dim] (the protocol backbone's
  stage_dims) go through the method's head once; its outputs are detached into leaves, so
  the loss time is the loss alone. Labels: P random training classes x K images; coarse
  labels: the P classes dealt round-robin into a few superclasses (about 4 fine classes each).
  Timed separately: the miner (under no_grad) and the loss forward + backward (down to the
  embedding and the loss's own parameters), CUDA-synchronised, median over the repeats.
  Counted: `mined.evaluated` (pair distances or scores computed) and `mined.count()`
  (tuples). No miner: mining time 0 and counts 0. No loss (untrained): not applicable.
- the growth exponent b of cost ~ a * m^b (see `fit_power_law` for the fit and the rule
  that names a complexity class, or says "unclear" when the fit does not support one);
- throughput on the protocol's real data: images per second of the whole training step
  (backbone forward/backward, mining, loss, optimizer step) under the identical backbone for
  every method, and the share of the step spent in mining + loss;
- harness overhead: `harness.train.train` against a hand-written loop doing the same steps on
  the same model and batches, alternated, as a throughput ratio (target >= 0.95).

Repeats adapt so that `--all` stays within minutes on a CPU: each (method, m) cell first makes
one untimed warm-up call unless that call already took SLOW_CALL seconds (its one-time costs
are then negligible and it is kept as the first repeat), then repeats until it has `repeats`
timings or has spent CELL_SECONDS (at least one timing); a call longer than MAX_CALL_SECONDS,
or running out of memory, skips the larger batch sizes. Each cell records its repeats.

Results go to results/cost/<protocol>.json (atomic, with provenance) and the figure to
results/figures/cost_<protocol>.png; `cost_section` renders the markdown for the leaderboard.
torch is imported inside the functions that need it, so building the CLI parser stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.argtypes import positive_int
from harness.errors import HarnessError
from harness.fingerprint import describe

if TYPE_CHECKING:
    import torch

    from harness.method import Embedded, Method
    from harness.protocol import Protocol
    from harness.runner import PreparedData

log = logging.getLogger(__name__)

COST_SCHEMA = 1
DEFAULT_BATCH_SIZES = (32, 64, 128, 256, 512, 1024)
DEFAULT_REPEATS = 5
DEFAULT_STEPS = 24  # measured training steps per method, after WARMUP_STEPS
WARMUP_STEPS = 4
CELL_SECONDS = 2.0  # a (method, m) cell stops repeating once it has spent this long
SLOW_CALL = 1.0  # a call this long needs no warm-up: it is kept as the first repeat
MAX_CALL_SECONDS = 60.0  # one call slower than this: the larger batch sizes are skipped
OVERHEAD_ROUNDS = 7
OVERHEAD_MAX_STEPS = 100
OVERHEAD_TARGET = 0.95
TIME_FIT_SIZES = 4  # times are fitted on the largest sizes (small m: fixed per-call overheads)

# Complexity classes and the rule that names one (see fit_power_law).
R2_MIN = 0.98
RMS_MAX = 0.05
TOLERANCE = 0.15
MARGIN = 0.05
COMPLEXITIES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "O(1)": lambda m: np.ones_like(m),
    "O(m)": lambda m: m,
    "O(m log m)": lambda m: m * np.log2(m),
    "O(m^2)": lambda m: m**2,
    "O(m^3)": lambda m: m**3,  # e.g. enumerating every (anchor, positive, negative) of a batch
}


# ---------------------------------------------------------------------------------------------
# Fitting the growth exponent


@dataclass(frozen=True)
class PowerFit:
    """cost ~ coefficient * m^exponent, fitted by least squares on log-log."""

    exponent: float | None
    coefficient: float | None
    r2: float | None
    rms: float | None  # root mean square of the log residuals (natural log)
    sizes: list[int]
    complexity: str

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None, n: int) -> float | None:
            return None if v is None else round(v, n)

        return {
            "exponent": r(self.exponent, 4),
            "coefficient": None if self.coefficient is None else float(f"{self.coefficient:.6g}"),
            "r2": r(self.r2, 5),
            "rms_log_residual": r(self.rms, 5),
            "sizes": self.sizes,
            "complexity": self.complexity,
        }


def _slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    b, a = np.polyfit(x, y, 1)
    return float(b), float(a)


def fit_power_law(sizes: Sequence[int], values: Sequence[float | None]) -> PowerFit:
    """Fit b in cost ~ a * m^b by least squares on (log m, log cost) and name the class.

    Rule: with at least 3 batch sizes and the fit supporting a power law (R^2 >= 0.98, or,
    for flat data where R^2 says nothing, an RMS log residual <= 0.05, i.e. within about 5%),
    each candidate f in O(1), O(m), O(m log m), O(m^2), O(m^3) gets the exponent left over after
    dividing it out, b_f = slope of log(cost / f(m)). The class with the smallest |b_f| is
    named when |b_f| <= 0.15 and every other candidate's |b_g| is at least 0.05 larger;
    otherwise "unclear". On m = 32..1024, m log m fits b ~ 1.2: dividing by m leaves 0.2 and
    by m log m leaves 0, so it is told apart from m, while m^1.1 (0.1 from both) or m^1.5
    stays "unclear". All-zero values (no miner, nothing counted): "none". A zero among
    positive values cannot be fitted on log axes: "unclear".
    """
    pairs = [(int(m), float(v)) for m, v in zip(sizes, values, strict=True) if v is not None]
    used = [m for m, _ in pairs]
    if not pairs or all(v == 0 for _, v in pairs):
        return PowerFit(None, None, None, None, used, "none")
    if any(v <= 0 for _, v in pairs):
        return PowerFit(None, None, None, None, used, "unclear (zero at some m)")
    m = np.array([p[0] for p in pairs], dtype=float)
    v = np.array([p[1] for p in pairs], dtype=float)
    if len(np.unique(m)) < 2:
        return PowerFit(None, None, None, None, used, "unclear (one batch size)")
    x, y = np.log(m), np.log(v)
    b, a = _slope(x, y)
    residual = y - (a + b * x)
    ss_res = float(np.sum(residual**2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 1e-12 else 1.0
    rms = math.sqrt(ss_res / len(y))
    if len(np.unique(m)) < 3:
        complexity = "unclear (fewer than 3 batch sizes)"
    elif not (r2 >= R2_MIN or rms <= RMS_MAX):
        complexity = "unclear (not a power law)"
    else:
        left = sorted(
            (abs(_slope(x, y - np.log(f(m)))[0]), name) for name, f in COMPLEXITIES.items()
        )
        (best, name), (second, _) = left[0], left[1]
        complexity = name if best <= TOLERANCE and second - best >= MARGIN else "unclear"
    return PowerFit(b, math.exp(a), r2, rms, used, complexity)


def parse_batch_sizes(text: str | Sequence[int], images_per_class: int) -> list[int]:
    """Sorted distinct batch sizes, each a multiple of K holding at least 2 classes."""
    if isinstance(text, str):
        try:
            sizes = [int(s) for s in text.split(",") if s.strip()]
        except ValueError:
            raise HarnessError(
                f"--batch-sizes: expected comma-separated integers, got {text!r}"
            ) from None
    else:
        sizes = [int(s) for s in text]
    if not sizes:
        raise HarnessError("--batch-sizes: give at least one batch size, e.g. 32,64,128")
    k = images_per_class
    for m in sizes:
        if m <= 0 or m % k:
            raise HarnessError(
                f"--batch-sizes: {m} is not a multiple of the protocol's images_per_class "
                f"K={k} (batches are P classes x K images); use e.g. {k * 8},{k * 16},{k * 32}"
            )
        if m // k < 2:
            raise HarnessError(
                f"--batch-sizes: {m} = {m // k} class x K={k}; a batch needs at least 2 "
                f"classes, so use at least {2 * k}"
            )
    return sorted(set(sizes))


# ---------------------------------------------------------------------------------------------
# Measuring


class _Clock:
    """Wall time; on CUDA `now` synchronises, and `mark` records events so that timing the
    phases of a training step does not stall the GPU pipeline."""

    def __init__(self, device: torch.device) -> None:
        import torch

        self.torch, self.device = torch, device
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self) -> Any:
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Between two marks; on CUDA only after a synchronisation (`now`)."""
        return start.elapsed_time(end) / 1000.0 if self.cuda else end - start


def _leaves(
    out: Embedded, every_float: bool
) -> tuple[Embedded, list[torch.Tensor], list[torch.Tensor]]:
    """The head's outputs detached into leaves that require grad, so the loss's backward
    stops there. `every_float`: every float tensor (outputs made under no_grad), else only
    those that carry a gradient. Returns (leaf Embedded, the originals, their leaves)."""
    from harness.method import Embedded

    originals: list[torch.Tensor] = []
    leaves: list[torch.Tensor] = []

    def leaf(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point() or not (every_float or t.requires_grad):
            return t
        new = t.detach().requires_grad_(True)
        originals.append(t)
        leaves.append(new)
        return new

    embedded = Embedded(leaf(out.embedding), {k: leaf(v) for k, v in out.extras.items()})
    return embedded, originals, leaves


def _synthetic_batch(
    m: int, k: int, num_classes: int, num_coarse: int, generator: torch.Generator,
    device: torch.device,
) -> Any:  # fmt: skip
    """P = m / K distinct random classes x K images; coarse: the P classes dealt round-robin
    into about P / 4 superclasses (at least 2, at most num_coarse)."""
    import torch

    from harness.method import Batch

    p = m // k
    classes = torch.randperm(num_classes, generator=generator)[:p]
    supers = max(2, min(num_coarse, p // 4))
    coarse = torch.arange(p) % supers
    return Batch(classes.repeat_interleave(k).to(device), coarse.repeat_interleave(k).to(device))


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def measure_scaling(
    method: Method,
    stage_dims: Sequence[int],
    batch_sizes: Sequence[int],
    images_per_class: int,
    *,
    num_classes: int,
    num_coarse: int,
    device: torch.device,
    repeats: int = DEFAULT_REPEATS,
    seed: int = 0,
    cell_seconds: float = CELL_SECONDS,
) -> list[dict[str, Any]]:
    """Per batch size: median mining and loss (forward + backward) milliseconds, pairs
    evaluated and tuples mined, on random inputs (see the module docstring). `num_classes`
    must be at least the largest P. Cells that could not run carry a `skipped` reason."""
    import torch

    if method.loss is None:
        raise ValueError("a method without a loss has no training cost to measure")
    clock = _Clock(device)
    generator = torch.Generator().manual_seed(seed)
    loss_params = list(method.loss.parameters())

    def call(out0: Embedded, batch: Any) -> tuple[float, float, int, int]:
        out, _, _ = _leaves(out0, every_float=True)
        mined, mining = None, 0.0
        if method.miner is not None:
            start = clock.now()
            with torch.no_grad():
                mined = method.miner(out, batch)
            mining = clock.now() - start
        start = clock.now()
        loss = method.loss(out, batch, mined)
        if loss.requires_grad:
            loss.backward()
        seconds = clock.now() - start
        for p in loss_params:
            p.grad = None
        if mined is None:
            return mining, seconds, 0, 0
        return mining, seconds, int(mined.evaluated), int(mined.count())

    cells: list[dict[str, Any]] = []
    skip: str | None = None
    warm = False
    for m in batch_sizes:
        cell: dict[str, Any] = {"batch_size": m, "classes": m // images_per_class}
        if skip is not None:
            cells.append({**cell, "skipped": skip})
            continue
        try:
            batch = _synthetic_batch(
                m, images_per_class, num_classes, num_coarse, generator, device
            )
            features = [torch.rand(m, d, generator=generator).to(device) for d in stage_dims]
            with torch.no_grad():
                out0 = method.head(features)
            if not warm:  # once per method: lazy initialisation, first kernels
                call(out0, batch)
                warm = True
            spent = time.perf_counter()
            first = call(out0, batch)
            timings = [first[:2]] if first[0] + first[1] >= SLOW_CALL else []
            evaluated, tuples = first[2], first[3]
            while len(timings) < repeats and (
                not timings or time.perf_counter() - spent < cell_seconds
            ):
                timings.append(call(out0, batch)[:2])
        except (RuntimeError, MemoryError) as exc:
            if not _is_out_of_memory(exc) and not isinstance(exc, MemoryError):
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
            skip = f"out of memory at m={m}"
            cells.append({**cell, "skipped": skip})
            continue
        mining = statistics.median(t[0] for t in timings)
        loss = statistics.median(t[1] for t in timings)
        cells.append(
            {**cell, "mining_ms": round(mining * 1e3, 4), "loss_ms": round(loss * 1e3, 4),
             "evaluated": evaluated, "tuples": tuples, "repeats": len(timings)}
        )  # fmt: skip
        if max(mining + loss, first[0] + first[1]) > MAX_CALL_SECONDS:
            skip = f"skipped: one call at m={m} took over {MAX_CALL_SECONDS:.0f} s"
    return cells


def fits(cells: list[dict[str, Any]]) -> dict[str, PowerFit]:
    """Exponents of the counts (all measured sizes: they are exact) and of the times (the
    largest TIME_FIT_SIZES measured sizes: at small m fixed per-call costs bend the line)."""
    done = [c for c in cells if "skipped" not in c]
    sizes = [c["batch_size"] for c in done]
    timed = done[-TIME_FIT_SIZES:] if len(done) > TIME_FIT_SIZES else done
    tsizes = [c["batch_size"] for c in timed]
    return {
        "evaluated": fit_power_law(sizes, [c["evaluated"] for c in done]),
        "tuples": fit_power_law(sizes, [c["tuples"] for c in done]),
        "mining_time": fit_power_law(tsizes, [c["mining_ms"] for c in timed]),
        "loss_time": fit_power_law(tsizes, [c["loss_ms"] for c in timed]),
    }


def _modules(backbone: torch.nn.Module, method: Method) -> torch.nn.ModuleList:
    from torch import nn

    return nn.ModuleList([m for m in (backbone, method.head, method.loss) if m is not None])


def measure_throughput(
    backbone: torch.nn.Module,
    method: Method,
    prepared: PreparedData,
    protocol: Protocol,
    device: torch.device,
    *,
    steps: int = DEFAULT_STEPS,
    warmup: int = WARMUP_STEPS,
    seed: int = 0,
) -> dict[str, Any]:
    """Whole training steps on the protocol's training images (P x K batches from its
    sampler): images per second over `steps` steps after `warmup`, and the share of those
    steps spent in mining + loss (forward and its backward down to the embedding; the
    backward is split at the embedding, which computes the same gradients). The caller gives
    every method the same initial backbone. On CUDA the phases are timed with events."""
    import torch

    from harness.method import Batch
    from harness.runner import contiguous
    from harness.sampler import PKSampler
    from harness.train import make_optimizer

    data, split = prepared.data, prepared.split
    images = data.images[split.train]
    labels = contiguous(data.labels[split.train])
    coarse = None if data.coarse_labels is None else data.coarse_labels[split.train]
    labels_t = torch.as_tensor(labels, device=device)
    coarse_t = None if coarse is None else torch.as_tensor(coarse, device=device)
    sampler = PKSampler(
        labels, protocol.sampler.classes_per_batch, protocol.sampler.images_per_class, seed
    )
    modules = _modules(backbone, method)
    optimizer = make_optimizer([p for p in modules.parameters() if p.requires_grad], protocol)
    modules.train()
    clock = _Clock(device)
    phases: list[tuple[Any, Any]] = []  # (start, end) marks of mining + loss
    count = {"images": 0, "empty": 0}

    def step(record: bool) -> None:
        idx = torch.from_numpy(sampler.next_batch())
        x = backbone.prepare(images[idx].to(device, non_blocking=True))
        idx_dev = idx.to(device)
        batch = Batch(labels_t[idx_dev], None if coarse_t is None else coarse_t[idx_dev])
        out, originals, leaves = _leaves(method.head(backbone(x)), every_float=False)
        start = clock.mark()
        mined = None
        if method.miner is not None:
            with torch.no_grad():
                mined = method.miner(out, batch)
        loss = method.loss(out, batch, mined)
        optimizer.zero_grad(set_to_none=True)
        if loss.requires_grad and (mined is None or mined.count() > 0):
            loss.backward()
            end = clock.mark()
            grads = [
                (o, g.grad) for o, g in zip(originals, leaves, strict=True) if g.grad is not None
            ]
            if grads:
                torch.autograd.backward([o for o, _ in grads], [g for _, g in grads])
            optimizer.step()
        else:
            end = clock.mark()
            if record:
                count["empty"] += 1
        if record:
            phases.append((start, end))
            count["images"] += len(idx)

    for _ in range(warmup):
        step(False)
    begin = clock.now()
    for _ in range(steps):
        step(True)
    seconds = clock.now() - begin
    mining_loss = sum(clock.seconds(a, b) for a, b in phases)
    return {
        "steps": steps,
        "batch_size": protocol.sampler.batch_size,
        "images_per_second": round(count["images"] / seconds, 2),
        "step_ms": round(seconds / steps * 1e3, 3),
        "mining_loss_ms": round(mining_loss / steps * 1e3, 3),
        "mining_loss_share": round(mining_loss / seconds, 4),
        "empty_steps": count["empty"],
    }


# ---------------------------------------------------------------------------------------------
# Harness overhead


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Progress bars to /dev/null and the training log off while the harness loop is timed
    (the bar is still drawn: its cost is measured; one log line per epoch is not)."""
    train_log = logging.getLogger("harness.train")
    level = train_log.level
    train_log.setLevel(logging.WARNING)
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        try:
            yield
        finally:
            train_log.setLevel(level)


def _bare_loop(
    backbone: torch.nn.Module,
    method: Method,
    images: torch.Tensor,
    labels_t: torch.Tensor,
    coarse_t: torch.Tensor | None,
    batches: list[torch.Tensor],
    protocol: Protocol,
    device: torch.device,
    extras: frozenset[str] = frozenset(),
    checkpoint: Path | None = None,
    per_epoch: int = 0,
) -> None:
    """The training step written out by hand, nothing else. `extras` adds the harness's
    bookkeeping one piece at a time, to find what costs: "item" (the loss read back every
    step), "check" (the miner's index check and counts), "timers" (PhaseTimer around mining
    and loss), "progress" (a tqdm bar updated every step), "lr" (the schedule set every
    step), "checkpoint" (the state saved at each epoch end)."""
    import torch
    from tqdm import tqdm

    from harness.method import Batch
    from harness.timing import PhaseTimer
    from harness.train import make_optimizer, save_checkpoint

    modules = _modules(backbone, method)
    optimizer = make_optimizer([p for p in modules.parameters() if p.requires_grad], protocol)
    modules.train()
    timer = PhaseTimer(device)
    phase = timer.phase if "timers" in extras else (lambda name: contextlib.nullcontext())
    bar = tqdm(total=len(batches), disable="progress" not in extras, leave=False)
    for step, idx in enumerate(batches):
        if "lr" in extras:
            for group in optimizer.param_groups:
                group["lr"] = protocol.optimizer.lr
        x = backbone.prepare(images[idx].to(device, non_blocking=True))
        idx_dev = idx.to(device)
        batch = Batch(labels_t[idx_dev], None if coarse_t is None else coarse_t[idx_dev])
        out = method.head(backbone(x))
        mined = None
        if method.miner is not None:
            with phase("mining"), torch.no_grad():
                mined = method.miner(out, batch)
            if "check" in extras:
                mined.check(len(idx))
                _ = mined.count(), mined.evaluated
        with phase("loss"):
            loss = method.loss(out, batch, mined)
        if "item" in extras:
            value = float(loss.detach())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if "progress" in extras:
            bar.update(1)
            bar.set_postfix(loss=f"{value if 'item' in extras else 0.0:.4f}", refresh=False)
        if checkpoint is not None and per_epoch and (step + 1) % per_epoch == 0:
            save_checkpoint(checkpoint, {"modules": modules.state_dict(),
                                         "optimizer": optimizer.state_dict()})  # fmt: skip
    bar.close()


OVERHEAD_PIECES = ("item", "check", "timers", "progress", "lr", "checkpoint")


def measure_overhead(
    backbone: torch.nn.Module,
    method: Method,
    prepared: PreparedData,
    protocol: Protocol,
    device: torch.device,
    *,
    rounds: int = OVERHEAD_ROUNDS,
    seed: int = 0,
    breakdown: bool = False,
) -> dict[str, Any]:
    """Throughput of `harness.train.train` against `_bare_loop` on the same model (a fresh
    copy of the same initial state each time), the same batches (the sampler's sequence for
    this seed, images already in memory) and the same method. The window is one epoch plus
    a step (so the harness saves its epoch-end checkpoint, as in a real run), at most
    OVERHEAD_MAX_STEPS. Rounds alternate which loop goes first; the ratio is the median over
    rounds of harness / bare images per second. With `breakdown`, each piece of bookkeeping
    (OVERHEAD_PIECES) is added alone to the bare loop and timed against it the same way."""
    import torch

    from harness.runner import contiguous
    from harness.sampler import PKSampler
    from harness.train import train

    data, split = prepared.data, prepared.split
    images = data.images[split.train]
    labels = contiguous(data.labels[split.train])
    coarse = None if data.coarse_labels is None else data.coarse_labels[split.train]
    p, k = protocol.sampler.classes_per_batch, protocol.sampler.images_per_class
    sampler = PKSampler(labels, p, k, seed)
    per_epoch = sampler.batches_per_epoch
    budget = protocol.budget.steps or protocol.budget.epochs * per_epoch
    steps = min(per_epoch + 1, OVERHEAD_MAX_STEPS, budget)
    batches = [torch.from_numpy(sampler.next_batch()) for _ in range(steps)]
    labels_t = torch.as_tensor(labels, device=device)
    coarse_t = None if coarse is None else torch.as_tensor(coarse, device=device)
    clock = _Clock(device)

    with tempfile.TemporaryDirectory(prefix="dml-cost-") as tmp:
        ckpt = Path(tmp) / "overhead.pt"

        def bare(extras: frozenset[str] = frozenset()) -> float:
            bb, mt = copy.deepcopy(backbone), copy.deepcopy(method)
            start = clock.now()
            _bare_loop(bb, mt, images, labels_t, coarse_t, batches, protocol, device, extras,
                       ckpt if "checkpoint" in extras else None, per_epoch)  # fmt: skip
            seconds = clock.now() - start
            ckpt.unlink(missing_ok=True)
            return seconds

        def harness() -> float:
            bb, mt = copy.deepcopy(backbone), copy.deepcopy(method)
            start = clock.now()
            with _quiet():
                train(bb, mt, images, labels, coarse, protocol, seed, device, max_steps=steps,
                      progress=True, checkpoint=ckpt, identity="cost-overhead")  # fmt: skip
            seconds = clock.now() - start
            ckpt.unlink(missing_ok=True)  # else the next round would resume from it
            return seconds

        def alternate(a: Callable[[], float], b: Callable[[], float]) -> dict[str, Any]:
            ta, tb = [], []
            for r in range(rounds):
                if r % 2 == 0:
                    ta.append(a())
                    tb.append(b())
                else:
                    tb.append(b())
                    ta.append(a())
            images_per_run = steps * p * k
            # The fastest round of each loop is the one least disturbed by the rest of the
            # machine (timeit's rule); the median of the per-round ratios is kept to show the
            # spread that other processes cause.
            return {
                "ratio": round(min(ta) / min(tb), 4),
                "median_round_ratio": round(
                    statistics.median(x / y for x, y in zip(ta, tb, strict=True)), 4
                ),
                "images_per_second": round(images_per_run / min(tb), 2),
                "reference_images_per_second": round(images_per_run / min(ta), 2),
            }

        with _quiet():  # warm-up
            _bare_loop(copy.deepcopy(backbone), copy.deepcopy(method), images, labels_t,
                       coarse_t, batches[:3], protocol, device)  # fmt: skip
        main = alternate(bare, harness)
        result: dict[str, Any] = {
            "method": "",
            "steps": steps,
            "rounds": rounds,
            "steps_per_epoch": per_epoch,
            "checkpoint_in_window": steps > per_epoch,
            "harness_images_per_second": main["images_per_second"],
            "bare_images_per_second": main["reference_images_per_second"],
            "ratio": main["ratio"],
            "median_round_ratio": main["median_round_ratio"],
            "target": OVERHEAD_TARGET,
        }
        if breakdown:
            pieces = {}
            for piece in OVERHEAD_PIECES:
                with _quiet():
                    res = alternate(bare, lambda piece=piece: bare(frozenset({piece})))
                pieces[piece] = res["ratio"]
            with _quiet():
                pieces["all"] = alternate(bare, lambda: bare(frozenset(OVERHEAD_PIECES)))["ratio"]
            result["breakdown"] = pieces
    return result


# ---------------------------------------------------------------------------------------------
# The whole measurement


def _method_entry(name: str, spec: Any, hyper: dict[str, Any]) -> dict[str, Any]:
    """Every key present from the start, so not-applicable and failed methods keep the
    schema (None: nothing measured)."""
    empty = _summary(dict.fromkeys(("evaluated", "tuples", "mining_time", "loss_time"),
                                   PowerFit(None, None, None, None, [], "none")))  # fmt: skip
    return {"method": name, "version": spec.version, "hyperparameters": hyper,
            "status": "ok", "reason": None, **empty, "has_miner": None, "fits": None,
            "measurements": [], "throughput": None}  # fmt: skip


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
) -> dict[str, Any]:
    """Everything `python -m harness cost` measures, as the record written to
    results/cost/<protocol>.json. Method names must be registered (`import methods`)."""
    import torch

    from harness.backbones import build_backbone
    from harness.method import METHODS, MethodContext
    from harness.results import environment
    from harness.runner import prepare_data

    batch_sizes = parse_batch_sizes(batch_sizes, protocol.sampler.images_per_class)
    specs = {name: METHODS.get(name) for name in names}
    seed = protocol.seeds[0]
    started = time.perf_counter()
    prepared = prepare_data(protocol, data_root)
    data, split = prepared.data, prepared.split
    torch.manual_seed(seed)  # the same initial backbone for every method, as in `run`
    initial = build_backbone(protocol.backbone, data.images.shape[1]).to(device)
    stage_dims = tuple(initial.stage_dims)
    train_classes = len(np.unique(data.labels[split.train]))
    num_coarse = len(data.coarse_names) if data.coarse_names else None
    k = protocol.sampler.images_per_class
    largest_p = max(batch_sizes) // k
    # random classes need room for the largest P; a classifier head then has that many rows
    synthetic_ctx = MethodContext(stage_dims, protocol.embedding_dim,
                                  max(train_classes, largest_p), num_coarse or 4)  # fmt: skip
    real_ctx = MethodContext(stage_dims, protocol.embedding_dim, train_classes, num_coarse)

    hyper = {n: s.hyperparameters(protocol.method_overrides(n)) for n, s in specs.items()}

    def build(name: str, ctx: MethodContext) -> Method:
        torch.manual_seed(seed)
        method = specs[name].build(ctx, **hyper[name])
        method.head.to(device)
        if method.loss is not None:
            method.loss.to(device)
        return method

    entries = []
    for name, spec in specs.items():
        entry = _method_entry(name, spec, hyper[name])
        entries.append(entry)
        try:
            method = build(name, synthetic_ctx)
            if not method.trains:
                entry.update(status="not_applicable", reason="no loss: nothing is trained")
                log.info("cost %s: not applicable (no loss)", name)
                continue
            t0 = time.perf_counter()
            cells = measure_scaling(
                method, stage_dims, batch_sizes, k, num_classes=synthetic_ctx.num_classes,
                num_coarse=synthetic_ctx.num_coarse_classes or 4, device=device,
                repeats=repeats, seed=seed,
            )  # fmt: skip
            fitted = fits(cells)
            entry.update(_summary(fitted), has_miner=method.miner is not None, measurements=cells)
            entry["fits"] = {key: f.as_dict() for key, f in fitted.items()}
            if spec.needs_coarse_labels and not data.has_coarse:
                entry["throughput"] = None
                entry["reason"] = f"{protocol.dataset.name} has no coarse labels: no throughput"
            else:
                entry["throughput"] = measure_throughput(
                    copy.deepcopy(initial), build(name, real_ctx), prepared, protocol, device,
                    steps=steps, seed=seed,
                )  # fmt: skip
            log.info("cost %s: %s; %.1f s", name, _log_line(entry), time.perf_counter() - t0)
        except (KeyboardInterrupt, HarnessError):
            raise
        except Exception as exc:  # one broken method does not stop the others
            entry.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
            log.warning("cost %s failed: %s", name, entry["reason"])
    record: dict[str, Any] = {
        "schema": COST_SCHEMA,
        "kind": "cost",
        "protocol": {"name": protocol.name, "version": protocol.version, "hash": protocol.hash,
                     "path": protocol.path},
        "settings": {"batch_sizes": batch_sizes, "images_per_class": k, "repeats": repeats,
                     "cell_seconds": CELL_SECONDS, "slow_call_seconds": SLOW_CALL,
                     "throughput_steps": steps, "warmup_steps": WARMUP_STEPS,
                     "stage_dims": list(stage_dims), "embedding_dim": protocol.embedding_dim,
                     "synthetic_classes": synthetic_ctx.num_classes, "seed": seed},
        "methods": entries,
        "overhead": None,
    }  # fmt: skip
    if overhead:
        record["overhead"] = _overhead(entries, initial, build, real_ctx, prepared, protocol,
                                       device, seed, breakdown)  # fmt: skip
    record["seconds"] = round(time.perf_counter() - started, 1)
    record["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["environment"] = environment(device)
    return record


def _overhead(
    entries: list[dict[str, Any]], initial: Any, build: Callable[..., Method], ctx: Any,
    prepared: PreparedData, protocol: Protocol, device: torch.device, seed: int,
    breakdown: bool,
) -> dict[str, Any] | None:  # fmt: skip
    """On contrastive when it was measured, else on the first method that trained."""
    ok = [e["method"] for e in entries if e["status"] == "ok" and e.get("throughput")]
    if not ok:
        return None
    name = "contrastive" if "contrastive" in ok else ok[0]
    t0 = time.perf_counter()
    result = measure_overhead(copy.deepcopy(initial), build(name, ctx), prepared, protocol,
                              device, seed=seed, breakdown=breakdown)  # fmt: skip
    result["method"] = name
    log.info("cost: harness/bare throughput %.3f (%s, %d steps x %d rounds); %.1f s",
             result["ratio"], name, result["steps"], result["rounds"],
             time.perf_counter() - t0)  # fmt: skip
    return result


def _summary(fitted: dict[str, PowerFit]) -> dict[str, Any]:
    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 4)

    ev, tm, lt, tu = (fitted[k] for k in ("evaluated", "mining_time", "loss_time", "tuples"))
    return {
        "count_exponent": r(ev.exponent), "count_r2": r(ev.r2), "count_complexity": ev.complexity,
        "tuple_exponent": r(tu.exponent), "tuple_complexity": tu.complexity,
        "time_exponent": r(tm.exponent), "time_r2": r(tm.r2), "time_complexity": tm.complexity,
        "loss_time_exponent": r(lt.exponent), "loss_time_r2": r(lt.r2),
        "loss_time_complexity": lt.complexity,
    }  # fmt: skip


def _log_line(entry: dict[str, Any]) -> str:
    done = [c for c in entry["measurements"] if "skipped" not in c]
    last = done[-1] if done else {}
    tp = entry.get("throughput") or {}
    return (
        f"counts ~ m^{_num(entry['count_exponent'], 2)}, mining ~ m^"
        f"{_num(entry['time_exponent'], 2)}, m={last.get('batch_size')}: mining "
        f"{_num(last.get('mining_ms'), 1)} ms, loss {_num(last.get('loss_ms'), 1)} ms; "
        f"{_num(tp.get('images_per_second'), 0)} img/s"
    )


def _num(v: Any, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


# ---------------------------------------------------------------------------------------------
# Files and tables


def cost_path(results_dir: Path, protocol: str) -> Path:
    return Path(results_dir) / "cost" / f"{protocol}.json"


def figure_path(results_dir: Path, protocol: str) -> Path:
    return Path(results_dir) / "figures" / f"cost_{protocol}.png"


def write_cost(record: dict[str, Any], results_dir: Path) -> Path:
    from harness.results import write_json_atomic

    path = cost_path(results_dir, record["protocol"]["name"])
    write_json_atomic(path, record)
    return path


def read_cost(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HarnessError(f"unreadable cost file {path}: {exc}; delete it or rerun "
                           "`python -m harness cost`") from None  # fmt: skip
    if (
        not isinstance(data, dict)
        or data.get("kind") != "cost"
        or data.get("schema") != COST_SCHEMA
    ):
        raise HarnessError(f"{path} is not a schema-{COST_SCHEMA} cost file; delete or move it")
    return data


def _exp_cell(entry: dict[str, Any], key: str, complexity: str) -> str:
    value, name = entry.get(key), (entry.get(complexity) or "").split(" (")[0]
    if value is None:
        return "-" if name in ("", "none") else name
    return f"{value:.2f} {name}"


def cost_rows(record: dict[str, Any]) -> list[dict[str, str]]:
    sizes = record["settings"]["batch_sizes"]
    largest = max(sizes)
    ref = 64 if 64 in sizes else min(sizes)
    rows = []
    for e in record["methods"]:
        row = {"method": e["method"]}
        if e["status"] != "ok":
            row["notes"] = f"{e['status'].replace('_', ' ')} ({e['reason']})"
            rows.append(row)
            continue
        cells = {c["batch_size"]: c for c in e["measurements"]}
        tp = e.get("throughput") or {}

        def ms(m: int, key: str, digits: int = 2, cells: dict = cells, e: dict = e) -> str:
            c = cells.get(m, {})
            if "skipped" in c:
                return "skipped"
            if not e.get("has_miner", True) and key == "mining_ms":
                return "no miner"
            return _num(c.get(key), digits)

        share = tp.get("mining_loss_share")
        row.update({
            "counts ~ m^b": _exp_cell(e, "count_exponent", "count_complexity"),
            "mining time ~ m^b": _exp_cell(e, "time_exponent", "time_complexity"),
            "loss time ~ m^b": _exp_cell(e, "loss_time_exponent", "loss_time_complexity"),
            f"mining ms (m={ref})": ms(ref, "mining_ms"),
            f"mining ms (m={largest})": ms(largest, "mining_ms"),
            f"loss ms (m={largest})": ms(largest, "loss_ms", 1),
            "img/s": _num(tp.get("images_per_second"), 0),
            "mining+loss share": "-" if share is None else f"{share * 100:.0f}%",
            "notes": e.get("reason") or "",
        })  # fmt: skip
        rows.append(row)
    return rows


def cost_table(record: dict[str, Any]) -> str:
    """The per-method summary as a GitHub markdown table."""
    from tabulate import tabulate

    rows = cost_rows(record)
    headers = [k for k in dict.fromkeys(k for row in rows for k in row) if k != "notes"]
    if any(row.get("notes") for row in rows):
        headers.append("notes")
    table = [[row.get(h, "") for h in headers] for row in rows]
    return tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)


def overhead_line(record: dict[str, Any]) -> str:
    o = record.get("overhead")
    if not o:
        return "Harness overhead: not measured."
    verdict = "meets" if o["ratio"] >= o["target"] else "misses"
    text = (
        f"Harness overhead: `harness.train.train` runs at {o['ratio']:.3f} x the throughput of a "
        f"bare PyTorch loop on the same model and batches ({o['harness_images_per_second']:.0f} "
        f"vs {o['bare_images_per_second']:.0f} img/s, {o['method']}, {o['steps']} steps x "
        f"{o['rounds']} alternated rounds, fastest round of each; {verdict} the target "
        f"{o['target']:.2f})."
    )
    if o.get("median_round_ratio") is not None:
        text += f" Median of the per-round ratios: {o['median_round_ratio']:.3f}."
    if o["steps"] < 20:
        text += (
            f" Only {o['steps']} steps (the protocol's budget): the harness's fixed setup per "
            "run (optimizer, sampler, progress bar; a few ms) weighs in, so this ratio says "
            "little about a long run."
        )
    if o.get("breakdown"):
        parts = ", ".join(f"{k} {v:.3f}" for k, v in o["breakdown"].items())
        text += f" Bare loop plus one piece, throughput ratio: {parts}."
    return text


def cost_section(results_dir: Path) -> str:
    """Markdown for the leaderboard: one "Cost" table per results/cost/<protocol>.json, with
    the harness-overhead line and a link to the figure (relative to results_dir, where
    LEADERBOARD.md lives). Empty string when nothing was measured."""
    results_dir = Path(results_dir)
    paths = sorted((results_dir / "cost").glob("*.json"))
    if not paths:
        return ""
    lines = []
    for path in paths:
        record = read_cost(path)
        p, s = record["protocol"], record["settings"]
        env = record.get("environment", {})
        hw = env.get("hardware", {})
        lines += [
            "",
            f"## Cost: {p['name']} (protocol v{p['version']}, hash `{p['hash']}`)",
            "",
            f"Generated by `python -m harness cost --protocol {p['name']}`. Scaling on random "
            f"inputs, m = P x {s['images_per_class']} for m in "
            f"{', '.join(map(str, s['batch_sizes']))}: the miner's pair scores evaluated "
            "(counts) and the median mining and loss (forward + backward) times, with the "
            "least-squares exponent b of cost ~ a m^b on log-log axes and the complexity "
            'class it supports ("unclear" when the fit does not support one; times are '
            "fitted on the largest sizes). img/s and the share of the step in mining + loss: "
            "whole training steps (backbone, mining, loss, optimizer) on the protocol's data "
            "and P x K batches, the same initial backbone for every method.",
            "",
            cost_table(record),
            "",
            overhead_line(record),
            f"Measured {str(record.get('created_at', '?'))[:10]} on {hw.get('device', '?')} "
            f"({hw.get('cpu_count', '?')} CPUs, {hw.get('torch_threads', '?')} torch threads), "
            f"commit {str(env.get('git_commit', '?'))[:10]}; "
            f"{describe(env.get('fingerprint'))}.",
            "",
            f"![cost of mining against batch size](figures/cost_{p['name']}.png)",
        ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `cost` subcommand to the CLI's subparsers."""
    cost = subparsers.add_parser(
        "cost", help="measure how mining and loss cost grow with the batch size"
    )
    which = cost.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every registered method (default)")
    which.add_argument("--methods", help="NAME[,NAME...]")
    cost.add_argument("--protocol", default="default", help="protocol name or YAML path")
    cost.add_argument(
        "--batch-sizes",
        default=",".join(map(str, DEFAULT_BATCH_SIZES)),
        help="comma-separated multiples of the protocol's K (default: %(default)s)",
    )
    cost.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS,
                      help="timed calls per batch size, at most (default: %(default)s)")  # fmt: skip
    cost.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS,
                      help="training steps timed per method for throughput (default: %(default)s)")  # fmt: skip
    cost.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    cost.add_argument("--data-root", help="folder holding the dataset's files")
    cost.add_argument("--results-dir", default="results", help="default: results")
    cost.add_argument("--no-overhead", action="store_true",
                      help="skip the harness-versus-bare-loop comparison")  # fmt: skip
    cost.add_argument("--overhead-breakdown", action="store_true",
                      help="also time each piece of the harness's bookkeeping alone")  # fmt: skip
    cost.add_argument("--json", action="store_true", help="print the per-method list as JSON")
    return cost


def run_cost(args: argparse.Namespace) -> int:
    """`python -m harness cost`: measure, write results/cost/<protocol>.json and the figure,
    print the table (or, with --json, the list of per-method objects). Returns the exit
    status: 1 when a method failed, else 0."""
    from harness.protocol import load_protocol

    protocol = load_protocol(args.protocol)
    sizes = parse_batch_sizes(args.batch_sizes, protocol.sampler.images_per_class)

    import methods  # noqa: F401  (registers the methods)
    from harness.figures import cost_figure
    from harness.method import METHODS
    from harness.runner import resolve_device

    if getattr(args, "methods", None):
        names = list(dict.fromkeys(m.strip() for m in args.methods.split(",") if m.strip()))
        if not names:
            raise HarnessError("--methods: give at least one method name")
    else:
        names = METHODS.names()
    for name in names:
        METHODS.get(name).hyperparameters(protocol.method_overrides(name))
    device = resolve_device(args.device)
    record = measure_cost(
        protocol, names, sizes, device=device, repeats=args.repeats, steps=args.steps,
        data_root=args.data_root, overhead=not args.no_overhead,
        breakdown=args.overhead_breakdown,
    )  # fmt: skip
    results_dir = Path(args.results_dir)
    figure = cost_figure(record, figure_path(results_dir, protocol.name))
    record["figure"] = str(figure.relative_to(results_dir))
    path = write_cost(record, results_dir)
    if args.json:
        print(json.dumps(record["methods"], indent=2))
    else:
        print(cost_table(record))
        print()
        print(overhead_line(record))
        print(f"written: {path}, {figure} ({record['seconds']:.0f} s)")
    return 1 if any(e["status"] == "failed" for e in record["methods"]) else 0


__all__ = [
    "PowerFit",
    "add_parser",
    "cost_section",
    "cost_table",
    "fit_power_law",
    "measure_cost",
    "measure_overhead",
    "measure_scaling",
    "measure_throughput",
    "parse_batch_sizes",
    "run_cost",
]
