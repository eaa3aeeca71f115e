"""Proxy-Anchor loss (Kim et al., CVPR 2020): one learned proxy per class, each proxy the anchor.

l = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x, p) - delta)))
  + 1/|P|  sum_{p in P}  log(1 + sum_{x in X_p-} exp( alpha (s(x, p) + delta))),
s the cosine similarity, P+ the proxies of the batch's classes, alpha = 32, delta = 0.1;
proxies train at 100x the learning rate, as in the paper. pytorch-metric-learning's
ProxyAnchorLoss.
"""

from __future__ import annotations

from pytorch_metric_learning import losses

from harness import LR_MULTIPLIER, Float, Method, MethodContext, register_method

from ._pml import pml_method


@register_method(
    "proxy_anchor",
    version=1,
    family="proxies",
    paper="proxy_anchor_cvpr2020",
    search={
        "alpha": Float(8.0, 64.0, log=True),
        "delta": Float(0.0, 0.3),
        "proxy_lr_multiplier": LR_MULTIPLIER,
    },
)
def build(
    ctx: MethodContext,
    *,
    alpha: float = 32.0,
    delta: float = 0.1,
    proxy_lr_multiplier: float = 100.0,
) -> Method:
    loss = losses.ProxyAnchorLoss(ctx.num_classes, ctx.embedding_dim, margin=delta, alpha=alpha)
    return pml_method(ctx, loss, lr_multiplier=proxy_lr_multiplier)
