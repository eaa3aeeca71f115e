"""SoftTriple loss (Qian et al., ICCV 2019): K learned centers per class.

S_{i,c} = sum_k softmax_k(x_i.w_c^k / gamma) x_i.w_c^k (Eq. 7, a soft maximum over the
class's centers); loss = cross-entropy of lambda (S_{i,c} - delta [c = y_i]) (Eq. 8) plus
tau R / (C K (K - 1)), R = sum_c sum_{t < t'} sqrt(2 - 2 w_c^t.w_c^t') merging similar
centers (Eq. 13; + 1e-5 under the root, as the authors' code). K = 10, lambda = 20,
gamma = 0.1, delta = 0.01, tau = 0.2; centers train at 100x the learning rate, as in the
paper. pytorch-metric-learning's SoftTripleLoss computes Eq. 8 but has no R: it is added here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses
from torch import nn

from harness import (
    LR_MULTIPLIER,
    Batch,
    Embedded,
    Float,
    Method,
    MethodContext,
    Mined,
    register_method,
)

from ._pml import PmlLoss, pml_method


class CenterRegularised(nn.Module):
    """Eq. 8 from pytorch-metric-learning plus the paper's center regulariser (Eq. 13)."""

    def __init__(self, inner: PmlLoss, tau: float, num_classes: int, per_class: int) -> None:
        super().__init__()
        self.inner, self.tau, self.num_classes, self.per_class = inner, tau, num_classes, per_class

    def forward(self, out: Embedded, batch: Batch, mined: Mined | None) -> torch.Tensor:
        c, k = self.num_classes, self.per_class
        w = F.normalize(self.inner.loss.fc, dim=0).T.reshape(c, k, -1)  # [C, K, dim]
        upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=w.device), diagonal=1)
        reg = torch.sqrt(2.0 + 1e-5 - 2.0 * (w @ w.transpose(1, 2))[:, upper]).sum()
        return self.inner(out, batch, mined) + self.tau * reg / (c * k * (k - 1))


@register_method(
    "soft_triple",
    version=1,
    family="proxies",
    paper="softtriple_iccv2019",
    search={
        "la": Float(5.0, 50.0, log=True),
        "gamma": Float(0.03, 0.3, log=True),
        "margin": Float(0.0, 0.1),
        "center_lr_multiplier": LR_MULTIPLIER,
    },
)
def build(
    ctx: MethodContext,
    *,
    centers_per_class: int = 10,
    la: float = 20.0,
    gamma: float = 0.1,
    margin: float = 0.01,
    tau: float = 0.2,
    center_lr_multiplier: float = 100.0,
) -> Method:
    loss = losses.SoftTripleLoss(ctx.num_classes, ctx.embedding_dim, centers_per_class=centers_per_class,
                                 la=la, gamma=gamma, margin=margin)  # fmt: skip
    method = pml_method(ctx, loss, lr_multiplier=center_lr_multiplier)
    method.loss = CenterRegularised(method.loss, tau, ctx.num_classes, centers_per_class)
    return method
