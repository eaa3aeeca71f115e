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
timings or has spent CELL_SECONDS (at least one timing). Before each batch size, one call's
time and peak memory are extrapolated from the sizes measured so far (`too_large`): a call
estimated to take more than MAX_CALL_SECONDS, or to hold more than MEMORY_SHARE of the free
memory (memory.py), skips that size and the larger ones with the estimate in its reason, as
does a call that took that long or ran out of memory. Each cell records its repeats.
torch is imported inside the functions, so building the CLI parser stays fast.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.core import Batch, HarnessError, PhaseTimer
from harness.cost.memory import PeakMemory, available_bytes
from harness.train import detach_outputs

if TYPE_CHECKING:
    import torch

    from harness.core import Batch, Embedded, Method, MethodContext, PhaseTimer, RunContext

DEFAULT_BATCH_SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_REPEATS = 5
CELL_SECONDS = 2.0  # a (method, m) cell stops repeating once it has spent this long
SLOW_CALL = 1.0  # a call this long needs no warm-up: it is kept as the first repeat
MAX_CALL_SECONDS = 60.0  # one call slower than this (measured or extrapolated): larger m skipped
MEMORY_SHARE = 0.5  # a call estimated to hold more than this share of the free memory: skipped

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
    cell_seconds: float, device: torch.device,
) -> tuple[list[tuple[float, float]], Call, int | None]:  # fmt: skip
    """The cell's timings (see the module docstring), its first call and the most memory that
    call held (PeakMemory; None where it cannot be read)."""
    spent = time.perf_counter()
    with PeakMemory(device) as peak:
        first = _call(method, out0, batch, timer)
    timings = [first[:2]] if first[0] + first[1] >= SLOW_CALL else []
    while len(timings) < repeats and (not timings or time.perf_counter() - spent < cell_seconds):
        timings.append(_call(method, out0, batch, timer)[:2])
    return timings, first, peak.bytes


def extrapolate(points: Sequence[tuple[int, float]], m: int) -> float | None:
    """A call's cost (seconds, bytes) at batch size m, from the measured (size, cost) points:
    the last point grown by the local exponent between the last two, clamped to [1, 3] (no
    method grows faster than the m^3 of enumerating every triplet, and a step up from a
    size where the cost was mostly fixed or reused memory would read steeper); 3 from a
    single point. None when nothing positive was measured."""
    measured = [(size, value) for size, value in points if value and value > 0]
    if not measured:
        return None
    last_m, last = measured[-1]
    exponent = 3.0
    if len(measured) >= 2 and measured[-2][0] != last_m:
        before_m, before = measured[-2]
        exponent = math.log(last / before) / math.log(last_m / before_m)
    return last * (m / last_m) ** min(3.0, max(1.0, exponent))


def _gib(size: float) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def too_large(
    measured: Sequence[dict[str, Any]], m: int, free_bytes: int | None,
    max_call_seconds: float = MAX_CALL_SECONDS,
) -> str | None:  # fmt: skip
    """Why batch size m should not be run, judged from the cells measured so far (their
    `call_seconds` and `peak_bytes`, see extrapolate): one call would take more than
    `max_call_seconds`, or hold more than MEMORY_SHARE of the `free_bytes` (None: unknown).
    None when it may run."""
    done = [c for c in measured if "skipped" not in c]
    base = ", ".join(str(c["batch_size"]) for c in done[-2:])
    seconds = extrapolate([(c["batch_size"], c.get("call_seconds")) for c in done], m)
    if seconds is not None and seconds > max_call_seconds:
        return (f"skipped: one call at m={m} would take about {seconds:.0f} s (over "
                f"{max_call_seconds:.0f} s; extrapolated from m={base})")  # fmt: skip
    needed = extrapolate([(c["batch_size"], c.get("peak_bytes")) for c in done], m)
    if needed is not None and free_bytes is not None and needed > MEMORY_SHARE * free_bytes:
        return (f"skipped: one call at m={m} would need about {_gib(needed)}, over "
                f"{MEMORY_SHARE:.0%} of the {_gib(free_bytes)} free (extrapolated from "
                f"m={base})")  # fmt: skip
    return None


def _cell(
    ctx: RunContext, method: Method, context: MethodContext, m: int, repeats: int,
    cell_seconds: float, warm: bool,
) -> dict[str, Any]:  # fmt: skip
    """One measured cell at batch size m (see measure_scaling); `warm`: a warm-up call was
    made already."""
    import torch

    timer = PhaseTimer(ctx.device)
    generator = torch.Generator().manual_seed(ctx.seed)  # each size's inputs from the seed
    k = ctx.protocol.sampler.images_per_class
    out0, batch = _inputs(method, context, m, k, generator, ctx.device)
    if not warm:  # once per method: lazy initialisation, first kernels
        _call(method, out0, batch, timer)
    timings, first, peak = _repeat(method, out0, batch, timer, repeats, cell_seconds, ctx.device)
    mining = statistics.median(t[0] for t in timings)
    loss = statistics.median(t[1] for t in timings)
    cell = {"batch_size": m, "classes": m // k, "mining_ms": round(mining * 1e3, 4),
            "loss_ms": round(loss * 1e3, 4), "evaluated": first[2], "tuples": first[3],
            "repeats": len(timings),
            "call_seconds": round(max(mining + loss, first[0] + first[1]), 4)}  # fmt: skip
    if peak is not None:
        cell["peak_bytes"] = peak
    return cell


def measure_scaling(
    ctx: RunContext,
    method: Method,
    context: MethodContext,
    batch_sizes: Sequence[int],
    *,
    repeats: int = DEFAULT_REPEATS,
    cell_seconds: float = CELL_SECONDS,
    max_call_seconds: float = MAX_CALL_SECONDS,
) -> list[dict[str, Any]]:
    """Per batch size: median mining and loss (forward + backward) milliseconds, pairs
    evaluated and tuples mined, on random inputs (see the module docstring) on the context's
    device, drawn from its seed, K images per class as its protocol's sampler takes them;
    with the slower of the median and first call (`call_seconds`) and the first call's peak
    memory (`peak_bytes`, where it can be read). `context`: what the method was built for
    (its stage_dims are the random features'; its num_classes must be at least the largest
    P; coarse: at most its num_coarse_classes superclasses, 4 when it has none). Cells that
    could not run carry a `skipped` reason: a size whose call would take too long or not fit
    in memory (too_large), or that ran out of memory, and every larger size."""
    import torch

    if method.loss is None:
        raise ValueError("a method without a loss has no training cost to measure")
    cells: list[dict[str, Any]] = []
    skip: str | None = None
    for m in batch_sizes:
        if skip is None and cells:
            skip = too_large(cells, m, available_bytes(ctx.device), max_call_seconds)
        if skip is not None:
            cells.append({"batch_size": m, "classes": m // ctx.protocol.sampler.images_per_class,
                          "skipped": skip})  # fmt: skip
            continue
        try:
            cells.append(_cell(ctx, method, context, m, repeats, cell_seconds, warm=bool(cells)))
        except (RuntimeError, MemoryError) as exc:
            if not _is_out_of_memory(exc) and not isinstance(exc, MemoryError):
                raise
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
            skip = f"out of memory at m={m}"
            cells.append({"batch_size": m, "classes": m // ctx.protocol.sampler.images_per_class,
                          "skipped": skip})  # fmt: skip
            continue
        if cells[-1]["call_seconds"] > max_call_seconds:
            skip = f"skipped: one call at m={m} took over {max_call_seconds:.0f} s"
    return cells


def measure_fixed_cost(
    ctx: RunContext, method: Method, context: MethodContext, *, repeats: int = DEFAULT_REPEATS
) -> dict[str, Any]:
    """The method's fixed per-call cost: its mining and loss times on the smallest batch it
    takes (2 classes x K images), where the work that grows with m is negligible. The time
    fits keep only the sizes well above it (fit.py)."""
    k = ctx.protocol.sampler.images_per_class
    cell = measure_scaling(ctx, method, context, [2 * k], repeats=repeats)[0]
    kept = ("batch_size", "mining_ms", "loss_ms", "repeats")
    return {key: cell[key] for key in kept if key in cell}
