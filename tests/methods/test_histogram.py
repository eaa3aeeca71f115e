"""Histogram loss (Ustinova & Lempitsky 2016): by hand, against the reference and
pytorch-metric-learning, and on identical embeddings."""

from __future__ import annotations

import math

import harness.methods  # noqa: F401
import pytest
import torch
from harness.methods.histogram import HistogramLoss
from pytorch_metric_learning import losses

from harness.core import METHODS, Batch, Embedded, HarnessError, MethodContext, all_pairs

# Four unit vectors in 2-D, classes [0, 0, 1, 1]. Cosines: (0,1) 0.8 and (2,3) 0.8 positive;
# (0,2) 0, (0,3) -0.6, (1,2) 0.6, (1,3) -0.48 + 0.48 = 0 negative.
UNIT4 = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]], dtype=torch.float64)


LABELS4 = torch.tensor([0, 0, 1, 1])


def test_histogram_loss_by_hand():
    # Delta = 0.5: nodes t = -1, -0.5, 0, 0.5, 1 (R = 5). S+ = {0.8, 0.8}; S- = {0, -0.6, 0.6, 0}.
    # 0.8 in [0.5, 1]: (1 - 0.8)/0.5 = 0.4 to node 0.5, (0.8 - 0.5)/0.5 = 0.6 to node 1;
    #   twice, / |S+| = 2: h+ = (0, 0, 0, 0.4, 0.6), phi+ = (0, 0, 0, 0.4, 1).
    # 0 sits on node 0: 1 (twice); -0.6: 0.2 to node -1, 0.8 to node -0.5; 0.6: 0.8 to node
    #   0.5, 0.2 to node 1; / |S-| = 4: h- = (0.05, 0.2, 0.5, 0.2, 0.05).
    # L = sum_r h-_r phi+_r = 0.2 * 0.4 + 0.05 * 1 = 0.13
    loss = HistogramLoss(delta=0.5)(Embedded(UNIT4), Batch(LABELS4), all_pairs(LABELS4))
    assert loss.item() == pytest.approx(0.13, abs=1e-6)
    # every positive more similar than every negative, a bin apart: L = 0
    apart = torch.tensor([[1.0, 0.0], [1.0, 0.1], [-1.0, 0.0], [-1.0, -0.1]])
    assert HistogramLoss(0.5)(Embedded(apart), Batch(LABELS4), all_pairs(LABELS4)).item() == 0


def reference_histogram_loss(emb: torch.Tensor, labels: torch.Tensor, delta: float) -> float:
    """The paper's equations one pair at a time, in plain Python."""
    unit = torch.nn.functional.normalize(emb, dim=1).tolist()
    nodes = round(2 / delta) + 1
    hist = {True: [0.0] * nodes, False: [0.0] * nodes}
    count = {True: 0, False: 0}
    for i in range(len(unit)):
        for j in range(i + 1, len(unit)):
            s = sum(a * b for a, b in zip(unit[i], unit[j], strict=True))
            r = math.floor((s + 1) / delta)  # s in [t_r, t_(r+1)]
            positive = bool(labels[i] == labels[j])
            hist[positive][r] += (-1 + (r + 1) * delta - s) / delta
            hist[positive][r + 1] += (s - (-1 + r * delta)) / delta
            count[positive] += 1
    phi, total = 0.0, 0.0
    for r in range(nodes):
        phi += hist[True][r] / count[True]
        total += hist[False][r] / count[False] * phi
    return total


@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence")  # inside the library
def test_histogram_equals_the_reference_and_pytorch_metric_learning_at_the_papers_step():
    torch.manual_seed(1)
    emb = torch.randn(16, 3, dtype=torch.float64)
    labels = torch.arange(4).repeat_interleave(4)
    method = METHODS.get("histogram").build(MethodContext((3,), 3, 4))
    assert method.loss.delta == 0.01  # 201 nodes
    value = method.loss(Embedded(emb), Batch(labels), all_pairs(labels)).item()
    assert value == pytest.approx(reference_histogram_loss(emb, labels, 0.01), rel=1e-9)
    # the library (n_bins = 200 intervals) finds its bins in float32: agreement to ~1e-7
    library = losses.HistogramLoss(n_bins=200)(emb, labels).item()
    assert value == pytest.approx(library, rel=1e-5)
    assert value != pytest.approx(losses.HistogramLoss()(emb, labels).item(), rel=1e-5)  # 100


def test_histogram_survives_identical_embeddings_and_rejects_a_bad_step():
    emb = torch.tensor([[0.3, 0.4], [0.3, 0.4], [0.3, 0.4], [-0.3, 0.4]], requires_grad=True)
    loss = HistogramLoss(0.01)(Embedded(emb), Batch(LABELS4), all_pairs(LABELS4))
    loss.backward()  # s = 1 (or 1 + eps) for the duplicates: on the last node, not off the grid
    assert math.isfinite(loss.item()) and torch.isfinite(emb.grad).all()
    for delta in (0.03, 0.0, -0.5):
        with pytest.raises(HarnessError, match="delta"):
            HistogramLoss(delta)
