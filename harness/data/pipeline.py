"""Feeding the training step: each step's images (this rank's shard of the batch), loaded and
augmented, prepared ahead by worker processes while the model computes.

The training loop draws an epoch's batch indices from the P x K sampler in the main process
(so the sampler's state, which checkpoints save, never runs ahead of the epoch), then the
`Feeder` hands them to a torch DataLoader as its sampler: with `workers` > 0, worker
processes decode and augment whole batches (spawned, persistent for the run, `PREFETCH`
batches ahead each, pinned memory on CUDA) and the batches arrive in step order. With 0
workers the same function runs in the training process. Every random draw is seeded by
(seed, step, position in batch) (harness.data.augment), so the images, and the result files, do
not depend on the number of workers. With the torch decoder (`run --decoder torch`) the
workers only read the files, and the training process decodes and augments each batch on
its device (harness.data.torch_decode), inside the timed wait (on CUDA its host-side part:
the kernels run on the step's stream). The seconds the step waits
for its batch are counted (`wait`): the data-wait share of training that results record.
The first wait with workers, their start-up (spawning them, importing torch), is also kept
(`startup`, in results `data_startup_seconds`): a short timed window can subtract it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from harness.core import SINGLE, Dist, HarnessError
from harness.data.lazy import set_decode_threads
from harness.data.torch_decode import Encoded

PREFETCH = 2  # batches each worker prepares ahead
MAX_AUTO_WORKERS = 8

Augment = Callable[[torch.Tensor, int, Any], torch.Tensor]


def default_workers(images: Any, augment: Augment | None) -> int:
    """Workers when --workers is not given: none when there is nothing to prepare (images in
    memory, no augmentation), else the machine's cores (shared among torchrun's processes on
    this node), at most MAX_AUTO_WORKERS."""
    if augment is None and not hasattr(images, "load") or getattr(images, "in_process", False):
        return 0
    if getattr(getattr(images, "device", None), "type", "cpu") != "cpu":  # held on a GPU
        return 0
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)  # torchrun: the node's processes
    return max(1, min(MAX_AUTO_WORKERS, (os.cpu_count() or 1) // max(ranks, 1)))


def load_batch(
    images: Any, augment: Augment | None, step: int, idx: Any, dist: Dist
) -> torch.Tensor:
    """uint8 [B, C, S, S]: this rank's shard of the batch `idx` at `step`, augmented."""
    return finish(prepare(images, augment, step, idx, dist), augment, step, idx, dist)


def _positions(idx: Any, dist: Dist) -> range:
    """The positions in the whole batch of this rank's shard (the augmentation's seeds)."""
    return range(len(idx))[dist.shard(len(idx)) if dist.active else slice(None)]


def prepare(images: Any, augment: Augment | None, step: int, idx: Any, dist: Dist) -> Any:
    """What a data worker makes of a batch: its images loaded and augmented, or, when the
    training process decodes them (the torch decoder), only its files read (`Encoded`)."""
    idx = torch.as_tensor(idx)
    positions = _positions(idx, dist)
    x = images[idx[positions.start : positions.stop]]
    if getattr(x, "decoder", "pil") == "torch":
        return x.read()
    x = x.load() if hasattr(x, "load") else x
    return augment(x, step, positions) if augment is not None else x


def finish(prepared: Any, augment: Augment | None, step: int, idx: Any, dist: Dist) -> torch.Tensor:
    """The batch as the step takes it: read files are decoded (on the decoder's device) and
    augmented here; a batch the worker finished is returned as it is."""

    if isinstance(prepared, _Failed):
        raise HarnessError(prepared.message)
    if not isinstance(prepared, Encoded):
        return prepared
    x = prepared.decode()
    return augment(x, step, _positions(idx, dist)) if augment is not None else x


class _Failed:
    """A batch that could not be prepared, for a reason the user can fix (a HarnessError: a
    corrupt file, a protocol that does not fit the data). Handed over as a value, so that it
    stays one line: torch would re-raise it wrapped in the worker's whole traceback."""

    def __init__(self, message: str) -> None:
        self.message = message


def worker_death(exc: BaseException) -> HarnessError | None:
    """A data worker that died (killed by the system, e.g. out of memory) as a one-line error
    with the cure; None for any other exception."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or "DataLoader worker" not in text:
        return None
    return HarnessError(f"a data worker process died ({text.splitlines()[0].rstrip('. ')}): "
                        "usually the machine ran out of memory; run the same command again with "
                        "fewer --workers (it resumes from the last epoch's checkpoint)")  # fmt: skip


class _Batches(torch.utils.data.Dataset):
    """What a worker computes: (step, indices) -> (step, indices, prepared batch)."""

    def __init__(self, images: Any, augment: Augment | None, dist: Dist) -> None:
        self.images, self.augment, self.dist = images, augment, dist

    def __getitem__(self, key: tuple[int, np.ndarray]) -> tuple[int, torch.Tensor, Any]:
        step, idx = key
        idx = torch.as_tensor(idx)
        try:
            return step, idx, prepare(self.images, self.augment, step, idx, self.dist)
        except HarnessError as exc:
            return step, idx, _Failed(str(exc))

    def finish(self, item: tuple[int, torch.Tensor, Any]) -> tuple[int, torch.Tensor, Any]:
        step, idx, prepared = item
        return step, idx, finish(prepared, self.augment, step, idx, self.dist)


def _one_decode_thread(worker_id: int) -> None:
    """In a worker: decode serially (torch already runs one thread there)."""

    set_decode_threads(1)


class _Keys(torch.utils.data.Sampler):
    """The DataLoader's sampler: the keys of the epoch being fed (set before each epoch)."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, np.ndarray]] = []

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


class Feeder:
    """Batches for the training step, in step order, prepared by `workers` processes."""

    def __init__(
        self,
        images: Any,
        augment: Augment | None,
        workers: int = 0,
        pin_memory: bool = False,
        dist: Dist = SINGLE,
    ) -> None:
        self.dataset = _Batches(images, augment, dist)
        self.workers = int(workers)
        self.wait = 0.0  # seconds the caller waited for batches
        self.startup: float = 0.0  # of which, the first batch from the workers: their start-up
        self.loader: torch.utils.data.DataLoader | None = None
        self.started = False
        self.keys = _Keys()
        if self.workers > 0:
            self.loader = torch.utils.data.DataLoader(
                self.dataset, batch_size=None, sampler=self.keys, num_workers=self.workers,
                pin_memory=pin_memory, prefetch_factor=PREFETCH, persistent_workers=True,
                multiprocessing_context="spawn",  # fork after OpenMP started can hang
                worker_init_fn=_one_decode_thread,
                # its own generator: the loader's seed draw must not move torch's global one,
                # which a method's dropout reads (results would depend on the worker count)
                generator=torch.Generator(),
            )  # fmt: skip

    def batches(
        self, keys: list[tuple[int, np.ndarray]]
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(step, indices, images) for each key, in order; the waiting is timed."""
        if self.loader is None:
            source: Iterator[Any] = (self.dataset[key] for key in keys)
        else:
            self.keys.keys = list(keys)
            source = iter(self.loader)
        while True:
            begin = time.perf_counter()
            try:
                item = self.dataset.finish(next(source))
            except StopIteration:
                return
            except RuntimeError as exc:
                death = worker_death(exc)
                if death is None:
                    raise
                raise death from None
            finally:
                waited = time.perf_counter() - begin
                self.wait += waited
                if self.loader is not None and not self.started:
                    self.started, self.startup = True, waited
            yield item

    def close(self) -> None:
        """Stop the worker processes (they persist across epochs until then)."""
        loader, self.loader = self.loader, None
        if loader is not None and loader._iterator is not None:
            loader._iterator._shutdown_workers()
