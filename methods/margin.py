"""Margin loss with distance-weighted sampling (Wu et al., ICCV 2017, "Sampling matters").

Sampling: for each anchor-positive pair a negative drawn with probability proportional to
the inverse of the density of pairwise distances on the unit sphere, q(d)^-1, with
d clipped below at 0.5 and negatives beyond 1.4 (zero loss) left out.
Loss per triplet: [alpha + (D_ap - beta_y)]_+ + [alpha - (D_an - beta_y)]_+, alpha = 0.2,
beta learned per class from 1.2 (nu = 0: no regulariser on beta); the terms summed over the
triplets and divided by the number of non-zero terms. pytorch-metric-learning's
DistanceWeightedMiner and MarginLoss.
"""

from __future__ import annotations

from pytorch_metric_learning import losses, miners

from harness import LR_MULTIPLIER, Float, Method, MethodContext, register_method

from ._pml import pml_method


@register_method(
    "margin",
    version=1,
    family="triplets",
    paper="sampling_matters_iccv2017",
    search={
        "margin": Float(0.05, 0.5),
        "beta": Float(0.6, 1.6),
        "beta_lr_multiplier": LR_MULTIPLIER,
    },
)
def build(
    ctx: MethodContext,
    *,
    margin: float = 0.2,
    beta: float = 1.2,
    nu: float = 0.0,
    cutoff: float = 0.5,
    nonzero_loss_cutoff: float = 1.4,
    beta_lr_multiplier: float = 1.0,
) -> Method:
    loss = losses.MarginLoss(
        margin=margin, nu=nu, beta=beta, learn_beta=True, num_classes=ctx.num_classes
    )
    miner = miners.DistanceWeightedMiner(cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff)
    return pml_method(ctx, loss, miner, lr_multiplier=beta_lr_multiplier)
