"""Where a sweep's runs execute: `local` (this process, one run after another: runner.sweep)
or `ray` (each run specification a Ray task, on this machine or a cluster).

With Ray the driver owns the results folder: it applies the skip-if-finished rule, holds
each run's lock, and writes each finished result atomically from what the task returns, so
workers need no shared file system. A task whose worker dies (kill -9, a lost node) is
retried by Ray; a run that fails for its own reasons (a NaN loss, an empty miner) returns a
`failed` record and is not retried. With a shared file system, a retried task resumes from
the epoch checkpoint its predecessor wrote.
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

from harness.errors import HarnessError
from harness.method import METHODS
from harness.results import RunResult, archive, read_result, result_path, run_lock, write_result
from harness.runner import RunSpec, _execute, _same_run, new_result, resolve_all

log = logging.getLogger(__name__)
ENGINES = ("local", "ray")
TASK_RETRIES = 3  # a task whose worker process dies is resubmitted this many times


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise HarnessError(
            "--engine ray needs Ray: pip install -e '.[ray]' in a clone (or pip install -r "
            "requirements-ray.lock)"
        ) from None
    return ray


def run_task(spec: RunSpec, threads: int) -> dict[str, Any]:
    """A Ray task: train and evaluate one run; return its status and record (not written)."""
    import methods  # noqa: F401  (a fresh worker starts with an empty registry)

    torch.set_num_threads(threads)  # the rounding depends on it: the result records it
    method_spec = METHODS.get(spec.method)
    record = new_result(spec, method_spec)
    path = result_path(Path(spec.results_dir), spec.parsed_protocol.name, spec.run_name,
                       spec.seed)  # fmt: skip
    out: dict[str, Any] = {}
    status, _ = _execute(spec, spec.parsed_protocol, method_spec, spec.hyperparameters, record,
                         path, False, None, write=lambda _, r: out.update(result=r.to_json()))  # fmt: skip
    return {"status": status, "result": out.get("result")}


def _start(ray: Any, address: str | None) -> bool:
    """Join the cluster at `address`, or start a local Ray on this machine; True if started
    here. Workers find the harness on PYTHONPATH (a cluster's image may install it instead)."""
    if ray.is_initialized():
        return False
    code = str(Path(__file__).resolve().parent.parent)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH")) if p)}
    if "DML_HARNESS_CACHE" in os.environ:
        env["DML_HARNESS_CACHE"] = os.environ["DML_HARNESS_CACHE"]
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
    started = _start(ray, address)
    task = ray.remote(run_task).options(num_cpus=cpus_per_run, num_gpus=gpus_per_run,
                                        max_retries=TASK_RETRIES, retry_exceptions=False)  # fmt: skip
    counts: dict[str, int] = {}
    try:
        with ExitStack() as locks:
            pending = _submit(specs, task, cpus_per_run, locks, counts)
            _collect(ray, pending, len(specs), counts, progress)
    finally:
        if started:
            ray.shutdown()
    return counts


def _submit(specs: list[RunSpec], task: Any, threads: int, locks: ExitStack,
            counts: dict[str, int]) -> dict[Any, tuple[RunSpec, Path]]:  # fmt: skip
    """Submit every run not finished yet (on any machine of the cluster), holding its lock."""
    pending = {}
    for spec in specs:
        path = result_path(Path(spec.results_dir), spec.parsed_protocol.name, spec.run_name,
                           spec.seed)  # fmt: skip
        record = new_result(spec, METHODS.get(spec.method))
        if path.exists() and not spec.force and _same_run(read_result(path), record, True):
            counts["skipped"] = counts.get("skipped", 0) + 1
            continue
        if not locks.enter_context(run_lock(path)):
            log.warning("%s is being run by another process; skipping it here", path)
            counts["running_elsewhere"] = counts.get("running_elsewhere", 0) + 1
            continue
        pending[task.remote(spec, threads)] = (spec, path)
    return pending


def _collect(ray: Any, pending: dict[Any, tuple[RunSpec, Path]], total: int,
             counts: dict[str, int], progress: bool) -> None:  # fmt: skip
    """Write each result as its task finishes: one line per run, and a bar over the sweep."""
    start, done = time.perf_counter(), sum(counts.values())
    bar = tqdm(total=total, initial=done, desc="runs", unit="run", disable=not progress)
    try:
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            spec, path = pending.pop(ref)
            try:
                out = ray.get(ref)
            except Exception as exc:  # a crash of the run's code, or a worker lost too often
                status = "error"
                log.error("%s seed %d: %s", spec.method, spec.seed, str(exc).splitlines()[0])
            else:
                status = out["status"]
                if out["result"] is not None:
                    if path.exists():
                        log.info("archived the previous result to %s",
                                 archive(path, Path(spec.results_dir)))  # fmt: skip
                    write_result(path, RunResult.from_json(out["result"]))
            counts[status] = counts.get(status, 0) + 1
            done += 1
            bar.update(1)
            log.info("[%d/%d] %s seed %d: %s (%.0f s)", done, total, spec.method, spec.seed,
                     status, time.perf_counter() - start)  # fmt: skip
    finally:
        bar.close()
