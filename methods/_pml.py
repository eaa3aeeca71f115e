"""pytorch-metric-learning (PML) losses and miners as harness methods.

PML's maintainers test its ~35 losses and dozen miners; this file adds only what the harness
needs around them: the miner's index tuples as the harness's typed Pairs / Triplets (so
tuples are counted and cost is measured), the loss under the Method contract, and methods
named `pml:<LossClass>` or `pml:<LossClass>+<MinerClass>` built from any PML class with
keyword overrides from the protocol's `methods:` section (a miner's as `miner_<name>`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from pytorch_metric_learning import losses, miners
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
from torch import nn

from harness import (
    METHODS,
    Batch,
    Embedded,
    EmbeddingHead,
    HarnessError,
    Method,
    MethodContext,
    MethodSpec,
    Mined,
    Pairs,
    Triplets,
    closest,
)

SHAPE_ARGS = ("num_classes", "embedding_size", "descriptors_dim")  # from MethodContext
# Losses that need what a P x K batch of one view does not have (a second augmented view)
NEEDS_TWO_VIEWS = ("VICRegLoss",)


def to_tuples(indices: tuple[torch.Tensor, ...], evaluated: int) -> Pairs | Triplets:
    """PML's (a1, p, a2, n) pairs or (a, p, n) triplets as typed tuples."""
    if len(indices) == 4:
        a1, p, a2, n = indices
        positive = torch.cat([torch.ones_like(a1, dtype=torch.bool),
                              torch.zeros_like(a2, dtype=torch.bool)])  # fmt: skip
        return Pairs(evaluated, torch.cat([a1, a2]), torch.cat([p, n]), positive)
    a, p, n = indices
    return Triplets(evaluated, a, p, n)


def to_indices(mined: Mined | None) -> tuple[torch.Tensor, ...] | None:
    """Typed tuples back into PML's indices_tuple."""
    if isinstance(mined, Pairs):
        pos = mined.positive
        return mined.first[pos], mined.second[pos], mined.first[~pos], mined.second[~pos]
    if isinstance(mined, Triplets):
        return mined.anchor, mined.positive, mined.negative
    return None


class PmlMiner:
    """A PML miner; it computes the batch's whole distance matrix: m(m-1)/2 distances."""

    def __init__(self, miner: miners.BaseMiner) -> None:
        self.miner = miner

    def __call__(self, out: Embedded, batch: Batch) -> Pairs | Triplets:
        m = len(batch.labels)
        return to_tuples(self.miner(out.embedding, batch.labels), m * (m - 1) // 2)


class AllTuples:
    """What a PML loss does with no miner (every pair, or every triplet, of the batch), made
    explicit so the harness counts them; from the labels alone: no distance evaluated."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, out: Embedded, batch: Batch) -> Pairs | Triplets:
        if self.kind == "pairs":
            return to_tuples(lmu.get_all_pairs_indices(batch.labels), 0)
        return to_tuples(lmu.get_all_triplets_indices(batch.labels), 0)


class PmlLoss(nn.Module):
    """A PML loss under the Method contract; its parameters (proxies, class weights, learned
    betas) train with the backbone."""

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, out: Embedded, batch: Batch, mined: Mined | None) -> torch.Tensor:
        return self.loss(out.embedding, batch.labels, to_indices(mined))


def pml_method(
    ctx: MethodContext, loss: nn.Module, miner: Any = None, lr_multiplier: float = 1.0
) -> Method:
    """A Method around a PML loss: a PML miner, or an AllTuples / None miner as is."""
    if miner is not None and not isinstance(miner, AllTuples):
        miner = PmlMiner(miner)
    return Method(head=EmbeddingHead(ctx.feature_dim, ctx.embedding_dim), loss=PmlLoss(loss),
                  miner=miner, loss_lr_multiplier=lr_multiplier)  # fmt: skip


def _classes(module: Any, suffix: str) -> dict[str, type]:
    """PML's concrete classes by name: losses or miners with a default constructor (their
    only required arguments are the ones MethodContext fills in)."""
    found = {}
    for name, cls in vars(module).items():
        if not (inspect.isclass(cls) and name.endswith(suffix)) or name in NEEDS_TWO_VIEWS:
            continue
        if name.startswith(("Base", "Generic")):
            continue
        params = inspect.signature(cls.__init__).parameters.values()
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        if all(
            p.name in ("self", *SHAPE_ARGS) or p.kind not in kinds or p.default is not p.empty
            for p in params
        ):
            found[name] = cls
    return found


def _keywords(cls: type, prefix: str = "") -> dict[str, Any]:
    """The class's named keyword arguments and defaults (not **kwargs, not the shape ones)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {f"{prefix}{p.name}": p.default
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind in kinds and p.name not in ("self", *SHAPE_ARGS)}  # fmt: skip


def _lookup(name: str, classes: dict[str, type], kind: str) -> type:
    if name not in classes:
        raise HarnessError(f"pytorch-metric-learning has no {kind} {name!r} with a default "
                           f"constructor{closest(name, list(classes))}; see `harness ls`")  # fmt: skip
    return classes[name]


def _miner_family(miner: Any) -> str:
    """Pairs or triplets: asked of the miner on a tiny batch, with the global RNG untouched
    (a sampling miner draws from it; a run's seeded stream must not depend on this)."""
    with torch.random.fork_rng(devices=[]):
        gen = torch.Generator().manual_seed(0)
        probe = miner(torch.randn(12, 8, generator=gen), torch.arange(3).repeat_interleave(4))
    return "pairs" if len(probe) == 4 else "triplets"


def _loss_family(loss_cls: type) -> tuple[str, Any]:
    """The family of a PML loss used without a miner, and the harness-side miner for it."""
    params = inspect.signature(loss_cls.__init__).parameters.values()
    if any(p.name in SHAPE_ARGS and p.default is p.empty for p in params):
        return "proxies", None  # one weight vector (or several) per class
    if issubclass(loss_cls, losses.GenericPairLoss):
        return "pairs", AllTuples("pairs")
    if "convert_to_triplets" in inspect.getsource(loss_cls):
        return "triplets", AllTuples("triplets")
    return "batch", None


def resolve_pml(rest: str) -> MethodSpec:
    """`pml:<LossClass>[+<MinerClass>]` as a method: the classes' named keyword arguments
    are its hyperparameters (miner ones as miner_<name>), plus loss_lr_multiplier."""
    loss_name, _, miner_name = rest.partition("+")
    loss_cls = _lookup(loss_name, _classes(losses, "Loss"), "loss")
    miner_cls = _lookup(miner_name, _classes(miners, "Miner"), "miner") if miner_name else None
    defaults = {**_keywords(loss_cls), **(_keywords(miner_cls, "miner_") if miner_cls else {}),
                "loss_lr_multiplier": 1.0}  # fmt: skip
    # the family and, with no PML miner, the harness-side one: read once, not per build
    family, own_miner = (_miner_family(miner_cls()), None) if miner_cls else _loss_family(loss_cls)

    def build(ctx: MethodContext, **hyper: Any) -> Method:
        hyper = {**defaults, **hyper}
        lr = hyper.pop("loss_lr_multiplier")
        loss_kw = {k: v for k, v in hyper.items() if not k.startswith("miner_")}
        miner_kw = {k[6:]: v for k, v in hyper.items() if k.startswith("miner_")}
        shape = {"num_classes": ctx.num_classes, "embedding_size": ctx.embedding_dim,
                 "descriptors_dim": ctx.embedding_dim}  # fmt: skip
        wanted = set(inspect.signature(loss_cls.__init__).parameters)
        loss = loss_cls(**{k: v for k, v in shape.items() if k in wanted}, **loss_kw)
        miner = miner_cls(**miner_kw) if miner_cls else own_miner
        return pml_method(ctx, loss, miner, lr)

    params = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v)
              for k, v in defaults.items()]  # fmt: skip
    build.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_ONLY), *params]
    )
    summary = f"pytorch-metric-learning's {loss_name}" + (
        f" with {miner_name}" if miner_name else ""
    )
    return MethodSpec(f"pml:{rest}", 1, build, family, "pytorch-metric-learning", summary=summary)


def pml_listing() -> list[str]:
    """What `pml:` builds: every loss class, and every miner class as `+<MinerClass>`."""
    return sorted(_classes(losses, "Loss")) + [f"+{m}" for m in sorted(_classes(miners, "Miner"))]


METHODS.add_resolver("pml", resolve_pml, pml_listing)
