"""Supervised contrastive loss (Khosla et al., NeurIPS 2020), L^sup_out, over the batch.

For every anchor i and positive p of its class:
-log( exp(z_i.z_p / tau) / sum_{a != i} exp(z_i.z_a / tau) ), averaged over the anchor's
positives, then over anchors; z L2-normalised, tau = 0.1. One view per image: the P x K
batch's same-class images are the positives (the paper's second augmented view is not
part of this protocol). pytorch-metric-learning's SupConLoss.

NT-Xent (SimCLR) is not offered as a method: without two augmented views of each image its
positives are the same-class pairs, which makes it SupCon with another reduction.
"""

from __future__ import annotations

from pytorch_metric_learning import losses

from harness import Float, Method, MethodContext, register_method

from ._pml import AllTuples, pml_method


@register_method(
    "supcon",
    version=1,
    family="pairs",
    paper="supcon_neurips2020",
    search={"temperature": Float(0.03, 0.5, log=True)},
)
def build(ctx: MethodContext, *, temperature: float = 0.1) -> Method:
    return pml_method(ctx, losses.SupConLoss(temperature=temperature), AllTuples("pairs"))
