"""Shared fixtures: a per-run data cache, so tests never touch the user's cache; and what the
suite needs to run on every core (pyproject.toml's addopts: pytest-xdist, `-n logical --dist
loadgroup`).

Under xdist each worker process is its own pytest session. The workers of one run share one
data cache (the rendered glyphs take seconds to build; the harness writes its cache files
atomically, so two workers building the same file at once only duplicate work), each worker
uses its share of the cores for torch (2 workers of 2 threads each on 2 cores would
oversubscribe them), and the known-slow tests are handed out first, so that the last minutes
of a run are not one worker finishing a long test while the other idles. Tests that share an
expensive module fixture carry an `xdist_group` mark: --dist loadgroup runs each group on one
worker, which builds the fixture once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OMNIGLOT_DIR = REPO.parent / "shared" / "data" / "omniglot"


def xdist_workers() -> int:
    """How many xdist workers this run has (0: not under xdist, or the controller)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return 0
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n logical` (addopts) asks here first: no workers for a benchmark run (`pytest
    tests/benchmarks --benchmark-only`), which pytest-benchmark would switch off under xdist;
    else None: xdist counts the CPUs."""
    return 0 if config.getoption("benchmark_only", False) else None


def pytest_configure(config: pytest.Config) -> None:
    workers = xdist_workers()
    if workers > 1:  # this worker's share of the cores, for torch's intra-op threads
        threads = max(1, (os.cpu_count() or 1) // workers)
        # and for the processes its tests start (a `harness run` subprocess, torchrun without
        # its own setting, data workers), unless the caller chose a count
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        import torch

        torch.set_num_threads(threads)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist: the slow tests first (a stable sort: the order is otherwise unchanged, and
    every worker computes the same order, as xdist requires); and each test's xdist_group
    where --dist loadgroup finds it."""
    if not xdist_workers():
        return
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if config.getvalue("loadgroup"):
        for item in items:
            _name_the_group_in_the_node_id(item)


def _name_the_group_in_the_node_id(item: pytest.Item) -> None:
    """pytest-xdist 3.8.0 tells its loadgroup scheduler a test's group by an "@group" suffix
    of the node id, written to item._nodeid, which pytest 9.2 no longer reads (its nodes keep
    a structured id): the groups were silently spread over the workers (pytest-xdist issue
    #1386). Write the suffix where pytest reads it, as xdist's proposed fix does; nothing to do
    where xdist's own suffix took. A group that cannot be named is an error, not a silence."""
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})  # fmt: skip
    if not names:
        return
    suffix = "@" + "_".join(names)
    if item.nodeid.endswith(suffix):
        return
    node_id = getattr(item, "_id", None)
    if node_id is not None and hasattr(node_id, "parse"):
        item._id = type(node_id).parse(item.nodeid + suffix)
    if not item.nodeid.endswith(suffix):
        raise pytest.UsageError(f"cannot put {item.nodeid} in its xdist_group {suffix[1:]}")


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if xdist_workers():  # one cache for all workers of this run: pytest-N/cache
        from filelock import FileLock

        root = tmp_path_factory.getbasetemp().parent
        cache = root / "cache"
        cache.mkdir(exist_ok=True)
        os.environ["DML_HARNESS_CACHE"] = str(cache)
        # The machine id (in the user's configuration) is made by whichever process asks
        # first; two workers asking at once must not make two.
        from harness.records import machine_id

        with FileLock(root / "machine-id.lock"):
            machine_id()
        return cache
    cache = tmp_path_factory.mktemp("cache")
    os.environ["DML_HARNESS_CACHE"] = str(cache)
    return cache
