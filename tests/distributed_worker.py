"""Run by torchrun in tests/harness/test_distributed.py (2 processes, gloo, CPU).

`grads OUT NAME[,NAME...]`: for each method, one training step on the same P x K batch with
the batch split over the ranks; rank 0 also takes the step in one process (no collectives)
and saves both gradient sets to OUT/float32.pt (what trains) and again, with float64 as the
default dtype (exact algebra: float32 rounding would blur small errors), to OUT/float64.pt.
`curve OUT NAME STEPS`: STEPS steps of harness.train on the smoke data; rank 0 saves the
per-step losses (one epoch per step) and the final weights, as does a one-process run.
`batchnorm OUT`: a network with plain and timm (BatchNormAct2d) BatchNorm, converted, on
each rank's half of a batch; rank 0 saves the gathered outputs (float32 and fp16 autocast)
and the one-process outputs on the whole batch.
`mismatch OUT NAME`: rank 0 resumes from a checkpoint that rank 1 cannot see; rank 0 saves
each rank's error.
"""

from __future__ import annotations

import dataclasses
import sys

import harness.methods  # noqa: F401
import numpy as np
import torch
import torch.distributed as dist

from harness.core import (
    SINGLE,
    Dist,
    RunContext,
    current,
    init_from_env,
    load_protocol,
    protocol_hyperparameters,
)
from harness.data import PKSampler
from harness.train import (
    Checkpoint,
    EpochHooks,
    TrainingSet,
    TrainingStep,
    build_model,
    convert_batchnorm,
    gather,
    train,
    trainable_modules,
)

torch.set_num_threads(1)
PROTOCOL = load_protocol("smoke")
CLASSES, PER_CLASS, SIZE = 8, 6, 16
g = torch.Generator().manual_seed(0)
IMAGES = torch.randint(0, 256, (CLASSES * PER_CLASS, 1, SIZE, SIZE), generator=g, dtype=torch.uint8)
LABELS = np.repeat(np.arange(CLASSES), PER_CLASS)
COARSE = LABELS // 2  # 4 coarse classes of 2 fine ones (the quadruplet methods need them)
DATA = TrainingSet(IMAGES, LABELS, COARSE)
CPU = torch.device("cpu")


def model(name: str):
    hyper = protocol_hyperparameters(PROTOCOL, name)
    return build_model(RunContext(PROTOCOL, 0, CPU), name, hyper, in_channels=1,
                       num_classes=CLASSES, num_coarse_classes=4)  # fmt: skip


def step_grads(name: str, d: Dist, sync_bn: bool = True) -> dict[str, torch.Tensor]:
    m = model(name)
    if d.world_size > 1 and sync_bn:
        convert_batchnorm(m.backbone)
        convert_batchnorm(m.method.head)
    modules = trainable_modules(m.backbone, m.method)
    opt = torch.optim.SGD(modules.parameters(), lr=0.0)
    step = TrainingStep(m, opt, DATA, RunContext(PROTOCOL, 0, CPU, dist=d))
    modules.train()
    idx = torch.from_numpy(PKSampler(LABELS, 4, 4, seed=0).next_batch())
    step(idx, check_indices=True)
    return {k: p.grad.clone() for k, p in modules.named_parameters() if p.grad is not None}


def grads(out: str, names: str) -> None:
    """Both dtypes in one launch (a torchrun start costs seconds); float32 first, as a fresh
    process has it."""
    from pathlib import Path

    for dtype in (torch.float32, torch.float64):
        torch.set_default_dtype(dtype)
        grads_in_default_dtype(str(Path(out) / f"{str(dtype).removeprefix('torch.')}.pt"), names)
    torch.set_default_dtype(torch.float32)


def grads_in_default_dtype(out: str, names: str) -> None:
    here = current()
    saved = {}
    for name in names.split(","):
        gathered = step_grads(name, here)
        if here.is_main:
            saved[name] = {"distributed": gathered, "single": step_grads(name, SINGLE)}
        dist.barrier()
    # the control: BatchNorm statistics per shard (what plain DDP does) must be caught
    unsynced = step_grads("contrastive", here, sync_bn=False)
    if here.is_main:
        saved["contrastive"]["unsynced_batchnorm"] = unsynced
        torch.save(saved, out)


def curve(out: str, name: str, steps: str) -> None:
    here = current()
    protocol = dataclasses.replace(
        PROTOCOL,
        budget=dataclasses.replace(PROTOCOL.budget, epochs=0, steps=int(steps)),
    )
    runs = {}
    for label, context in (("distributed", here), ("single", SINGLE)):
        if label == "single" and not here.is_main:
            break
        if label == "single":
            dist.destroy_process_group()  # train() sees no process group: one process
        m = model(name)
        stats = train(RunContext(protocol, 0, CPU), m, DATA)
        state = {k: v.clone() for k, v in m.backbone.state_dict().items()}
        runs[label] = {"losses": stats.epoch_loss, "state": state, "world": context.world_size}
        if label == "distributed":
            dist.barrier()  # both ranks have finished before rank 0 leaves the group
    if here.is_main:
        torch.save(runs, out)


def resume(out: str, name: str, steps: str) -> None:
    """An uninterrupted 2-process run, and one interrupted after epoch 2 and resumed from
    the checkpoint rank 0 wrote; rank 0 saves both."""
    from pathlib import Path

    protocol = dataclasses.replace(
        PROTOCOL, budget=dataclasses.replace(PROTOCOL.budget, epochs=0, steps=int(steps))
    )
    ckpt = Path(out).with_suffix(".ckpt")

    def run(**options):
        m = model(name)
        stats = train(RunContext(protocol, 0, CPU), m, DATA, **options)
        return stats, {k: v.clone() for k, v in m.backbone.state_dict().items()}

    whole, whole_state = run()

    def crash(epoch: int) -> None:
        if epoch == 2:
            raise KeyboardInterrupt

    try:
        run(checkpoint=Checkpoint(ckpt, "a"), hooks=EpochHooks(on_epoch_end=crash))
    except KeyboardInterrupt:
        pass
    dist.barrier()  # rank 0 has written the checkpoint before any rank reads it
    resumed, resumed_state = run(checkpoint=Checkpoint(ckpt, "a"))
    if current().is_main:
        torch.save({"whole": (whole.epoch_loss, whole_state), "from": resumed.resumed_from_step,
                    "resumed": (resumed.epoch_loss, resumed_state)}, out)  # fmt: skip


def batchnorm(out: str) -> None:
    from timm.layers import BatchNormAct2d

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), BatchNormAct2d(8, act_layer=torch.nn.ReLU),
        torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8),
    )  # fmt: skip
    x = torch.randn(8, 3, 12, 12, generator=torch.Generator().manual_seed(1)) * 50
    whole = net.train()(x).detach()
    here = current()
    convert_batchnorm(net)
    part = x[here.shard(len(x))]
    split = gather(net(part)).detach()
    with torch.autocast("cpu", dtype=torch.float16):
        half = gather(net(part)).detach()
    if here.is_main:
        torch.save({"whole": whole, "split": split, "fp16": half.float(),
                    "types": [type(m).__name__ for m in net]}, out)  # fmt: skip


def mismatch(out: str, name: str) -> None:
    from pathlib import Path

    from harness.core import HarnessError

    protocol = dataclasses.replace(
        PROTOCOL, budget=dataclasses.replace(PROTOCOL.budget, epochs=0, steps=6)
    )
    here = current()
    ckpt = Path(out).with_suffix(f".{here.rank}.ckpt")  # one folder per node, not shared

    def crash(epoch: int) -> None:
        if epoch == 2:
            raise KeyboardInterrupt

    def run(path, **options):
        train(RunContext(protocol, 0, CPU), model(name), DATA, checkpoint=Checkpoint(path, "a"),
              **options)  # fmt: skip

    try:
        run(ckpt, hooks=EpochHooks(on_epoch_end=crash))
    except KeyboardInterrupt:
        pass
    dist.barrier()
    if here.rank == 1:
        ckpt.unlink(missing_ok=True)  # rank 0 wrote it, and only rank 0's node has it
    try:
        run(Path(out).with_suffix(".0.ckpt") if here.is_main else ckpt)
        error = ""
    except HarnessError as exc:
        error = str(exc)
    errors = [None, None]
    dist.all_gather_object(errors, error)
    if here.is_main:
        torch.save(errors, out)


if __name__ == "__main__":
    init_from_env(torch.device("cpu"))
    modes = {"grads": grads, "curve": curve, "resume": resume, "batchnorm": batchnorm,
             "mismatch": mismatch}  # fmt: skip
    modes[sys.argv[1]](*sys.argv[2:])
    if dist.is_initialized():
        # leave together, as harness.cli.run does: a rank that tore its group down while rank
        # 0 still saved was seen to abort rank 0 ("terminate called without an active
        # exception"); curve's rank 0 has left the group already, and waits for nobody
        if sys.argv[1] != "curve":
            dist.barrier()
        dist.destroy_process_group()
