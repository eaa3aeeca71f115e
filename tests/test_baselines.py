"""N-pairs (Sohn 2016), histogram loss (Ustinova & Lempitsky 2016), binomial deviance (Yi et al.
2014) and triplet + global loss (Kumar B G et al. 2016): each loss against a value worked by
hand from its paper's formula, the tuples each miner builds, and a short training."""

import math

import pytest
import torch
from pytorch_metric_learning import distances, losses
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

import methods  # noqa: F401
from harness.errors import HarnessError
from harness.method import METHODS, Batch, Embedded, MethodContext, Triplets, all_pairs
from methods.binomial_deviance import binomial_deviance
from methods.histogram import HistogramLoss
from methods.npairs import npair_tuples, npairs_loss
from methods.triplet import TripletLoss
from methods.triplet_global import TripletGlobalLoss, all_triplets

BASELINES = ["npairs", "histogram", "binomial_deviance", "triplet_global"]

# Four unit vectors in 2-D, classes [0, 0, 1, 1]. Cosines: (0,1) 0.8 and (2,3) 0.8 positive;
# (0,2) 0, (0,3) -0.6, (1,2) 0.6, (1,3) -0.48 + 0.48 = 0 negative.
UNIT4 = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]], dtype=torch.float64)
LABELS4 = torch.tensor([0, 0, 1, 1])


# --- N-pairs ------------------------------------------------------------------------------------

# P = 2 classes x K = 4, interleaved: class 0 at 0, 2, 4, 6 and class 1 at 1, 3, 5, 7.
NPAIR_EMB = torch.tensor(
    [[1, 0], [0, 1], [1, 1], [-1, 1], [2, 0], [0, 1], [1, 0], [0, 2]], dtype=torch.float64
)
NPAIR_LABELS = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])


def test_npair_miner_cuts_each_class_into_consecutive_pairs():
    # class 0: (0, 2), (4, 6); class 1: (1, 3), (5, 7). Tuple 0 = the first pair of each
    # class, tuple 1 = the second: N = 2 per tuple, 2 x 2^2 = 8 inner products.
    pairs = npair_tuples(Embedded(NPAIR_EMB), Batch(NPAIR_LABELS))
    assert list(zip(pairs.first.tolist(), pairs.second.tolist(), strict=True)) == [
        (0, 2), (1, 3), (4, 6), (5, 7)
    ]  # fmt: skip
    assert pairs.evaluated == 8 and bool(pairs.positive.all())
    # an odd class size leaves its last image out; a singleton class gives no pair
    odd = npair_tuples(Embedded(NPAIR_EMB[:7]), Batch(torch.tensor([0, 0, 0, 1, 1, 2, 2])))
    assert list(zip(odd.first.tolist(), odd.second.tolist(), strict=True)) == [
        (0, 1), (3, 4), (5, 6)
    ]  # fmt: skip
    assert npair_tuples(Embedded(NPAIR_EMB[:2]), Batch(torch.tensor([0, 1]))).count() == 0


def test_npairs_loss_matches_sohn_by_hand():
    # Tuple 0: anchors f0 = (1,0), f1 = (0,1); positives f2 = (1,1), f3 = (-1,1).
    #   f0: f0.f2 = 1, f0.f3 = -1 -> log(1 + e^(-1-1)) = log(1 + e^-2)
    #   f1: f1.f3 = 1, f1.f2 = 1  -> log(1 + e^0) = log 2
    # Tuple 1: anchors f4 = (2,0), f5 = (0,1); positives f6 = (1,0), f7 = (0,2).
    #   f4: f4.f6 = 2, f4.f7 = 0 -> log(1 + e^-2);  f5: f5.f7 = 2, f5.f6 = 0 -> log(1 + e^-2)
    # (f4 against tuple 0's positive f2 would give f4.f2 = 2: tuples must not mix.)
    # L = (3 log(1 + e^-2) + log 2) / 4 = 0.2717...
    # Regulariser: anchors' squared norms 1, 1, 4, 1 (mean 7/4), positives' 2, 2, 1, 4
    # (mean 9/4): 0.002 / 4 * (7/4 + 9/4) = 0.002.
    n_pair = (3 * math.log(1 + math.exp(-2)) + math.log(2)) / 4
    pairs = npair_tuples(Embedded(NPAIR_EMB), Batch(NPAIR_LABELS))
    a, p = NPAIR_EMB[pairs.first], NPAIR_EMB[pairs.second]
    anchor_labels = NPAIR_LABELS[pairs.first]
    assert npairs_loss(a, p, anchor_labels, 0.0).item() == pytest.approx(n_pair, rel=1e-12)
    assert npairs_loss(a, p, anchor_labels, 0.002).item() == pytest.approx(n_pair + 0.002)
    method = METHODS.get("npairs").build(MethodContext((2,), 2, 2))
    assert method.loss(Embedded(NPAIR_EMB), Batch(NPAIR_LABELS), pairs).item() == pytest.approx(
        n_pair + 0.002
    )


def test_npairs_equals_pytorch_metric_learning_on_one_pair_per_class():
    """With K = 2 there is one tuple, which is what NPairsLoss computes, once told not to
    normalise the embeddings (its default DotProductSimilarity does, unlike the paper)."""
    torch.manual_seed(0)
    emb = torch.randn(12, 5, dtype=torch.float64)
    labels = torch.arange(6).repeat_interleave(2)
    pairs = npair_tuples(Embedded(emb), Batch(labels))
    ours = npairs_loss(emb[pairs.first], emb[pairs.second], labels[pairs.first], 0.0)
    raw = losses.NPairsLoss(distance=distances.DotProductSimilarity(normalize_embeddings=False))
    assert ours.item() == pytest.approx(raw(emb, labels).item(), rel=1e-9)


def test_npairs_head_is_not_normalised():
    method = METHODS.get("npairs").build(MethodContext((4,), 3, 2))
    out = method.head([torch.full((2, 4), 10.0)])
    assert out.embedding.norm(dim=1).max() > 1.5  # a plain fc layer, as in the paper


# --- histogram loss -------------------------------------------------------------------------------


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


# --- binomial deviance ------------------------------------------------------------------------------


def test_binomial_deviance_by_hand():
    # alpha = 2, beta = 0.5. Positives (m = 1), s = 0.8 twice: log(1 + e^(-2 * 0.3)) = 0.437488
    # each; mean 0.437488. Negatives (m = -C = -25): log(1 + e^(50 (s - 0.5))):
    #   s = 0: log(1 + e^-25) = 1.3888e-11 (twice); s = -0.6: ~0; s = 0.6: log(1 + e^5) = 5.006715
    #   mean over |N| = 4: 1.251679.  L = 0.437488 + 1.251679 = 1.689167
    pairs = all_pairs(LABELS4)
    value = binomial_deviance(UNIT4, pairs, alpha=2.0, beta=0.5, cost=25.0)
    assert value.item() == pytest.approx(1.689167, abs=1e-6)
    # C = 1: negatives log(1 + e^(2 (s - 0.5))) = 0.313262, 0.105083, 0.798139, 0.313262;
    # mean 0.382436, L = 0.819924
    value = binomial_deviance(UNIT4, pairs, alpha=2.0, beta=0.5, cost=1.0)
    assert value.item() == pytest.approx(0.819924, abs=1e-6)
    # cosine similarity: the scale of the embedding does not matter
    scaled = binomial_deviance(UNIT4 * 7, pairs, alpha=2.0, beta=0.5, cost=1.0)
    assert scaled.item() == pytest.approx(0.819924, abs=1e-6)


def test_binomial_deviance_weights_each_side_by_its_count():
    # doubling the negatives (two more copies of class 1's points as class 2) changes |N| but
    # W = 1/|N| keeps each side a mean: one positive pair (0,1) s = 0.8 plus (2,3), (4,5) at 0.8
    emb = torch.cat([UNIT4, UNIT4[2:]])
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    pairs = all_pairs(labels)
    value = binomial_deviance(emb, pairs, alpha=2.0, beta=0.5, cost=1.0).item()
    unit = torch.nn.functional.normalize(emb, dim=1)
    s = (unit[pairs.first] * unit[pairs.second]).sum(1)
    pos = torch.log1p(torch.exp(-2 * (s[pairs.positive] - 0.5))).mean()
    neg = torch.log1p(torch.exp(2 * (s[~pairs.positive] - 0.5))).mean()
    assert value == pytest.approx((pos + neg).item())
    # a batch of one class has no negatives: only the positive mean, still differentiable
    one = all_pairs(torch.zeros(2, dtype=torch.long))
    x = UNIT4[:2].clone().requires_grad_()
    value = binomial_deviance(x, one, alpha=2.0, beta=0.5, cost=25.0)
    value.backward()
    assert value.item() == pytest.approx(math.log(1 + math.exp(-0.6)))


# --- triplet + global loss --------------------------------------------------------------------------


def test_triplet_global_by_hand():
    # f0 = (1,0), f1 = (0.6,0.8) [class 0]; f2 = (0,1), f3 = (-1,0) [class 1]. Squared distances
    # 2 - 2 cos: D01 = 0.8, D23 = 2; D02 = 2, D03 = 4, D12 = 0.4, D13 = 3.2.
    emb = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    out, batch = Embedded(emb), Batch(LABELS4)
    triplets = all_triplets(out, batch)
    assert triplets.count() == 8 and triplets.evaluated == 6  # 4 anchors x 1 positive x 2 negatives
    library = lmu.get_all_triplets_indices(LABELS4)
    assert sorted(zip(*[t.tolist() for t in triplets.indices()], strict=True)) == sorted(
        zip(*[t.tolist() for t in library], strict=True)
    )
    # (a,p,n): D_ap, D_an, [D_ap - D_an + 0.2]_+
    # (0,1,2) .8, 2 -> 0 | (0,1,3) .8, 4 -> 0 | (1,0,2) .8, .4 -> 0.6 | (1,0,3) .8, 3.2 -> 0
    # (2,3,0) 2, 2 -> 0.2 | (2,3,1) 2, .4 -> 1.8 | (3,2,0) 2, 4 -> 0 | (3,2,1) 2, 3.2 -> 0
    # L_t = 2.6 / 8 = 0.325
    # d+ = D_ap / 4 = 0.2 (x4), 0.5 (x4): mean 0.35, var 0.15^2 = 0.0225
    # d- = D_an / 4 = 0.5, 1, 0.1, 0.8 (x2): mean 0.6, var (0.25 + 1 + 0.01 + 0.64)/4 - 0.36 = 0.115
    # L_g = 0.0225 + 0.115 + 1 * [0.35 - 0.6 + 0.4]_+ = 0.1375 + 0.15 = 0.2875
    loss = TripletGlobalLoss(margin=0.2, global_margin=0.4, mean_weight=1.0)
    assert loss(out, batch, triplets).item() == pytest.approx(0.325 + 0.2875, rel=1e-6)
    # its triplet term is `triplet`'s loss (pytorch-metric-learning) on the same triplets
    assert TripletLoss(0.2)(out, batch, triplets).item() == pytest.approx(0.325, rel=1e-6)
    # a wide enough gap (t = 0.1) leaves only the variances in L_g
    loss = TripletGlobalLoss(margin=0.2, global_margin=0.1, mean_weight=1.0)
    assert loss(out, batch, triplets).item() == pytest.approx(0.325 + 0.1375, rel=1e-6)
    # no triplet (one class): zero, differentiable
    empty = all_triplets(out, Batch(torch.zeros(4, dtype=torch.long)))
    assert isinstance(empty, Triplets) and empty.count() == 0
    assert TripletGlobalLoss(0.2, 0.4, 1.0)(out, Batch(torch.zeros(4)), empty).item() == 0


def test_triplet_global_moments_are_those_of_all_pairs_in_a_pk_batch():
    # P x K = 3 x 3: every ordered positive pair is in m - K = 6 triplets, every ordered
    # negative pair in K - 1 = 2, so the global term equals global_loss over the pairs themselves
    from methods._pair_losses import global_loss

    torch.manual_seed(2)
    emb = torch.nn.functional.normalize(torch.randn(9, 4, dtype=torch.float64), dim=1)
    labels = torch.arange(3).repeat_interleave(3)
    out, batch = Embedded(emb), Batch(labels)
    triplets = all_triplets(out, batch)
    loss = TripletGlobalLoss(margin=-10.0, global_margin=0.4, mean_weight=1.0)  # L_t = 0
    d = (emb[:, None] - emb[None]).pow(2).sum(-1) / 4
    same = labels[:, None] == labels[None]
    off_diagonal = ~torch.eye(9, dtype=torch.bool)
    expected = global_loss(d[same & off_diagonal], d[~same], margin=0.4, mean_weight=1.0)
    assert loss(out, batch, triplets).item() == pytest.approx(expected.item(), rel=1e-9)


# --- training lowers each loss --------------------------------------------------------------------


@pytest.mark.parametrize("name", BASELINES)
def test_short_training_lowers_the_loss(name: str):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(8, 16, generator=g)
    labels = torch.arange(8).repeat_interleave(16)
    x = centres[labels] + 0.8 * torch.randn(len(labels), 16, generator=g)
    method = METHODS.get(name).build(MethodContext((16,), 8, 8))

    def batches(seed: int, count: int):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(count):
            chosen = torch.randperm(8, generator=gen)[:4]
            yield torch.cat([torch.nonzero(labels == c).flatten()[:16][torch.randperm(16, generator=gen)[:4]] for c in chosen])  # fmt: skip

    def mean_loss() -> float:
        with torch.no_grad():
            values = []
            for idx in batches(1, 24):
                out, batch = method.head([x[idx]]), Batch(labels[idx])
                values.append(method.loss(out, batch, method.miner(out, batch)).item())
        return sum(values) / len(values)

    optimizer = torch.optim.Adam(method.head.parameters(), lr=3e-3)
    before = mean_loss()
    for idx in batches(2, 200):
        out, batch = method.head([x[idx]]), Batch(labels[idx])
        with torch.no_grad():
            mined = method.miner(out, batch)
        loss = method.loss(out, batch, mined)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = mean_loss()
    assert after < 0.8 * before, (before, after)
