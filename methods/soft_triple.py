"""SoftTriple loss (Qian et al., ICCV 2019): K learned centers per class.

S_{i,c} = sum_k softmax_k(x_i.w_c^k / gamma) x_i.w_c^k (a soft maximum over the class's
centers); loss = cross-entropy of lambda (S_{i,c} - delta [c = y_i]) plus a regulariser
tau that merges similar centers. K = 10, lambda = 20, gamma = 0.1, delta = 0.01 (tau 0.2 in
pytorch-metric-learning's SoftTripleLoss, which this wraps); the centers train at 100x the
learning rate, as in the paper.
"""

from __future__ import annotations

from pytorch_metric_learning import losses

from harness.method import Method, MethodContext, register_method
from methods._pml import pml_method


@register_method("soft_triple", version=1, family="proxies", paper="softtriple_iccv2019")
def build(
    ctx: MethodContext,
    *,
    centers_per_class: int = 10,
    la: float = 20.0,
    gamma: float = 0.1,
    margin: float = 0.01,
    center_lr_multiplier: float = 100.0,
) -> Method:
    loss = losses.SoftTripleLoss(ctx.num_classes, ctx.embedding_dim, centers_per_class=centers_per_class,
                                 la=la, gamma=gamma, margin=margin)  # fmt: skip
    return pml_method(ctx, loss, lr_multiplier=center_lr_multiplier)
