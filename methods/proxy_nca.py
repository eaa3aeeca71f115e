"""ProxyNCA (Movshovitz-Attias et al., ICCV 2017) and ProxyNCA++ (Teh et al., ECCV 2020).

ProxyNCA: l(x) = -log( exp(-s d(x, p_y)^2) / sum_{z != y} exp(-s d(x, p_z)^2) ), d the
Euclidean distance of L2-normalised embedding and proxies, one proxy per class, s = 1.
pytorch-metric-learning's ProxyNCALoss (its softmax includes the positive proxy in the
denominator, as ProxyNCA++ does).

ProxyNCA++ keeps the loss and changes the training: a low temperature (T = 1/9, s = 9) and
fast-moving proxies (a larger proxy learning rate; 100x here, as Proxy-Anchor's). Its other
changes (global max pooling, layer normalisation of the features, the learning-rate
schedule) concern the backbone and the budget, which the protocol fixes: they are left out,
so `proxy_nca_pp` is ProxyNCA++'s loss-side changes only.
"""

from __future__ import annotations

from pytorch_metric_learning import losses

from harness import LR_MULTIPLIER, Float, Method, MethodContext, register_method

from ._pml import pml_method


@register_method(
    "proxy_nca",
    version=1,
    family="proxies",
    paper="proxy_nca_iccv2017",
    search={
        "softmax_scale": Float(1.0, 32.0, log=True),
        "proxy_lr_multiplier": LR_MULTIPLIER,
    },
)
def build(
    ctx: MethodContext, *, softmax_scale: float = 1.0, proxy_lr_multiplier: float = 1.0
) -> Method:
    """ProxyNCA (Movshovitz-Attias et al. 2017): NCA over one learned proxy per class."""
    loss = losses.ProxyNCALoss(ctx.num_classes, ctx.embedding_dim, softmax_scale=softmax_scale)
    return pml_method(ctx, loss, lr_multiplier=proxy_lr_multiplier)


@register_method(
    "proxy_nca_pp",
    version=1,
    family="proxies",
    paper="proxy_nca_pp_eccv2020",
    search={
        "softmax_scale": Float(1.0, 32.0, log=True),
        "proxy_lr_multiplier": LR_MULTIPLIER,
    },
)
def build_pp(
    ctx: MethodContext, *, softmax_scale: float = 9.0, proxy_lr_multiplier: float = 100.0
) -> Method:
    """ProxyNCA++ (loss side): ProxyNCA at temperature 1/9 with fast-moving proxies."""
    loss = losses.ProxyNCALoss(ctx.num_classes, ctx.embedding_dim, softmax_scale=softmax_scale)
    return pml_method(ctx, loss, lr_multiplier=proxy_lr_multiplier)
