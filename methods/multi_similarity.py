"""Multi-Similarity loss with its miner (Wang et al., CVPR 2019).

Mining (epsilon = 0.1): a negative pair is kept if S_ik > min_{y_k = y_i} S_ik - epsilon, a
positive pair if S_ij < max_{y_k != y_i} S_ik + epsilon. Loss per anchor, cosine S:
1/alpha log(1 + sum_P exp(-alpha (S_ik - lambda))) + 1/beta log(1 + sum_N exp(beta (S_ik - lambda))),
alpha = 2, beta = 50, lambda = 0.5, averaged over anchors. pytorch-metric-learning's
MultiSimilarityMiner and MultiSimilarityLoss.
"""

from __future__ import annotations

from pytorch_metric_learning import losses, miners

from harness import Float, Method, MethodContext, register_method

from ._pml import pml_method


@register_method(
    "multi_similarity",
    version=1,
    family="pairs",
    paper="multi_similarity_cvpr2019",
    search={
        "alpha": Float(0.5, 8.0, log=True),
        "beta": Float(10.0, 100.0, log=True),
        "base": Float(0.3, 0.8),
        "epsilon": Float(0.01, 0.3, log=True),
    },
)
def build(
    ctx: MethodContext,
    *,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
    epsilon: float = 0.1,
) -> Method:
    loss = losses.MultiSimilarityLoss(alpha=alpha, beta=beta, base=base)
    return pml_method(ctx, loss, miners.MultiSimilarityMiner(epsilon=epsilon))
