"""Shared loss pieces against values worked by hand, and every loss that reads the batch's
distance matrix against the gathered-row form it replaced."""

import math

import pytest
import torch
import torch.nn.functional as F

import methods  # noqa: F401
from harness.method import METHODS, Batch, Embedded, MethodContext, all_pairs
from methods._pair_losses import (
    distance_matrix,
    global_loss,
    pair_values,
    squared_distance_matrix,
)
from methods.contrastive import ContrastiveLoss
from methods.hdc import CascadeLoss, CascadeMiner, hardest
from methods.lifted_structure import lifted_loss
from methods.pddm import metric_loss, scaled_graph, triplet_pair_loss
from methods.triplet_global import TripletGlobalLoss, all_triplets


def test_global_loss_by_hand() -> None:
    # d+ = {0.2, 0.4}: mean 0.3, var ((0.1)^2 + (0.1)^2)/2 = 0.01
    # d- = {0.5, 0.9, 1.0}: mean 0.8, var (0.09 + 0.01 + 0.04)/3 = 0.046667
    # gap [0.3 - 0.8 + 0.7]_+ = 0.2, weight 0.5 -> 0.1; total 0.01 + 0.046667 + 0.1
    pos = torch.tensor([0.2, 0.4])
    neg = torch.tensor([0.5, 0.9, 1.0])
    value = global_loss(pos, neg, margin=0.7, mean_weight=0.5)
    assert value.item() == pytest.approx(0.156667, abs=1e-5)
    # a wide enough gap leaves only the variances
    assert global_loss(pos, neg, margin=0.1, mean_weight=0.5).item() == pytest.approx(
        0.056667, abs=1e-5
    )


def test_global_loss_empty_side_is_finite_and_differentiable() -> None:
    pos = torch.tensor([0.2, 0.4], requires_grad=True)
    value = global_loss(pos, torch.empty(0), margin=1.0, mean_weight=1.0)
    value.backward()
    assert value.item() == pytest.approx(0.01)
    assert torch.isfinite(pos.grad).all()


# --- the distance-matrix forms against the gathered-row forms they replaced ----------------
#
# Each loss over pairs or tuples reads its distances from one m x m matrix (issue 12). The
# references below are copies of the gathered forms as they were before: the loss values and
# their gradients with respect to the embeddings must agree to 1e-6, on random batches and on
# batches with duplicated rows (zero distances, where the gradient must stay finite).

SEEDS = [0, 1, 2, 3]
TOL = {"atol": 1e-6, "rtol": 1e-6}


def ref_contrastive_pair_loss(emb, first, second, positive, margin):
    dist = (emb[first] - emb[second]).norm(dim=1)
    y = positive.to(emb.dtype)
    return y * dist.pow(2) + (1 - y) * (margin - dist).clamp(min=0).pow(2)


def ref_lifted_loss(emb, labels, margin):
    dist = (emb[:, None] - emb[None]).pow(2).sum(-1).clamp(min=1e-12).sqrt()
    same = labels[:, None] == labels[None]
    first, second = torch.triu_indices(len(labels), len(labels), offset=1)
    positive = same[first, second]
    i, j = first[positive], second[positive]
    neg_terms = (margin - dist).masked_fill(same, float("-inf"))
    soft_max = torch.cat([neg_terms[i], neg_terms[j]], dim=1).logsumexp(dim=1)
    j_ij = soft_max + dist[i, j]
    return j_ij.clamp(min=0).pow(2).sum() / (2 * len(j_ij))


def ref_triplet_global(emb, t, margin=0.2, global_margin=0.4, mean_weight=1.0):
    squared = (emb[:, None] - emb[None]).pow(2).sum(-1)
    d_ap, d_an = squared[t.anchor, t.positive], squared[t.anchor, t.negative]
    triplet_term = (d_ap - d_an + margin).clamp(min=0).mean()
    return triplet_term + global_loss(
        d_ap / 4, d_an / 4, margin=global_margin, mean_weight=mean_weight
    )


def ref_dist(emb, a, b):
    return (emb[a] - emb[b]).pow(2).sum(-1).clamp(min=1e-12).sqrt()


def ref_quadruplet_euclidean(emb, q, alpha=0.5, beta=1.0, lam=0.5):
    emb = F.normalize(emb, dim=1)
    first, second = torch.triu_indices(len(emb), len(emb), offset=1)
    graph = scaled_graph(-ref_dist(emb, first, second), len(emb))
    d_ij = ref_dist(emb, q.i, q.j)
    e_e = (beta + d_ij - ref_dist(emb, q.i, q.k)).clamp(min=0)
    e_e = (e_e + (beta + d_ij - ref_dist(emb, q.j, q.l)).clamp(min=0)).mean()
    return metric_loss(graph, q, alpha) + lam * e_e


def ref_pddm_triplet_term(emb, q, margin=0.2):
    d_ij = ref_dist(emb, q.i, q.j).pow(2)
    hinge = (margin + d_ij - ref_dist(emb, q.i, q.k).pow(2)).clamp(min=0)
    return (hinge + (margin + d_ij - ref_dist(emb, q.j, q.l).pow(2)).clamp(min=0)).mean()


def ref_quadruplet_selection_distances(emb, q, m1=0.2, m2=0.4, t1=0.2, t2=0.4):
    d_pos, d_pos_neg, d_neg = ((emb[q.i] - emb[x]).norm(dim=1) for x in (q.j, q.k, q.l))
    hinge = (d_pos + m1 - d_pos_neg).clamp(min=0) + (d_pos_neg + m2 - d_neg).clamp(min=0)
    glob = global_loss(d_pos, d_pos_neg, margin=t1, mean_weight=1.0)
    return hinge.mean() + glob + global_loss(d_pos_neg, d_neg, margin=t2, mean_weight=1.0)


def random_batch(seed: int, duplicates: bool, normalize: bool = True):
    """24 embeddings (8-d, float64), P = 6 classes x K = 4; with `duplicates`, rows 1 (same
    class) and 5 (another class) copy row 0 and row 9 copies row 8: zero distances on positive
    and negative pairs. Float64, so that no hinge sits within rounding of its kink, where the
    two forms could take different sides (the float32 test compares the values only)."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(24, 8, generator=gen, dtype=torch.float64)
    emb = F.normalize(emb, dim=1) if normalize else 3 * emb
    if duplicates:
        emb[1] = emb[5] = emb[0]
        emb[9] = emb[8]
    labels = torch.arange(24) // 4
    return emb, labels, labels % 3  # coarse: 2 classes of each coarse class per batch


def value_and_grad(fn, *leaves: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    value = fn(*leaves)
    grads = torch.autograd.grad(value, leaves)
    for g in grads:
        assert torch.isfinite(g).all()
    return value.detach(), [g.detach() for g in grads]


def assert_same(new, ref) -> None:
    (v_new, g_new), (v_ref, g_ref) = new, ref
    torch.testing.assert_close(v_new, v_ref, **TOL)
    for a, b in zip(g_new, g_ref, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_distance_matrices_match_the_differences(seed: int, duplicates: bool) -> None:
    emb, _, _ = random_batch(seed, duplicates, normalize=False)
    diff = emb[:, None] - emb[None]
    squared = diff.pow(2).sum(-1)
    torch.testing.assert_close(squared_distance_matrix(emb), squared, **TOL)
    torch.testing.assert_close(distance_matrix(emb, exact_zero=True), squared.sqrt(), **TOL)
    assert (distance_matrix(emb).diagonal() == 1e-6).all()
    assert (distance_matrix(emb, exact_zero=True).diagonal() == 0).all()
    first, second = torch.triu_indices(len(emb), len(emb), offset=1)
    assert torch.equal(pair_values(squared, first, second), squared[first, second])


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_contrastive_matches_the_gathered_form(seed: int, duplicates: bool) -> None:
    emb, labels, _ = random_batch(seed, duplicates)
    pairs = all_pairs(labels)
    loss = ContrastiveLoss(1.0)

    def ref(e):
        per_pair = ref_contrastive_pair_loss(e, pairs.first, pairs.second, pairs.positive, 1.0)
        return per_pair.sum() / (2 * len(per_pair))

    new = value_and_grad(lambda e: loss(Embedded(e), Batch(labels), pairs), emb)
    assert_same(new, value_and_grad(ref, emb))


@pytest.mark.parametrize("cascade", [True, False])
@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_hdc_matches_the_gathered_form(seed: int, duplicates: bool, cascade: bool) -> None:
    heads = [random_batch(seed + 10 * k, duplicates)[0] for k in range(3)]
    labels = random_batch(seed, duplicates)[1]
    out = Embedded(torch.cat(heads, dim=1), {f"head{k}": h for k, h in enumerate(heads, 1)})
    ratios, weights = [1.0, 0.5, 0.2], [1.0, 0.7, 1.3]
    mined = CascadeMiner(1.0, ratios, cascade)(out, Batch(labels))
    # the reference miner: the same cascade, pairs ranked by the gathered losses
    every, ref_heads = all_pairs(labels), []
    for k, ratio in enumerate(ratios, 1):
        judge, pool = (k - 1, ref_heads[-1]) if cascade and k > 1 else (k, every)
        if ratio >= 1:
            ref_heads.append(pool)
            continue
        losses = ref_contrastive_pair_loss(
            heads[judge - 1], pool.first, pool.second, pool.positive, 1.0
        )
        ref_heads.append(hardest(pool, losses, ratio))
    for got, want in zip(mined.heads, ref_heads, strict=True):
        assert torch.equal(torch.stack(got.indices()), torch.stack(want.indices()))

    def new(*hs):
        extras = {f"head{k}": h for k, h in enumerate(hs, 1)}
        return CascadeLoss(1.0, weights)(Embedded(torch.cat(hs, 1), extras), Batch(labels), mined)

    def ref(*hs):
        total = 0.0
        for h, pairs, weight in zip(hs, mined.heads, weights, strict=True):
            per_pair = ref_contrastive_pair_loss(h, pairs.first, pairs.second, pairs.positive, 1.0)
            total = total + weight * per_pair.sum() / (2 * len(per_pair))
        return total

    assert_same(value_and_grad(new, *heads), value_and_grad(ref, *heads))


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_lifted_structure_matches_the_gathered_form(seed: int, duplicates: bool) -> None:
    emb, labels, _ = random_batch(seed, duplicates, normalize=False)  # not normalised, as trained
    new = value_and_grad(lambda e: lifted_loss(e, labels, 1.0), emb)
    assert_same(new, value_and_grad(lambda e: ref_lifted_loss(e, labels, 1.0), emb))


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_triplet_global_matches_the_gathered_form(seed: int, duplicates: bool) -> None:
    emb, labels, _ = random_batch(seed, duplicates)
    triplets = all_triplets(Embedded(emb), Batch(labels))
    loss = TripletGlobalLoss(0.2, 0.4, 1.0)
    new = value_and_grad(lambda e: loss(Embedded(e), Batch(labels), triplets), emb)
    assert_same(new, value_and_grad(lambda e: ref_triplet_global(e, triplets), emb))


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


@pytest.mark.parametrize("name", ["quadruplet_random", "quadruplet_method1", "quadruplet_method2"])
@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_quadruplet_selection_matches_the_gathered_form(seed: int, duplicates: bool, name: str):
    emb, labels, coarse = random_batch(seed, duplicates)
    method = METHODS.get(name).build(MethodContext((8,), 8, 6, 3))
    batch = Batch(labels, coarse)
    q = method.miner(Embedded(emb), batch)
    assert q.count() > 0
    logits = {"fine_logits": torch.zeros(len(emb), 6), "coarse_logits": torch.zeros(len(emb), 3)}

    def new(e):  # uniform logits: the two cross-entropies are ln 6 and ln 3
        return method.loss(Embedded(e, logits), batch, q) - (math.log(6) + math.log(3))

    ref = value_and_grad(lambda e: ref_quadruplet_selection_distances(e, q), emb)
    assert_same(value_and_grad(new, emb), ref)


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_float32_losses_match_the_gathered_forms(seed: int, duplicates: bool) -> None:
    """In the training dtype the values agree to 1e-6 as well (gradients may differ where a
    hinge is within float32 rounding of 0, so they are compared in float64 above)."""
    emb, labels, _ = random_batch(seed, duplicates)
    emb, raw = emb.float(), random_batch(seed, duplicates, normalize=False)[0].float()
    pairs = all_pairs(labels)
    triplets = all_triplets(Embedded(emb), Batch(labels))
    q = (
        METHODS.get("quadruplet_euclidean")
        .build(MethodContext((8,), 8, 6))
        .miner(Embedded(emb), Batch(labels))
    )
    per_pair = ref_contrastive_pair_loss(emb, pairs.first, pairs.second, pairs.positive, 1.0)
    cases = [
        (ContrastiveLoss(1.0)(Embedded(emb), Batch(labels), pairs), per_pair.mean() / 2),
        (lifted_loss(raw, labels, 1.0), ref_lifted_loss(raw, labels, 1.0)),
        (TripletGlobalLoss(0.2, 0.4, 1.0)(Embedded(emb), Batch(labels), triplets),
         ref_triplet_global(emb, triplets)),
        (METHODS.get("quadruplet_euclidean").build(MethodContext((8,), 8, 6)).loss(
            Embedded(emb), Batch(labels), q), ref_quadruplet_euclidean(emb, q)),
    ]  # fmt: skip
    for new, ref in cases:
        assert new.dtype == torch.float32
        torch.testing.assert_close(new, ref, **TOL)


@pytest.mark.parametrize("name", ["contrastive", "lifted_structure", "triplet_global",
                                  "hdc_contrastive", "quadruplet_euclidean", "quadruplet_method2"])  # fmt: skip
def test_identical_embeddings_give_finite_gradients(name: str) -> None:
    """Every distance of the batch is 0 (the diagonal's case everywhere): no NaN gradient."""
    method = METHODS.get(name).build(MethodContext((8, 8, 8), 8, 6, 3))
    labels = torch.arange(24) // 4
    emb = torch.full((24, 8), 8**-0.5, requires_grad=True)
    extras = {f"head{k}": emb for k in (1, 2, 3)}
    extras |= {"fine_logits": torch.zeros(24, 6), "coarse_logits": torch.zeros(24, 3)}
    out, batch = Embedded(emb, extras), Batch(labels, labels % 3)
    with torch.no_grad():
        mined = method.miner(out, batch)
    method.loss(out, batch, mined).backward()
    assert torch.isfinite(emb.grad).all()
