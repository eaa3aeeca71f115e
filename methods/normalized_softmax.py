"""Normalized softmax (Zhai & Wu, BMVC 2019, "Classification is a strong baseline").

Softmax cross-entropy over the cosine similarities of the L2-normalised embedding and the
L2-normalised class weights, divided by a temperature T = 0.05; no margin.
pytorch-metric-learning's NormalizedSoftmaxLoss.
"""

from __future__ import annotations

from pytorch_metric_learning import losses

from harness import LR_MULTIPLIER, Float, Method, MethodContext, register_method

from ._pml import pml_method


@register_method(
    "normalized_softmax",
    version=1,
    family="proxies",
    paper="normsoftmax_bmvc2019",
    search={
        "temperature": Float(0.01, 0.2, log=True),
        "class_lr_multiplier": LR_MULTIPLIER,
    },
)
def build(
    ctx: MethodContext, *, temperature: float = 0.05, class_lr_multiplier: float = 1.0
) -> Method:
    loss = losses.NormalizedSoftmaxLoss(ctx.num_classes, ctx.embedding_dim, temperature=temperature)
    return pml_method(ctx, loss, lr_multiplier=class_lr_multiplier)
