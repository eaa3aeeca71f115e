"""Training throughput on the protocol's real data, through the harness's own training step.

Images per second of the whole step (backbone forward/backward, mining, loss, optimizer step,
as `harness.step.TrainingStep` does it in a run), under the identical initial backbone for
every method, and the share of the step spent in mining + loss. torch is imported inside the
function, so building the CLI parser stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from harness.distributed import Dist
    from harness.method import Method
    from harness.protocol import Protocol
    from harness.runner import PreparedData

DEFAULT_STEPS = 24  # measured training steps per method, after WARMUP_STEPS
WARMUP_STEPS = 4


def measure_throughput(
    backbone: torch.nn.Module,
    method: Method,
    prepared: PreparedData,
    protocol: Protocol,
    device: torch.device,
    *,
    steps: int = DEFAULT_STEPS,
    warmup: int = WARMUP_STEPS,
    seed: int = 0,
    dist: Dist | None = None,
) -> dict[str, Any]:
    """Whole training steps on the protocol's training images (P x K batches from its
    sampler): images per second over `steps` steps after `warmup`, and the share of those
    steps spent in mining + loss (forward and its backward down to the embedding; the
    backward is split at the embedding, which computes the same gradients). The caller gives
    every method the same initial backbone. On CUDA the phases are timed with events. Under
    torchrun (`dist`), this rank embeds its shard of every batch, as in a run, and the
    images counted are the whole batches."""
    import torch

    from harness import distributed
    from harness.precision import grad_scaler
    from harness.runner import contiguous
    from harness.sampler import PKSampler
    from harness.step import TrainingStep, parameter_groups, trainable_modules
    from harness.train import make_optimizer

    data, split = prepared.data, prepared.split
    labels = contiguous(data.labels[split.train])
    coarse = None if data.coarse_labels is None else data.coarse_labels[split.train]
    sampler = PKSampler(
        labels, protocol.sampler.classes_per_batch, protocol.sampler.images_per_class, seed
    )
    dist = dist or distributed.SINGLE
    if dist.world_size > 1:  # as train does: batch statistics over the whole batch
        distributed.convert_batchnorm(backbone)
        distributed.convert_batchnorm(method.head)
    modules = trainable_modules(backbone, method)
    optimizer = make_optimizer(parameter_groups(backbone, method), protocol)
    modules.train()
    step = TrainingStep(backbone, method, optimizer, data.images[split.train], labels, coarse,
                        device, split_backward=True, dist=dist, precision=protocol.precision,
                        scaler=grad_scaler(device, protocol.precision))  # fmt: skip
    for _ in range(warmup):
        step(torch.from_numpy(sampler.next_batch()))
    step.timer.reset()
    images, empty = 0, 0
    begin = step.timer.now()
    for _ in range(steps):
        result = step(torch.from_numpy(sampler.next_batch()))
        images += result.images
        empty += not result.trained
    seconds = step.timer.now() - begin
    mining_loss = step.timer.total("mining", "loss")
    return {
        "steps": steps,
        "batch_size": protocol.sampler.batch_size,
        "images_per_second": round(images / seconds, 2),
        "step_ms": round(seconds / steps * 1e3, 3),
        "mining_loss_ms": round(mining_loss / steps * 1e3, 3),
        "mining_loss_share": round(mining_loss / seconds, 4),
        "empty_steps": empty,
    }
