"""`tune --processes N`: the methods' studies side by side in N local processes.

On a CPU, torch spreads one small head's step over its threads badly: on 2 cores, two
processes of one thread each finished a photo protocol's studies 1.7 times as fast as one
process of two threads (docs/verdicts.md). Each process takes the next method when it is
free, runs that method's whole study (`tune_method`, exactly as one process would: a trial's
value does not depend on the process or its thread count), and keeps its cached features
for the next method. The studies share one storage; its schema is created here, once,
before the processes start (two processes creating an SQLite file's tables at once fail).

Ctrl-C stops every process at once: each records its running trial as failed and exits, so
no study queued behind it starts (a pool's worker would otherwise take the next one); a
Ctrl-C or SIGTERM that only this process saw is passed on to them, even when `tune` was
started in the background with SIGINT ignored.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import multiprocessing
import os
import signal
from pathlib import Path

from harness.core import load_methods, load_protocol
from harness.sweep import not_applicable_on
from harness.tune.options import TuneOptions
from harness.tune.study import DEFAULT, checked, default_storage, tune_method, tuning_view

log = logging.getLogger(__name__)


def threads_per_process(processes: int) -> int:
    """The torch threads each of `processes` processes takes: the cores shared out, 1 at least."""
    return max(1, (os.cpu_count() or 1) // processes)


def _start(threads: int) -> None:
    """A new process: its share of the cores, and the methods (plugins from the environment).

    A `tune` started in the background (`nohup ... &`) has SIGINT ignored, and a spawned
    process inherits that: the SIGINT this process passes on at SIGTERM would then be lost
    and the studies run on. Python's own Ctrl-C handler is put back."""
    import torch

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    torch.set_num_threads(threads)
    load_methods()


def _study(protocol_name: str, method: str, trials: int, options: TuneOptions) -> Path:
    """One method's whole study, in a process of the pool."""
    runs_under = load_protocol(protocol_name)
    try:
        return tune_method(tuning_view(runs_under), method, trials, options, runs_under)
    except KeyboardInterrupt:  # the trial is recorded as failed; take no queued study after it
        os._exit(130)


def _interrupt(process: multiprocessing.Process) -> None:
    """Ctrl-C in one of the pool's processes, unless it has ended already."""
    if process.is_alive() and process.pid is not None:
        try:
            os.kill(process.pid, signal.SIGINT)
        except ProcessLookupError:  # it ended in between
            pass


def tune(
    protocol_name: str, methods: list[str], trials: int, options: TuneOptions = DEFAULT
) -> dict[str, Path]:
    """Tune each method with the same number of trials, one study after another here, or
    options.processes studies side by side; returns the overlay per method. A method that
    cannot run on the data (not_applicable_on) is left out, saying why."""
    protocol, runs_under = checked(protocol_name, methods, trials, options)
    skipped = not_applicable_on(protocol, methods, options.data_root)
    for why in skipped.values():  # every trial would fail at its first batch
        print(f"{why}: not applicable, not tuned")
    methods = [m for m in methods if m not in skipped]
    if options.processes > 1 and len(methods) > 1:
        storage = options.storage or default_storage(options.results_dir, protocol.name)
        return tune_in_processes(protocol_name, methods, trials,
                                 dataclasses.replace(options, storage=storage))  # fmt: skip
    return {m: tune_method(protocol, m, trials, options, runs_under) for m in methods}


def tune_in_processes(
    protocol_name: str, methods: list[str], trials: int, options: TuneOptions
) -> dict[str, Path]:
    """Each method's study in one of options.processes processes (spawned, so nothing of this
    process's torch state is shared); the overlays per method, in the order asked."""
    import optuna

    storage = str(options.storage)
    if storage.startswith("sqlite:///"):
        Path(storage[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    optuna.storages.RDBStorage(storage)  # the schema, once
    # one bar per process would interleave: this process says when each study ends
    child = dataclasses.replace(options, progress=False, processes=1)
    context = multiprocessing.get_context("spawn")
    threads = threads_per_process(options.processes)
    log.info("%d studies in %d processes of %d torch threads", len(methods), options.processes,
             threads)  # fmt: skip
    written: dict[str, Path] = {}
    with concurrent.futures.ProcessPoolExecutor(options.processes, mp_context=context,
                                                initializer=_start, initargs=(threads,)) as pool:  # fmt: skip
        futures = {pool.submit(_study, protocol_name, m, trials, child): m for m in methods}
        try:
            for future in concurrent.futures.as_completed(futures):
                written[futures[future]] = future.result()
                if options.progress:
                    print(f"{futures[future]}: study done ({len(written)} of {len(methods)})",
                          flush=True)  # fmt: skip
        except BaseException as exc:  # a failed study: start no other; running ones end
            if isinstance(exc, KeyboardInterrupt):  # Ctrl-C: running ones stop too
                for process in list((getattr(pool, "_processes", None) or {}).values()):
                    _interrupt(process)
            pool.shutdown(wait=True, cancel_futures=True)  # (their finished trials are stored)
            raise
    return {m: written[m] for m in methods}
