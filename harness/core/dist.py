"""Where this process sits in a run under torchrun: its rank, the world size and the backend
(harness.train.distributed holds the collectives). One process when not launched.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

from harness.core.errors import HarnessError


@dataclasses.dataclass(frozen=True)
class Dist:
    """This process's place in the run: rank, world size, backend ('' when not distributed)."""

    rank: int = 0
    world_size: int = 1
    backend: str = ""
    local_rank: int = 0

    @property
    def active(self) -> bool:
        """Collectives are in use (a torchrun launch, even of one process)."""
        return bool(self.backend)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> slice:
        """This rank's contiguous block of a batch of n (rank order = batch order)."""
        if n % self.world_size:
            raise HarnessError(
                f"a batch of {n} images does not split over {self.world_size} processes; use a "
                "--nproc_per_node that divides sampler.classes_per_batch x images_per_class"
            )
        per = n // self.world_size
        return slice(self.rank * per, (self.rank + 1) * per)


SINGLE = Dist()


# How long a rank waits in a collective. Rank 0 alone evaluates and writes each run while the
# other ranks already wait for the next run of a sweep; NCCL's default (10 minutes) would abort
# a long evaluation (a learned scorer, SOP on the CPU) and lose the run's last epoch.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=4)


def launched() -> bool:
    """Whether torchrun (or another launcher of torch.distributed) started this process."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_from_env(device: torch.device) -> Dist:
    """Join the process group torchrun describes: NCCL on CUDA, gloo on the CPU."""
    if not launched():
        return SINGLE
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    return current()


def current() -> Dist:
    """The Dist of an initialised process group, else SINGLE."""
    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    return Dist(dist.get_rank(), dist.get_world_size(), dist.get_backend(),
                int(os.environ.get("LOCAL_RANK", "0")))  # fmt: skip


def leave(here: Dist, status: int) -> None:
    """End this process's part in a torchrun launch: every rank waits for the others (rank 0
    may still be evaluating and writing), the process group is torn down, and a rank other
    than 0, which has nothing left to write, exits at once with `status`.

    Why at once: a rank that went on to the interpreter's normal teardown was seen to abort
    there now and then ("terminate called without an active exception", SIGABRT) after its
    work was done and the group destroyed, which failed the whole launch. Rank 0 returns and
    reports as usual."""
    dist.barrier()
    dist.destroy_process_group()
    if not here.is_main:
        import logging
        import sys

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
