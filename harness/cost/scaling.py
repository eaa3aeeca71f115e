"""Synthetic scaling: how a method's mining and loss grow with the batch size m = P x K.

Random stage features [m, dim] (the protocol backbone's stage_dims) go through the method's
head once; its outputs are detached into leaves, so the loss time is the loss alone. Labels:
P random training classes x K images; coarse labels: the P classes dealt round-robin into a
few superclasses (about 4 fine classes each). Timed separately: the miner (under no_grad) and
the loss forward + backward (down to the embedding and the loss's own parameters),
CUDA-synchronised, median over the repeats. Counted: `mined.evaluated` (pair distances or
scores computed) and `mined.count()` (tuples). No miner: mining time 0 and counts 0.

Repeats adapt so that `--all` stays within minutes on a CPU: each (method, m) cell first makes
one untimed warm-up call unless that call already took SLOW_CALL seconds (its one-time costs
are then negligible and it is kept as the first repeat), then repeats until it has `repeats`
timings or has spent CELL_SECONDS (at least one timing); a call longer than MAX_CALL_SECONDS,
or running out of memory, skips the larger batch sizes. Each cell records its repeats.
torch is imported inside the functions, so building the CLI parser stays fast.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.core import Batch, HarnessError, PhaseTimer
from harness.train import detach_outputs

if TYPE_CHECKING:
    import torch

    from harness.core import Batch, Embedded, Method, MethodContext, PhaseTimer, RunContext

DEFAULT_BATCH_SIZES = (32, 64, 128, 256, 512, 1024)
DEFAULT_REPEATS = 5
CELL_SECONDS = 2.0  # a (method, m) cell stops repeating once it has spent this long
SLOW_CALL = 1.0  # a call this long needs no warm-up: it is kept as the first repeat
MAX_CALL_SECONDS = 60.0  # one call slower than this: the larger batch sizes are skipped

# (mining seconds, loss seconds, pair scores evaluated, tuples mined) of one call
Call = tuple[float, float, int, int]


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


def _synthetic_batch(
    m: int, k: int, num_classes: int, num_coarse: int, generator: torch.Generator,
    device: torch.device,
) -> Any:  # fmt: skip
    """P = m / K distinct random classes x K images; coarse: the P classes dealt round-robin
    into about P / 4 superclasses (at least 2, at most num_coarse)."""
    import torch

    p = m // k
    classes = torch.randperm(num_classes, generator=generator)[:p]
    supers = max(2, min(num_coarse, p // 4))
    coarse = torch.arange(p) % supers
    return Batch(classes.repeat_interleave(k).to(device), coarse.repeat_interleave(k).to(device))


def _inputs(
    method: Method, context: MethodContext, m: int, k: int, generator: torch.Generator,
    device: torch.device,
) -> tuple[Embedded, Batch]:  # fmt: skip
    """The head's outputs on random stage features of m images (the context's stage_dims),
    computed once without gradients, and the batch's labels (_synthetic_batch)."""
    import torch

    coarse = context.num_coarse_classes or 4
    batch = _synthetic_batch(m, k, context.num_classes, coarse, generator, device)
    features = [torch.rand(m, d, generator=generator).to(device) for d in context.stage_dims]
    with torch.no_grad():
        return method.head(features), batch


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _call(method: Method, out0: Embedded, batch: Batch, timer: PhaseTimer) -> Call:
    """One timed miner call and one loss forward + backward on leaves of the head's outputs."""
    import torch

    assert method.loss is not None
    out, _, _ = detach_outputs(out0, every_float=True)
    mined, mining = None, 0.0
    if method.miner is not None:
        start = timer.now()
        with torch.no_grad():
            mined = method.miner(out, batch)
        mining = timer.now() - start
    start = timer.now()
    loss = method.loss(out, batch, mined)
    if loss.requires_grad:
        loss.backward()
    seconds = timer.now() - start
    for p in method.loss.parameters():
        p.grad = None
    if mined is None:
        return mining, seconds, 0, 0
    return mining, seconds, int(mined.evaluated), int(mined.count())


def _repeat(
    method: Method, out0: Embedded, batch: Batch, timer: PhaseTimer, repeats: int,
    cell_seconds: float,
) -> tuple[list[tuple[float, float]], Call]:  # fmt: skip
    """The cell's timings (see the module docstring) and its first call."""
    spent = time.perf_counter()
    first = _call(method, out0, batch, timer)
    timings = [first[:2]] if first[0] + first[1] >= SLOW_CALL else []
    while len(timings) < repeats and (not timings or time.perf_counter() - spent < cell_seconds):
        timings.append(_call(method, out0, batch, timer)[:2])
    return timings, first


def measure_scaling(
    ctx: RunContext,
    method: Method,
    context: MethodContext,
    batch_sizes: Sequence[int],
    *,
    repeats: int = DEFAULT_REPEATS,
    cell_seconds: float = CELL_SECONDS,
) -> list[dict[str, Any]]:
    """Per batch size: median mining and loss (forward + backward) milliseconds, pairs
    evaluated and tuples mined, on random inputs (see the module docstring) on the context's
    device, drawn from its seed, K images per class as its protocol's sampler takes them.
    `context`: what the method was built for (its stage_dims are the random features'; its
    num_classes must be at least the largest P; coarse: at most its num_coarse_classes
    superclasses, 4 when it has none). Cells that could not run carry a `skipped` reason."""
    import torch

    if method.loss is None:
        raise ValueError("a method without a loss has no training cost to measure")
    device, images_per_class = ctx.device, ctx.protocol.sampler.images_per_class
    timer = PhaseTimer(device)
    generator = torch.Generator().manual_seed(ctx.seed)
    cells: list[dict[str, Any]] = []
    skip: str | None = None
    warm = False
    for m in batch_sizes:
        cell: dict[str, Any] = {"batch_size": m, "classes": m // images_per_class}
        if skip is not None:
            cells.append({**cell, "skipped": skip})
            continue
        try:
            out0, batch = _inputs(method, context, m, images_per_class, generator, device)
            if not warm:  # once per method: lazy initialisation, first kernels
                _call(method, out0, batch, timer)
                warm = True
            timings, first = _repeat(method, out0, batch, timer, repeats, cell_seconds)
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
             "evaluated": first[2], "tuples": first[3], "repeats": len(timings)}
        )  # fmt: skip
        if max(mining + loss, first[0] + first[1]) > MAX_CALL_SECONDS:
            skip = f"skipped: one call at m={m} took over {MAX_CALL_SECONDS:.0f} s"
    return cells
