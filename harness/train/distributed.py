"""One run on several processes (torchrun): each rank embeds 1/N of every P x K batch, the
embeddings are all-gathered so that the miner and the loss see the whole batch exactly as in
one process, and gradients are averaged.

Why not pytorch-metric-learning's DistributedLossWrapper: its gathered copies carry no
gradient to the other ranks' shards (its issues #363, #542, #712). Here every collective on
the training path has an exact adjoint, so the run optimises J = sum over ranks of each
rank's loss; every rank computes the same full-batch loss L, so J = N L, and the averaged
gradient is dL/dtheta, the one-process gradient (tests/harness/test_distributed.py checks
that for every registered method):

- `gather`: all_gather forward; backward all-reduces the full gradient and keeps this rank's
  slice (gloo has no reduce-scatter, and torch.distributed.nn's all_gather needs all-to-all).
- `SyncBatchNorm`: batch statistics over the whole batch (torch's SyncBatchNorm is CUDA-only).
- `average_gradients`: DDP's all-reduce of every gradient divided by N, done after backward
  by the step, so parameters used after the gather (proxies, a PDDM unit) are averaged like
  the backbone's, and parameters a step leaves without gradient count as zero.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from harness.core import Embedded, HarnessError


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.rank, ctx.n = dist.get_rank(), x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        out = x.contiguous().clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


def gather(x: torch.Tensor) -> torch.Tensor:
    """Every rank's shard, concatenated in rank order; differentiable (see the module doc)."""
    if x.is_floating_point():
        return _Gather.apply(x)
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def gather_embedded(out: Embedded) -> Embedded:
    return Embedded(gather(out.embedding), {k: gather(v) for k, v in out.extras.items()})


class SyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm over the whole distributed batch, on any backend; the same state_dict keys
    as nn.BatchNorm1d/2d, so checkpoints move between one process and several. Statistics are
    summed in float32 whatever autocast does (CPU autocast would sum fp16 and overflow)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return self._after(super().forward(x))
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        count = x.numel() // x.shape[1] * dist.get_world_size()
        xf = x.to(torch.promote_types(x.dtype, torch.float32))  # float64 stays float64
        mean = _AllReduce.apply(xf.sum(dims)) / count
        centred = xf - mean.view(shape)
        var = _AllReduce.apply(centred.pow(2).sum(dims)) / count
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = (
                    self.momentum
                    if self.momentum is not None
                    else 1 / int(self.num_batches_tracked)
                )
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach() * count / (count - 1), alpha=m)
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return self._after(y.to(x.dtype))

    def _after(self, y: torch.Tensor) -> torch.Tensor:
        return y

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")


class SyncBatchNormAct(SyncBatchNorm):
    """timm's BatchNormAct2d (batch norm, then its dropout and activation) over the whole
    distributed batch; same state_dict keys as the module it replaces."""

    def __init__(self, source: nn.Module) -> None:
        super().__init__(source.num_features, source.eps, source.momentum, source.affine,
                         source.track_running_stats)  # fmt: skip
        self.drop, self.act = source.drop, source.act

    def _after(self, y: torch.Tensor) -> torch.Tensor:
        return self.act(self.drop(y))


_PLAIN_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _synchronised(child: nn.Module) -> nn.Module:
    """The SyncBatchNorm that computes what `child` computes, over the whole batch."""
    if type(child) in _PLAIN_BATCHNORM:
        return SyncBatchNorm(child.num_features, child.eps, child.momentum, child.affine,
                             child.track_running_stats)  # fmt: skip
    if type(child).__name__ == "BatchNormAct2d" and hasattr(child, "act"):  # timm's
        return SyncBatchNormAct(child)
    raise HarnessError(
        f"the backbone's {type(child).__module__}.{type(child).__name__} is a BatchNorm the "
        "harness cannot synchronise across processes; run it in one process, or set "
        "backbone.frozen_batchnorm: true"
    )


def convert_batchnorm(module: nn.Module) -> nn.Module:
    """Swap every trainable BatchNorm for SyncBatchNorm in place, keeping its state (frozen
    BatchNorm, in eval mode for good, is left alone: it has no batch statistics)."""
    for name, child in module.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(
            child, SyncBatchNorm
        ):
            if "train" in vars(child):  # freeze_batchnorm pinned it to eval mode
                continue
            sync = _synchronised(child)
            sync.load_state_dict(child.state_dict())
            sync.to(next(child.buffers(), torch.zeros(0)).device)
            sync.train(child.training)
            setattr(module, name, sync)
        else:
            convert_batchnorm(child)
    return module


def check_same_step(step: int, device: torch.device) -> None:
    """Raise on every rank unless all ranks resumed at the same step: a node that cannot see
    rank 0's checkpoint would start from step 0 and pair its collectives with other steps."""
    t = torch.tensor([step, -step], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    high, low = int(t[0]), -int(t[1])
    if high != low:
        raise HarnessError(
            f"the processes resumed at different steps ({low} and {high}): every node must "
            "read rank 0's checkpoint; put --results-dir on a file system all nodes share"
        )


def average_gradients(params: Iterable[nn.Parameter]) -> None:
    """DDP's gradient average: one all-reduce over all gradients. A parameter without a
    gradient keeps none (as in one process, where the optimizer then skips it): every rank
    computes the same full-batch loss, so the same parameters have gradients on every rank."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n
