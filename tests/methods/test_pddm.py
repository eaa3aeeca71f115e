"""The PDDM family (Huang et al. 2016): each loss against a value worked by hand, the hard
quadruplet on batches where it is known, the [0, 1] scaling, the learned scorer, short
training, and the distance-matrix form against gathered rows."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gathered_forms import (
    SEEDS,
    assert_same,
    random_batch,
    ref_pddm_triplet_term,
    ref_quadruplet_euclidean,
    value_and_grad,
)

import methods  # noqa: F401
from harness.method import (
    METHODS,
    Batch,
    Embedded,
    EmbeddingHead,
    MethodContext,
    Quadruplets,
)
from methods._pair_losses import (
    distance_matrix,
)
from methods.pddm import (
    PDDMUnit,
    double_header_loss,
    hardest_quadruplets,
    metric_loss,
    pddm_scorer,
    scaled_graph,
    triplet_pair_loss,
)


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_pddm_family_matches_the_gathered_form(seed: int, duplicates: bool) -> None:
    emb, labels, _ = random_batch(seed, duplicates)
    ctx = MethodContext((8,), 8, 6)
    euclidean = METHODS.get("quadruplet_euclidean").build(ctx, quadruplets_per_batch=4)
    q = euclidean.miner(Embedded(emb), Batch(labels))
    assert q.count() == 4
    new = value_and_grad(lambda e: euclidean.loss(Embedded(e), Batch(labels), q), emb)
    assert_same(new, value_and_grad(lambda e: ref_quadruplet_euclidean(e, q), emb))
    # pddm_triplet's embedding term, alone: the PDDM unit's E_m reads no distance
    unit_emb = F.normalize(emb, dim=1)
    new = value_and_grad(lambda e: triplet_pair_loss(distance_matrix(e), q, 0.2), unit_emb)
    assert_same(new, value_and_grad(lambda e: ref_pddm_triplet_term(e, q), unit_emb))


PDDM_FAMILY = [
    "pddm_quadruplet",
    "pddm_score",
    "lmdm_score",
    "pddm_triplet",
    "quadruplet_euclidean",
]


def quad(*idx: int) -> Quadruplets:
    i, j, k, l = (torch.tensor([v]) for v in idx)  # noqa: E741
    return Quadruplets(0, i, j, k, l)


def circle(*degrees: float) -> torch.Tensor:
    rad = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([rad.cos(), rad.sin()], dim=1)


def hand_unit(position: bool = True) -> PDDMUnit:
    """d = 2: W_u = W_v = I, W_c = [I I] (or I for LMDM), W_s = (1, 1), all biases 0."""
    unit = PDDMUnit(2, dropout=0.5, position=position).double()
    with torch.no_grad():
        for layer in (unit.fc_u, unit.fc_v, unit.fc_c, unit.fc_s):
            if layer is not None:
                layer.bias.zero_()
        unit.fc_u.weight.copy_(torch.eye(2))
        if position:
            unit.fc_v.weight.copy_(torch.eye(2))
            unit.fc_c.weight.copy_(torch.cat([torch.eye(2), torch.eye(2)], dim=1))
        else:
            unit.fc_c.weight.copy_(torch.eye(2))
        unit.fc_s.weight.copy_(torch.ones(1, 2))
    return unit


def test_pddm_unit_matches_eq2_by_hand():
    f = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    unit = hand_unit()
    # f_0 -> (1, 0) after normalisation, f_1 = (0, 1): u = (1, 1), u' = (1, 1)/sqrt2;
    # v = (0.5, 0.5), v' = (1, 1)/sqrt2; c = u' + v' = (sqrt2, sqrt2); S = 2 sqrt2.
    assert unit(f[0], f[1], dropout=False).item() == pytest.approx(2 * math.sqrt(2))
    # f_0 and f_2 both normalise to (1, 0): u = 0, u' = r(0) = 0; v' = (1, 0); S = 1.
    assert unit(f[0], f[2], dropout=False).item() == pytest.approx(1.0)
    # LMDM, no v branch: c = u' = (1, 1)/sqrt2, S = sqrt2; and 0 for the coincident pair.
    lmdm = hand_unit(position=False)
    assert lmdm(f[0], f[1], dropout=False).item() == pytest.approx(math.sqrt(2))
    assert lmdm(f[0], f[2], dropout=False).item() == pytest.approx(0.0)
    # symmetric in (i, j), and dropout only when asked for
    assert unit(f[1], f[0], dropout=False).item() == pytest.approx(2 * math.sqrt(2))
    torch.manual_seed(0)
    noisy = {round(unit(f[0], f[1], dropout=True).item(), 6) for _ in range(20)}
    assert len(noisy) > 1


# m = 4, labels [0, 0, 1, 1]; raw scores in triu order (0,1) (0,2) (0,3) (1,2) (1,3) (2,3).
RAW = torch.tensor([2.0, 4.0, -2.0, 1.0, 0.0, 6.0], dtype=torch.float64)


LABELS4 = torch.tensor([0, 0, 1, 1])


def test_scores_are_scaled_into_unit_range_by_the_batch_graph():
    # min-max over the six pair scores: min -2, max 6, range 8 -> (s + 2) / 8:
    # (0,1) 0.5, (0,2) 0.75, (0,3) 0, (1,2) 0.375, (1,3) 0.25, (2,3) 1.
    graph = scaled_graph(RAW, 4)
    expected = torch.tensor(
        [[0, 0.5, 0.75, 0], [0.5, 0, 0.375, 0.25], [0.75, 0.375, 0, 1], [0, 0.25, 1, 0]],
        dtype=torch.float64,
    )
    assert torch.allclose(graph, expected)
    # the scaled graph, hence E_m, does not see a positive affine change of the raw scores
    assert torch.allclose(scaled_graph(3 * RAW + 7, 4), expected)
    # min and max are constants: d S~_01 / d S = 1/8 at (0,1) only, nothing through min or max
    raw = RAW.clone().requires_grad_()
    scaled_graph(raw, 4)[0, 1].backward()
    assert raw.grad.tolist() == [0.125, 0, 0, 0, 0, 0]


def test_metric_loss_eq3_on_the_scaled_graph_by_hand():
    graph = scaled_graph(RAW, 4)
    q = hardest_quadruplets(lambda a, b: graph[a, b], LABELS4)
    # positives (0,1) 0.5 and (2,3) 1 -> (i^, j^) = (0, 1); negatives of 0: 2 (0.75), 3 (0)
    # -> k^ = 2; negatives of 1: 2 (0.375), 3 (0.25) -> l^ = 2.
    assert [t.tolist() for t in q.indices()] == [[0], [1], [2], [2]]
    assert q.evaluated == 2 + 2 * 4  # the 2 positive pairs, then the rows of 0 and 1
    # E_m = [0.5 + 0.75 - 0.5]_+ + [0.5 + 0.375 - 0.5]_+ = 0.75 + 0.375
    assert metric_loss(graph, q, alpha=0.5).item() == pytest.approx(1.125)
    # unscaled it would be [0.5 + 4 - 2]_+ + [0.5 + 1 - 2]_+ = 2.5: the reading matters
    first, second = torch.triu_indices(4, 4, offset=1)
    raw = torch.zeros(4, 4, dtype=torch.float64).index_put((first, second), RAW)
    raw = raw + raw.T
    assert metric_loss(raw, q, alpha=0.5).item() == pytest.approx(2.5)


def test_miner_picks_the_papers_quadruplets_on_a_planted_graph():
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    torch.manual_seed(0)
    s = torch.rand(8, 8) * 0.4 + 0.3  # everything in [0.3, 0.7]
    s = torch.triu(s, 1) + torch.triu(s, 1).T
    planted = {(5, 7): 0.1, (0, 2): 0.2}  # the lowest positive pair, the second lowest
    planted |= {(5, 1): 0.95, (7, 3): 0.99, (0, 6): 0.9, (2, 4): 0.92}  # their hardest negatives
    for (a, b), value in planted.items():
        s[a, b] = s[b, a] = value

    def score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(torch.broadcast_shapes(a.shape, b.shape).numel())
        return s[a, b]

    calls: list[int] = []
    q = hardest_quadruplets(score, labels, n=2)
    assert [t.tolist() for t in q.indices()] == [[5, 0], [7, 2], [1, 6], [3, 4]]
    # O(m) scores: the 3 + 1 + 3 positive pairs, then 2 rows of 8 for each of the 2 pairs
    assert calls == [7, 32] and q.evaluated == 39
    assert hardest_quadruplets(score, labels).count() == 1  # the paper: one per batch
    one_class = hardest_quadruplets(score, torch.zeros(8, dtype=torch.long))
    assert one_class.count() == 0 and one_class.evaluated == 0


def test_euclidean_quadruplet_miner_on_embeddings():
    # unit circle: class 0 at 0, 10, 50 deg; class 1 at 65, 90; class 2 at 300, 330.
    # farthest positive pair (lowest S = -D): (0, 2), 50 deg apart. Nearest negative of 0:
    # 330 deg (30 deg away) = item 6; of item 2 (50 deg): 65 deg (15 away) = item 3.
    emb = circle(0, 10, 50, 65, 90, 300, 330).float()
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    method = METHODS.get("quadruplet_euclidean").build(MethodContext((4,), 2, 3))
    q = method.miner(Embedded(emb), Batch(labels))
    assert [t.tolist() for t in q.indices()] == [[0], [2], [6], [3]]
    assert q.evaluated == (3 + 1 + 1) + 2 * 7  # positive pairs, then the rows of 0 and 2


def test_embedding_losses_by_hand():
    # f0 = (1, 0), f1 = (0, 1) [class 0]; f2 = (0.6, 0.8), f3 = (0.8, -0.6) [class 1];
    # D_01^2 = 2, D_02^2 = 0.16 + 0.64 = 0.8, D_13^2 = 0.64 + 2.56 = 3.2.
    emb = torch.tensor([[1, 0], [0, 1], [0.6, 0.8], [0.8, -0.6]], dtype=torch.float64)
    q = quad(0, 1, 2, 3)
    # E_e (Eq. 4), beta = 1: [1 + sqrt2 - sqrt0.8]_+ + [1 + sqrt2 - sqrt3.2]_+
    e_e = (1 + math.sqrt(2) - math.sqrt(0.8)) + (1 + math.sqrt(2) - math.sqrt(3.2))
    dist = distance_matrix(emb)
    assert double_header_loss(dist, q, beta=1.0).item() == pytest.approx(e_e)  # 2.14514
    # triplets (0,1,2), (1,0,3), margin 0.2 on squared D: [0.2 + 2 - 0.8]_+ + [0.2 + 2 - 3.2]_+
    assert triplet_pair_loss(dist, q, margin=0.2).item() == pytest.approx(1.4)


def test_pddm_loss_is_em_plus_half_ee_on_the_units_scaled_graph():
    emb = torch.tensor([[1, 0], [0, 1], [0.6, 0.8], [0.8, -0.6]])
    method = METHODS.get("pddm_quadruplet").build(MethodContext((4,), 2, 2))
    method.loss.eval()
    out, batch = Embedded(emb), Batch(LABELS4)
    q = method.miner(out, batch)
    first, second = torch.triu_indices(4, 4, offset=1)
    scores = method.loss.unit(emb[first], emb[second], dropout=False)
    graph = scaled_graph(scores, 4)
    dist = distance_matrix(F.normalize(emb, dim=1))
    expected = metric_loss(graph, q, 0.5) + 0.5 * double_header_loss(dist, q, 1.0)
    assert method.loss(out, batch, q).item() == pytest.approx(expected.item())
    # mining is without dropout: the same quadruplet in training mode, every time
    method.loss.train()
    assert all(torch.equal(torch.stack(method.miner(out, batch).indices()), torch.stack(q.indices()))
               for _ in range(5))  # fmt: skip


@pytest.mark.parametrize("name", ["pddm_score", "lmdm_score"])
def test_scorer_is_the_unit_without_dropout_and_chunking_does_not_matter(name: str):
    torch.manual_seed(0)
    method = METHODS.get(name).build(MethodContext((8,), 6, 3))
    unit = method.loss.unit
    method.loss.train()  # the scorer must switch dropout off by itself
    query, gallery = torch.randn(5, 6), torch.randn(7, 6)
    brute = torch.tensor([[unit(a, b, dropout=False).item() for b in gallery] for a in query])
    full = method.scorer(query, gallery)
    assert full.shape == (5, 7) and not full.requires_grad
    assert torch.allclose(full, brute, atol=1e-6)
    for block in (1, 3, 64):
        assert torch.allclose(pddm_scorer(unit, block)(query, gallery), brute, atol=1e-6)
    assert METHODS.get("pddm_quadruplet").build(MethodContext((8,), 6, 3)).scorer is None


def clustered(seed: int, classes: int = 8, per_class: int = 16, dim: int = 16):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g)
    labels = torch.arange(classes).repeat_interleave(per_class)
    return centres[labels] + 0.8 * torch.randn(len(labels), dim, generator=g), labels


def batches(labels: torch.Tensor, seed: int, count: int, p: int = 4, k: int = 4):
    g = torch.Generator().manual_seed(seed)
    classes = labels.unique()
    for _ in range(count):
        chosen = classes[torch.randperm(len(classes), generator=g)[:p]]
        idx = [torch.nonzero(labels == c).flatten() for c in chosen]
        yield torch.cat([i[torch.randperm(len(i), generator=g)[:k]] for i in idx])


@pytest.mark.parametrize("name", ["lifted_structure", *PDDM_FAMILY])
def test_short_training_lowers_the_loss(name: str):
    torch.manual_seed(0)
    x, labels = clustered(0)
    method = METHODS.get(name).build(MethodContext((16,), 8, 8))
    assert isinstance(method.head, EmbeddingHead)
    evaluation = list(batches(labels, seed=1, count=24))

    def mean_loss() -> float:
        method.head.eval()
        method.loss.eval()
        with torch.no_grad():
            values = []
            for idx in evaluation:
                out, batch = method.head([x[idx]]), Batch(labels[idx])
                values.append(method.loss(out, batch, method.miner(out, batch)).item())
        method.head.train()
        method.loss.train()
        return sum(values) / len(values)

    params = [*method.head.parameters(), *method.loss.parameters()]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    before = mean_loss()
    for idx in batches(labels, seed=2, count=200):
        out, batch = method.head([x[idx]]), Batch(labels[idx])
        with torch.no_grad():
            mined = method.miner(out, batch)
        loss = method.loss(out, batch, mined)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = mean_loss()
    assert after < 0.8 * before, (before, after)
