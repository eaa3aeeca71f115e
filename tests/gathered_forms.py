"""Reference forms for the distance-matrix losses: copies of the gathered-row forms the losses
used before issue 12 (emb[first] - emb[second]), and the random batches the tests compare them on."""

import torch
import torch.nn.functional as F
from harness.methods._pair_losses import global_loss
from harness.methods.pddm import metric_loss, scaled_graph

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


def ref_squared(emb, a, b):
    return (emb[a] - emb[b]).pow(2).sum(-1)


def ref_quadruplet_euclidean(emb, q, alpha=0.5, beta=1.0, lam=0.5):
    """E_m on the scaled graph of S = -D, E_e on D^2 (PDDM version 4)."""
    emb = F.normalize(emb, dim=1)
    first, second = torch.triu_indices(len(emb), len(emb), offset=1)
    graph = scaled_graph(-ref_dist(emb, first, second), len(emb))
    d_ij = ref_squared(emb, q.i, q.j)
    e_e = (beta + d_ij - ref_squared(emb, q.i, q.k)).clamp(min=0)
    e_e = (e_e + (beta + d_ij - ref_squared(emb, q.j, q.l)).clamp(min=0)).mean()
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
