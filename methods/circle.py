"""Circle loss (Sun et al., CVPR 2020), pair form, over every pair of the batch.

L = log(1 + sum_{j in N} exp(gamma a_n (s_n - D_n)) sum_{i in P} exp(-gamma a_p (s_p - D_p))),
a_p = [1 + m - s_p]_+, a_n = [s_n + m]_+, D_p = 1 - m, D_n = m, s the cosine similarity;
m = 0.4, gamma = 80, per anchor, averaged. pytorch-metric-learning's CircleLoss.
"""

from __future__ import annotations

from pytorch_metric_learning import losses

from harness import Float, Method, MethodContext, register_method

from ._pml import AllTuples, pml_method


@register_method(
    "circle",
    version=1,
    family="pairs",
    paper="circle_cvpr2020",
    search={"m": Float(0.1, 0.5), "gamma": Float(16.0, 256.0, log=True)},
)
def build(ctx: MethodContext, *, m: float = 0.4, gamma: float = 80.0) -> Method:
    return pml_method(ctx, losses.CircleLoss(m=m, gamma=gamma), AllTuples("pairs"))
