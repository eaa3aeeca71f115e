"""Where a sweep's runs execute: `local` (this process, one run after another: runner.sweep),
`sweep_pinned` (local worker processes with a fixed thread count: the regression check) or
`ray` (each run specification a Ray task, on this machine or a cluster).

With Ray the driver owns the results folder: it applies the skip-if-finished rule, holds
each run's lock, and writes each finished result atomically from what the task returns, so
workers need no shared file system. A task whose worker dies (kill -9, a lost node) is
retried by Ray; a run that fails for its own reasons (a NaN loss, an empty miner) returns a
`failed` record and is not retried. With a shared file system, a retried task resumes from
the epoch checkpoint its predecessor wrote. Workers report each finished epoch through a Ray
queue, and the driver logs it beside its bar over the sweep.
"""

from __future__ import annotations

import logging
import time

import torch

from harness.core import load_methods
from harness.core.numerics import pinned_environ
from harness.sweep.runner import execute, prepare_all
from harness.sweep.spec import RunSpec, resolve_all

log = logging.getLogger(__name__)
ENGINES = ("local", "ray")


def _pin_worker(threads: int, log_level: int) -> None:
    """Process-pool initializer: a fixed torch thread count and the registered methods."""
    load_methods()

    torch.set_num_threads(threads)
    logging.basicConfig(level=log_level, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")


def sweep_pinned(
    specs: list[RunSpec], workers: int, threads: int = 1, pinned_numerics: bool = False
) -> dict[str, int]:
    """Run specs in `workers` processes of `threads` torch threads each.

    Float rounding depends on the thread count, so a sweep whose numbers are compared bit for
    bit across machines (the regression check) pins it: then a 2-core and a 16-core machine
    of one processor type agree, and the spare cores run other specs in parallel instead.
    With `pinned_numerics` every run, and the data preparation, goes to worker processes
    started under harness.core.numerics's pinned settings (issue 72), even with one worker.
    Returns counts by status; one failed run does not stop the others."""
    specs = resolve_all(specs)  # parse each protocol once, here, not in every worker
    if pinned_numerics:
        with pinned_environ():  # read by the workers' libraries as they load
            return _pool(specs, workers, threads, prepare=True)
    prepare_all(specs)  # build each dataset cache once, here, before the workers read it
    counts: dict[str, int] = {}
    start = time.perf_counter()
    if workers <= 1:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for n, spec in enumerate(specs, 1):
                status, _ = execute(spec, progress=False)
                counts[status] = counts.get(status, 0) + 1
                log.info("[%d/%d] %s seed %d: %s (%.0f s)", n, len(specs), spec.method,
                         spec.seed, status, time.perf_counter() - start)  # fmt: skip
        finally:
            torch.set_num_threads(previous)
        return counts
    return _pool(specs, workers, threads)


def _pool(
    specs: list[RunSpec], workers: int, threads: int, prepare: bool = False
) -> dict[str, int]:
    """The specs in `workers` spawned processes of `threads` torch threads each; with
    `prepare`, the data is prepared first, in one of them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    counts: dict[str, int] = {}
    start = time.perf_counter()
    level = logging.getLogger("harness").getEffectiveLevel()
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),  # fork after OpenMP init can hang
        initializer=_pin_worker,
        initargs=(threads, max(level, logging.WARNING)),
    ) as pool:
        if prepare:
            pool.submit(prepare_all, specs).result()
        futures = {pool.submit(execute, spec, False): spec for spec in specs}
        try:
            for n, future in enumerate(as_completed(futures), 1):
                spec = futures[future]
                status, _ = future.result()
                counts[status] = counts.get(status, 0) + 1
                log.info("[%d/%d] %s seed %d: %s (%.0f s)", n, len(specs), spec.method,
                         spec.seed, status, time.perf_counter() - start)  # fmt: skip
        except BaseException:  # an error or Ctrl-C: finished results stay, queued runs do not start
            for future in futures:
                future.cancel()
            raise
    return counts
