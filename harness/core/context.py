"""The run context: what every stage of one run reads, passed as one object.

A run's stages (data, model, training step and loop, evaluation, result record) need the
same handful of facts: the protocol, the seed, the device, where this process sits among
torchrun's ranks, and the options of the command that started it. They travel together
here instead of as 9 to 16 parameters of each function, so a new option is one field, not
one more parameter on every function between the command line and the step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.core.dist import Dist, current
from harness.core.protocol import Protocol


@dataclass(frozen=True)
class RunContext:
    """One run's protocol, seed and device, its distributed place, and the command's options.

    max_steps caps training (smoke runs); workers is the number of processes preparing
    batches (None: the data pipeline's default); compile runs the training step's backbone
    through torch.compile; progress draws bars on a terminal; weights is a local ImageNet
    weights file that overrides the protocol's backbone.weights_file; data_root is the folder
    holding the dataset's files (None: the dataset's default); decoder says who decodes image
    files ("pil" in the workers, "torch" on the device)."""

    protocol: Protocol
    seed: int
    device: torch.device
    dist: Dist = field(default_factory=current)  # torchrun's process group, if joined
    results_dir: Path = Path("results")
    max_steps: int | None = None
    workers: int | None = None
    compile: bool = False
    progress: bool = False
    weights: str | None = None
    data_root: str | None = None
    decoder: str = "pil"

    @property
    def precision(self) -> str:
        """The protocol's numeric precision: fp32, bf16 or fp16."""
        return self.protocol.precision

    def replace(self, **changes: object) -> RunContext:
        """A copy with some fields changed (e.g. another seed for the same protocol)."""
        return dataclasses.replace(self, **changes)
