"""Sweeps on Ray (`run --engine ray`): each run specification a Ray task, on this machine or a
cluster. The driver owns the results folder: it applies the skip-if-finished rule, holds
each run's lock, and writes each finished result atomically from what the task returns, so
workers need no shared file system. A task whose worker dies (kill -9, a lost node) is
retried by Ray; a run that fails for its own reasons (a NaN loss, an empty miner) returns a
`failed` record and is not retried. Workers report each finished epoch through a Ray queue.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from harness.core import METHODS, PLUGINS_ENV, HarnessError, load_methods
from harness.records import RunResult, result_path
from harness.sweep.policy import decide
from harness.sweep.record import new_result, write_run
from harness.sweep.runner import execute_run
from harness.sweep.spec import RunSpec, resolve_all

log = logging.getLogger(__name__)


TASK_RETRIES = 3  # a task whose worker process dies is resubmitted this many times
POLL_SECONDS = 1.0  # how often the driver shows the epochs its workers report


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise HarnessError(
            "--engine ray needs Ray: pip install -e '.[ray]' in a clone (or pip install -r "
            "requirements-ray.lock)"
        ) from None
    return ray


def run_task(spec: RunSpec, threads: int, progress: Any = None) -> dict[str, Any]:
    """A Ray task: train and evaluate one run; return its status, record and, with
    `--save-embeddings`, its test embeddings and, with `--save-model`, its model (none of them
    written: the driver writes).
    `progress`: a Ray queue to which each finished epoch is reported (best effort)."""
    load_methods()

    torch.set_num_threads(threads)  # the rounding depends on it: the result records it
    record = new_result(spec, METHODS.get(spec.method))
    path = result_path(Path(spec.results_dir), spec.parsed_protocol.name, spec.run_name,
                       spec.seed)  # fmt: skip

    def report(epoch: int) -> None:
        try:
            progress.put_nowait((spec.method, spec.seed, epoch))
        except Exception:  # a lost progress line never costs a run
            pass

    out: dict[str, Any] = {}

    def hand_back(_: Path, result: RunResult, saved: Any = None, kept: Any = None) -> None:
        out.update(result=result.to_json(), embeddings=saved, model=kept)  # the driver writes

    status, _ = execute_run(spec, record, path, on_epoch_end=None if progress is None else report,
                            write=hand_back)  # fmt: skip
    return {"status": status, "result": out.get("result"), "embeddings": out.get("embeddings"),
            "model": out.get("model")}  # fmt: skip


def start_ray(ray: Any, address: str | None) -> bool:
    """Join the cluster at `address`, or start a local Ray on this machine; True if started
    here. Workers find the harness on PYTHONPATH (a cluster's image may install it instead)."""
    if ray.is_initialized():
        return False
    code = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH")) if p)}
    for name in ("DML_HARNESS_CACHE", PLUGINS_ENV):  # the cache; the command's --plugin files
        if name in os.environ:
            env[name] = os.environ[name]
    options: dict[str, Any] = {"runtime_env": {"env_vars": env}, "include_dashboard": False,
                               "log_to_driver": False, "configure_logging": False}  # fmt: skip
    if address is None:
        options["num_cpus"] = os.cpu_count() or 1
    ray.init(address=address, **options)
    return True


def sweep_ray(
    specs: list[RunSpec],
    address: str | None = None,
    cpus_per_run: int = 1,
    gpus_per_run: float = 0.0,
    progress: bool = True,
) -> dict[str, int]:
    """Run specs as Ray tasks; returns counts by status, like runner.sweep."""
    ray = import_ray()
    specs = resolve_all(specs)
    started = start_ray(ray, address)
    task = ray.remote(run_task).options(num_cpus=cpus_per_run, num_gpus=gpus_per_run,
                                        max_retries=TASK_RETRIES, retry_exceptions=False)  # fmt: skip
    counts: dict[str, int] = {}
    try:
        from ray.util.queue import Queue

        epochs = Queue(actor_options={"num_cpus": 0})  # workers report each finished epoch
        with ExitStack() as locks:
            pending = _submit(specs, task, cpus_per_run, locks, counts, epochs)
            _collect(ray, pending, len(specs), counts, progress, epochs)
    finally:
        if started:
            ray.shutdown()
    return counts


def _submit(specs: list[RunSpec], task: Any, threads: int, locks: ExitStack,
            counts: dict[str, int], progress: Any) -> dict[Any, tuple[RunSpec, Path]]:  # fmt: skip
    """Submit every run not finished yet (on any machine of the cluster), holding its lock."""
    pending = {}
    for spec in specs:
        status, path, _ = decide(spec, locks, any_machine=True)
        if status is not None:
            counts[status] = counts.get(status, 0) + 1
            continue
        pending[task.remote(spec, threads, progress)] = (spec, path)
    return pending


def _collect(ray: Any, pending: dict[Any, tuple[RunSpec, Path]], total: int,
             counts: dict[str, int], progress: bool, epochs: Any) -> None:  # fmt: skip
    """Write each result as its task finishes: one line per run and per epoch streamed back
    from the workers, and a bar over the sweep."""
    start, done = time.perf_counter(), sum(counts.values())
    bar = tqdm(
        total=total, initial=done, desc="runs", unit="run", disable=None if progress else True
    )  # fmt: skip (None: on a terminal only)
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
            _epoch_lines(epochs, bar)
            if not ready:
                continue
            spec, path = pending.pop(ready[0])
            try:
                out = ray.get(ready[0])
            except Exception as exc:  # a crash of the run's code, or a worker lost too often
                status = "error"
                log.error("%s seed %d: %s", spec.method, spec.seed, str(exc).splitlines()[0])
            else:
                status = out["status"]
                if out["result"] is not None:
                    write_run(path, RunResult.from_json(out["result"]), out.get("embeddings"),
                              out.get("model"))  # fmt: skip
            counts[status] = counts.get(status, 0) + 1
            done += 1
            bar.update(1)
            log.info("[%d/%d] %s seed %d: %s (%.0f s)", done, total, spec.method, spec.seed,
                     status, time.perf_counter() - start)  # fmt: skip
    finally:
        bar.close()


def _epoch_lines(epochs: Any, bar: tqdm) -> None:
    """Log the epochs the workers finished since the last call; the bar shows the latest."""
    n = epochs.qsize()
    for method, seed, epoch in epochs.get_nowait_batch(n) if n else []:
        log.info("%s seed %d: epoch %d done", method, seed, epoch)
        bar.set_postfix_str(f"{method} seed {seed} epoch {epoch}", refresh=False)
