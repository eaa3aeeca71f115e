"""Training throughput on the protocol's real data, through the harness's own training step.

Images per second of the whole step (backbone forward/backward, mining, loss, optimizer step,
as `harness.train.step.TrainingStep` does it in a run), under the identical initial backbone for
every method, and the share of the step spent in mining + loss. torch is imported inside the
function, so building the CLI parser stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.core import SINGLE, grad_scaler
from harness.data import PKSampler, TrainPipeline, contiguous, load_batch
from harness.train import (
    TrainingStep,
    convert_batchnorm,
    make_optimizer,
    parameter_groups,
    trainable_modules,
)

if TYPE_CHECKING:
    import torch

    from harness.core import Dist, Method, Protocol
    from harness.data import PreparedData

DEFAULT_STEPS = 24  # measured training steps per method, after WARMUP_STEPS
WARMUP_STEPS = 4


def random_init(protocol: Protocol) -> Protocol:
    """The protocol with a randomly initialised backbone: what the cost commands time
    (weights change no cost, and pretrained ones may not be on the machine)."""
    import dataclasses

    backbone = dataclasses.replace(protocol.backbone, pretrained="none", weights_file="")
    return dataclasses.replace(protocol, backbone=backbone)


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
    feeder: Any = None,
    split_backward: bool = True,
) -> dict[str, Any]:
    """Whole training steps on the protocol's training images (P x K batches from its
    sampler): images per second over `steps` steps after `warmup`, and the share of those
    steps spent in mining + loss (forward and its backward down to the embedding; the
    backward is split at the embedding, which computes the same gradients). The caller gives
    every method the same initial backbone. On CUDA the phases are timed with events. Under
    torchrun (`dist`), this rank embeds its shard of every batch, as in a run, and the
    images counted are the whole batches. With a `feeder` (harness.data.pipeline.Feeder) the
    batches come from it, prepared as in a run, and the record adds the data-wait share;
    `split_backward=False` times the step exactly as a run takes it (no mining/loss split)."""
    import torch

    data, split = prepared.data, prepared.split
    labels = contiguous(data.labels[split.train])
    coarse = None if data.coarse_labels is None else data.coarse_labels[split.train]
    sampler = PKSampler(
        labels, protocol.sampler.classes_per_batch, protocol.sampler.images_per_class, seed
    )
    dist = dist or SINGLE
    if dist.world_size > 1:  # as train does: batch statistics over the whole batch
        convert_batchnorm(backbone)
        convert_batchnorm(method.head)
    step = _training_step(backbone, method, data.images[split.train], labels, coarse, protocol,
                          device, seed, dist, split_backward)  # fmt: skip
    keys = [(n, sampler.next_batch()) for n in range(warmup + steps)]
    if feeder is not None:
        source = feeder.batches(keys)
    else:  # prepared before the clock, as a run's data workers prepare them beside the step
        staged = stage_batches(data.images[split.train], protocol, seed, keys, dist)
        source = iter([(n, torch.from_numpy(idx), None if staged is None else staged[k])
                       for k, (n, idx) in enumerate(keys)])  # fmt: skip
    images, empty, waited = 0, 0, 0.0
    for k in range(warmup + steps):
        if k == warmup:  # before the batch is fetched: the window holds `steps` data waits
            step.timer.reset()
            begin = step.timer.now()
            waited = feeder.wait if feeder is not None else 0.0
        n, idx, x = next(source)
        result = step(idx, images=x, step=n)
        if k >= warmup:
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
    } | ({} if feeder is None else {"data_wait_share": round((feeder.wait - waited) / seconds, 4)})


def stage_batches(
    images: Any, protocol: Protocol, seed: int, keys: list, dist: Dist | None = None
) -> list[torch.Tensor] | None:
    """Each batch of `keys` ((step, indices)) read from disk and augmented as a run does,
    up front, so that a timed loop measures the training step and not the data pipeline
    (`cost --pipeline` measures that). None: images in memory without augmentation, which
    the step indexes itself at no cost."""

    train = protocol.augmentation.train
    if not train and not hasattr(images, "load"):
        return None
    augment = TrainPipeline(train, seed) if train else None
    return [load_batch(images, augment, n, idx, dist or SINGLE) for n, idx in keys]


def _training_step(
    backbone: torch.nn.Module, method: Method, images: Any, labels: Any, coarse: Any,
    protocol: Protocol, device: torch.device, seed: int, dist: Dist, split_backward: bool,
) -> Any:  # fmt: skip
    """The step a run trains with: the protocol's optimizer, precision and augmentation."""

    optimizer = make_optimizer(parameter_groups(backbone, method), protocol)
    trainable_modules(backbone, method).train()
    train = protocol.augmentation.train
    return TrainingStep(backbone, method, optimizer, images, labels, coarse, device,
                        split_backward=split_backward, dist=dist, precision=protocol.precision,
                        scaler=grad_scaler(device, protocol.precision),
                        augment=TrainPipeline(train, seed) if train else None)  # fmt: skip
