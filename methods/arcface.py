"""The normalised-softmax family with an additive margin: ArcFace and CosFace.

ArcFace (Deng et al., CVPR 2019): softmax cross-entropy over s cos(theta_j), the target
class's angle widened to theta_y + m; s = 64, m = 28.6 degrees (0.5 rad).
CosFace (Wang et al., CVPR 2018): the target logit s (cos(theta_y) - m); s = 64, m = 0.35.
theta_j is the angle between the embedding and class j's learned weight vector (both
L2-normalised). pytorch-metric-learning's ArcFaceLoss and CosFaceLoss; the class weights
train at the protocol's learning rate times class_lr_multiplier.
"""

from __future__ import annotations

from pytorch_metric_learning import losses

from harness import LR_MULTIPLIER, Float, Method, MethodContext, register_method

from ._pml import pml_method


@register_method(
    "arcface",
    version=1,
    family="proxies",
    paper="arcface_cvpr2019",
    search={
        "margin_degrees": Float(10.0, 45.0),
        "scale": Float(16.0, 64.0, log=True),
        "class_lr_multiplier": LR_MULTIPLIER,
    },
)
def build(
    ctx: MethodContext,
    *,
    margin_degrees: float = 28.6,
    scale: float = 64.0,
    class_lr_multiplier: float = 1.0,
) -> Method:
    """ArcFace (Deng et al. 2019): normalised softmax, additive angular margin 28.6 deg, scale 64."""
    loss = losses.ArcFaceLoss(
        ctx.num_classes, ctx.embedding_dim, margin=margin_degrees, scale=scale
    )
    return pml_method(ctx, loss, lr_multiplier=class_lr_multiplier)


@register_method(
    "cosface",
    version=1,
    family="proxies",
    paper="cosface_cvpr2018",
    search={
        "margin": Float(0.05, 0.5),
        "scale": Float(16.0, 64.0, log=True),
        "class_lr_multiplier": LR_MULTIPLIER,
    },
)
def build_cosface(
    ctx: MethodContext,
    *,
    margin: float = 0.35,
    scale: float = 64.0,
    class_lr_multiplier: float = 1.0,
) -> Method:
    """CosFace (Wang et al. 2018): normalised softmax, additive cosine margin 0.35, scale 64."""
    loss = losses.CosFaceLoss(ctx.num_classes, ctx.embedding_dim, margin=margin, scale=scale)
    return pml_method(ctx, loss, lr_multiplier=class_lr_multiplier)
