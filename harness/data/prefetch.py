"""One batch made ahead: the next batch is decoded (and augmented) in a thread while the
network runs the current one, so that decoding is off the critical path. PIL and torch
release the GIL while they decode, resize and convolve, so the two overlap on a CPU."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def prefetched(items: Iterator[T]) -> Iterator[T]:
    """`items` in order, each made in a worker thread while the consumer holds the one
    before it (an exception in the worker is raised at that item)."""
    with ThreadPoolExecutor(1, thread_name_prefix="prefetch") as pool:
        pending = pool.submit(next, items, None)
        while (item := pending.result()) is not None:
            pending = pool.submit(next, items, None)
            yield item
