"""Re-ranking as an evaluation option (harness.evaluate.reranking, harness.core.rerank_spec):
k-reciprocal encoding (Zhong et al., CVPR 2017) against hand-worked values and against a
transcription of the authors' numpy code; alpha-QE with DBA (Radenovic et al., TPAMI 2018)
against hand-worked angles and a loop transcription; lambda = 1, alpha = 0 and n = 0; the
all-vs-all self exclusion; the parser's errors and canonical text; the protocol key, the run's
evaluation and record; and `evaluate --rerank`."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from harness.backbones import Backbone
from harness.cli import main
from harness.core import (
    AugmentationSpec,
    Embedded,
    HarnessError,
    Method,
    RunContext,
    load_protocol,
    parse_protocol,
)
from harness.evaluate import compute_metrics, evaluate, ranking_scorer, retrieval_record
from harness.evaluate.reranking import (
    Rerank,
    aqe_dba_distances,
    k_reciprocal_distances,
    parse_rerank,
    reranked_distances,
    reranked_metrics,
    reranked_report,
)

# the module (harness.evaluate's attribute `rerank` is the learned scorer's top-N function)
rerank_module = importlib.import_module("harness.evaluate.reranking")
RETRIEVAL = ["recall@1", "recall@2", "precision@1", "r_precision", "map@r", "map"]


# ---- the parser and the canonical text ------------------------------------------------------


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("k_reciprocal", "k_reciprocal:k1=20,k2=6,lambda=0.3"),  # the paper's defaults
        ("k_reciprocal:k1=20,k2=6,lambda=0.3", "k_reciprocal:k1=20,k2=6,lambda=0.3"),
        (" k_reciprocal : lambda = 1 , k1=5,k2=5 ", "k_reciprocal:k1=5,k2=5,lambda=1"),
        ("aqe_dba", "aqe_dba:alpha=3,n=2"),
        ("aqe_dba:alpha=3,n=2", "aqe_dba:alpha=3,n=2"),
        ("aqe_dba:n=0,alpha=0.5", "aqe_dba:alpha=0.5,n=0"),
        ("aqe_dba:alpha=1e-5", "aqe_dba:alpha=1e-05,n=2"),
    ],
)
def test_text_parses_to_a_rerank_whose_text_parses_back(text: str, canonical: str):
    parsed = parse_rerank(text)
    assert parsed is not None and parsed.text == canonical and str(parsed) == canonical
    assert parse_rerank(parsed.text) == parsed  # the canonical text round-trips
    assert parse_rerank(canonical) == parsed


def test_none_is_no_rerank_and_a_rerank_fills_its_defaults():
    assert parse_rerank("none") is None and parse_rerank(" none ") is None
    made = Rerank("aqe_dba", (("n", 3),))
    assert made.params == (("alpha", 3.0), ("n", 3)) and made["n"] == 3
    assert isinstance(made["n"], int) and isinstance(made["alpha"], float)
    assert Rerank("k_reciprocal") == parse_rerank("k_reciprocal:lambda=0.3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.name = "k_reciprocal"  # type: ignore[misc]
    with pytest.raises(HarnessError, match="k2 must be an integer with 1 <= k2 <= k1"):
        Rerank("k_reciprocal", (("k1", 4),))  # the default k2 = 6 is more than k1


@pytest.mark.parametrize(
    "text, message",
    [
        ("k_recip", "unknown re-ranking 'k_recip' (did you mean 'k_reciprocal'?); choose one "
                    "of none, k_reciprocal, aqe_dba"),
        ("None", "unknown re-ranking 'None' (did you mean 'none'?); choose one of none, "
                 "k_reciprocal, aqe_dba"),
        ("", "empty re-ranking '': write one of none, k_reciprocal, aqe_dba, with key=value "
             "parameters after a colon"),
        ("none:k1=3", "re-ranking none takes no parameters, got 'none:k1=3'; write none"),
        ("k_reciprocal:k3=1", "re-ranking k_reciprocal has no parameter 'k3' (did you mean "
                              "'k2'?); it takes k1, k2, lambda"),
        ("k_reciprocal:lamda=0.2", "re-ranking k_reciprocal has no parameter 'lamda' (did you "
                                   "mean 'lambda'?); it takes k1, k2, lambda"),
        ("k_reciprocal:k1", "k_reciprocal: 'k1' is not key=value; write e.g. "
                            "k_reciprocal:k1=20,k2=6,lambda=0.3"),
        ("k_reciprocal:k1=abc", "k_reciprocal: k1='abc' is not a number; k1 must be an "
                                "integer >= 1"),
        ("aqe_dba:alpha=three", "aqe_dba: alpha='three' is not a number; alpha must be a "
                                "finite number >= 0"),
        ("k_reciprocal:k1=2.5", "k_reciprocal: k1 must be an integer >= 1, got 2.5"),
        ("k_reciprocal:k1=0", "k_reciprocal: k1 must be an integer >= 1, got 0"),
        ("k_reciprocal:k1=5", "k_reciprocal: k2 must be an integer with 1 <= k2 <= k1, got 6 "
                              "with k1=5 (its default; give k2=...)"),
        ("k_reciprocal:k1=5,k2=7", "k_reciprocal: k2 must be an integer with 1 <= k2 <= k1, "
                                   "got 7 with k1=5"),
        ("k_reciprocal:k2=0", "k_reciprocal: k2 must be an integer with 1 <= k2 <= k1, got 0 "
                              "with k1=20"),
        ("k_reciprocal:lambda=1.5", "k_reciprocal: lambda must be a number with 0 <= lambda "
                                    "<= 1, got 1.5"),
        ("k_reciprocal:lambda=nan", "k_reciprocal: lambda must be a number with 0 <= lambda "
                                    "<= 1, got nan"),
        ("aqe_dba:alpha=-1", "aqe_dba: alpha must be a finite number >= 0, got -1"),
        ("aqe_dba:alpha=inf", "aqe_dba: alpha must be a finite number >= 0, got inf"),
        ("aqe_dba:n=-1", "aqe_dba: n must be an integer >= 0, got -1"),
        ("aqe_dba:n=1.5", "aqe_dba: n must be an integer >= 0, got 1.5"),
        ("k_reciprocal:k1=5,k1=6", "k_reciprocal: k1 is given twice in "
                                   "'k_reciprocal:k1=5,k1=6'; give it once"),
    ],
)  # fmt: skip
def test_each_parse_error_is_one_line_saying_what_and_how(text: str, message: str):
    with pytest.raises(HarnessError) as info:
        parse_rerank(text)
    assert str(info.value) == message and "\n" not in message


# ---- k-reciprocal encoding ------------------------------------------------------------------


def test_k_reciprocal_by_hand_on_five_points():
    """Points 0, 1, 2, 10, 11 on a line, k1 = 2, k2 = 2, lambda = 0.3, all-vs-all.

    d(p, g) = squared distance / the largest in p's row: row 0 / 121, row 1 / 100, row 2 / 81,
    row 3 (x = 10) / 100, row 4 (x = 11) / 121. Nearest first (ties to the lower index):
    0: 0 1 2 ..  1: 1 0 2 ..  2: 2 1 0 ..  10: 10 11 2 ..  11: 11 10 2 ..
    R(p, 2) from the top 3 (Eq. 4): R(0) = R(1) = R(2) = {0, 1, 2}; R(10) = R(11) = {10, 11}
    (2 is among 10's top 3, but 10 is not among 2's). The half sets (round(2/2) = 1: top 2)
    lie inside R(p), so R* = R (Eq. 6 adds nothing). Eq. 7:
    V_0 = [1, e^(-1/121), e^(-4/121)] / sum over items 0, 1, 2,
    V_1 = [e^(-1/100), 1, e^(-1/100)] / sum, V_2 = [e^(-4/81), e^(-1/81), 1] / sum,
    V_10 = [1, e^(-1/100)] / sum, V_11 = [e^(-1/121), 1] / sum over items 10, 11.
    Query expansion over the k2 = 2 nearest (Eq. 11): V'_0 = V'_1 = (V_0 + V_1) / 2,
    V'_2 = (V_2 + V_1) / 2, V'_10 = V'_11 = (V_10 + V_11) / 2. So d_J(0, 1) = 0 and
    d_J(10, 11) = 0 (equal vectors), d_J = 1 across the two groups (disjoint), and
    d*(p, g) = 0.7 d_J + 0.3 d(p, g) (Eq. 12)."""
    points = torch.tensor([[0.0], [1.0], [2.0], [10.0], [11.0]], dtype=torch.float64)
    got = k_reciprocal_distances(points, None, k1=2, k2=2, lambda_value=0.3).numpy()
    e = math.exp
    v0 = np.array([1, e(-1 / 121), e(-4 / 121)]) / (1 + e(-1 / 121) + e(-4 / 121))
    v1 = np.array([e(-1 / 100), 1, e(-1 / 100)]) / (1 + 2 * e(-1 / 100))
    v2 = np.array([e(-4 / 81), e(-1 / 81), 1]) / (1 + e(-1 / 81) + e(-4 / 81))
    w0, w2 = (v0 + v1) / 2, (v2 + v1) / 2
    jaccard_02 = 1 - np.minimum(w0, w2).sum() / np.maximum(w0, w2).sum()  # Eq. 10
    expected = {
        (0, 1): 0.3 * 1 / 121, (1, 0): 0.3 * 1 / 100, (3, 4): 0.3 * 1 / 100,
        (4, 3): 0.3 * 1 / 121, (0, 2): 0.7 * jaccard_02 + 0.3 * 4 / 121,
        (2, 0): 0.7 * jaccard_02 + 0.3 * 4 / 81, (2, 1): 0.7 * jaccard_02 + 0.3 * 1 / 81,
        (0, 3): 0.7 + 0.3 * 100 / 121, (0, 4): 0.7 + 0.3, (3, 2): 0.7 + 0.3 * 64 / 100,
        (3, 0): 0.7 + 0.3, (4, 2): 0.7 + 0.3 * 81 / 121,
    }  # fmt: skip
    for (p, g), value in expected.items():
        assert got[p, g] == pytest.approx(value, abs=1e-15), (p, g)
    assert 0 < jaccard_02 < 0.02  # similar, not equal, neighbourhoods
    # query/gallery: the database is the queries and the gallery together, so query 0 against
    # gallery 1, 2, 10, 11 is the same five points, the same row
    split = k_reciprocal_distances(points[:1], points[1:], k1=2, k2=2, lambda_value=0.3)
    np.testing.assert_allclose(split.numpy(), got[:1, 1:], rtol=0, atol=1e-15)


def authors_re_ranking(dist: np.ndarray, query_num: int, k1: int, k2: int, lambda_value: float,
                       all_vs_all: bool) -> tuple[np.ndarray, dict[str, int]]:  # fmt: skip
    """zhunzhong07/person-re-ranking python-version/re_ranking_ranklist.py from after its
    concatenation of [q-q, q-g; g-q, g-g] (`dist`, Euclidean, of the queries then the
    gallery; all-vs-all, the N x N matrix), in float64 and with a stable argsort (the code:
    float32, np.argsort's unspecified tie order); all-vs-all keeps [:N, :N] instead of
    [:Q, Q:]. It also counts the expansions that added items, and the candidates refused at
    exactly 2/3 overlap, so that the test knows the data exercised Eq. 6's rule."""
    counts = {"added": 0, "at_two_thirds": 0}
    original_dist = np.power(dist, 2).astype(np.float64)
    original_dist = np.transpose(1.0 * original_dist / np.max(original_dist, axis=0))
    V = np.zeros_like(original_dist).astype(np.float64)
    initial_rank = np.argsort(original_dist, kind="stable").astype(np.int32)
    all_num = gallery_num = original_dist.shape[0]
    half = int(np.around(k1 / 2.0)) + 1
    for i in range(all_num):
        forward_k_neigh_index = initial_rank[i, : k1 + 1]
        backward_k_neigh_index = initial_rank[forward_k_neigh_index, : k1 + 1]
        fi = np.where(backward_k_neigh_index == i)[0]
        k_reciprocal_index = forward_k_neigh_index[fi]
        k_reciprocal_expansion_index = k_reciprocal_index
        for j in range(len(k_reciprocal_index)):
            candidate = k_reciprocal_index[j]
            candidate_forward_k_neigh_index = initial_rank[candidate, :half]
            candidate_backward_k_neigh_index = initial_rank[candidate_forward_k_neigh_index, :half]
            fi_candidate = np.where(candidate_backward_k_neigh_index == candidate)[0]
            candidate_k_reciprocal_index = candidate_forward_k_neigh_index[fi_candidate]
            overlap = len(np.intersect1d(candidate_k_reciprocal_index, k_reciprocal_index))
            if overlap > 2.0 / 3 * len(candidate_k_reciprocal_index):
                counts["added"] += overlap < len(candidate_k_reciprocal_index)
                k_reciprocal_expansion_index = np.append(k_reciprocal_expansion_index,
                                                         candidate_k_reciprocal_index)  # fmt: skip
            else:
                counts["at_two_thirds"] += 3 * overlap == 2 * len(candidate_k_reciprocal_index)
        k_reciprocal_expansion_index = np.unique(k_reciprocal_expansion_index)
        weight = np.exp(-original_dist[i, k_reciprocal_expansion_index])
        V[i, k_reciprocal_expansion_index] = 1.0 * weight / np.sum(weight)
    original_dist = original_dist[:query_num,]
    if k2 != 1:
        V_qe = np.zeros_like(V, dtype=np.float64)
        for i in range(all_num):
            V_qe[i, :] = np.mean(V[initial_rank[i, :k2], :], axis=0)
        V = V_qe
    invIndex = [np.where(V[:, i] != 0)[0] for i in range(gallery_num)]
    jaccard_dist = np.zeros_like(original_dist, dtype=np.float64)
    for i in range(query_num):
        temp_min = np.zeros(shape=[1, gallery_num], dtype=np.float64)
        indNonZero = np.where(V[i, :] != 0)[0]
        indImages = [invIndex[ind] for ind in indNonZero]
        for j in range(len(indNonZero)):
            temp_min[0, indImages[j]] = temp_min[0, indImages[j]] + np.minimum(
                V[i, indNonZero[j]], V[indImages[j], indNonZero[j]])  # fmt: skip
        jaccard_dist[i] = 1 - temp_min / (2.0 - temp_min)
    final_dist = jaccard_dist * (1 - lambda_value) + original_dist * lambda_value
    final = final_dist[:query_num, :query_num] if all_vs_all else final_dist[:query_num, query_num:]
    return final, counts


@pytest.mark.parametrize("queries, gallery", [(150, 0), (40, 110)])
@pytest.mark.parametrize("k1, k2, lambda_value", [(20, 6, 0.3), (7, 3, 0.5), (4, 1, 0.0)])
def test_k_reciprocal_matches_the_authors_code(queries, gallery, k1, k2, lambda_value):
    rng = np.random.default_rng(k1 + queries)
    labels = rng.integers(0, 12, queries + gallery)
    x = rng.normal(size=(12, 6))[labels] + rng.normal(size=(queries + gallery, 6))
    all_vs_all = gallery == 0
    expected, counts = authors_re_ranking(cdist(x, x), queries, k1, k2, lambda_value, all_vs_all)
    got = k_reciprocal_distances(torch.from_numpy(x[:queries]),
                                 None if all_vs_all else torch.from_numpy(x[queries:]),
                                 k1=k1, k2=k2, lambda_value=lambda_value)  # fmt: skip
    assert got.dtype == torch.float64 and got.shape == expected.shape
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-9)
    if k1 >= 7:  # the data exercised Eq. 6's rule both ways (k1 = 4: half sets too small)
        assert counts["added"] > 0 and counts["at_two_thirds"] > 0, counts


def test_the_jaccard_sums_agree_whatever_the_block_size(monkeypatch: pytest.MonkeyPatch):
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.normal(size=(90, 4)))
    whole = k_reciprocal_distances(x, None)
    monkeypatch.setattr(rerank_module, "PAIR_BUDGET", 7)  # many small blocks
    np.testing.assert_allclose(k_reciprocal_distances(x, None).numpy(), whole.numpy(),
                               rtol=0, atol=1e-15)  # fmt: skip


@pytest.mark.parametrize("gallery_size", [0, 60])
def test_lambda_one_gives_back_the_euclidean_order(gallery_size: int):
    """lambda = 1 leaves d(p, g) alone: a squared distance scaled per query row, whose order
    is the Euclidean order, so every retrieval metric is the plain one."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 8, 80 + gallery_size)
    x = rng.normal(size=(80 + gallery_size, 5))
    parts = (x, labels) if gallery_size == 0 else (x[:80], labels[:80], x[80:], labels[80:])
    plain = compute_metrics(*parts, metrics=RETRIEVAL)
    for text in ("k_reciprocal:lambda=1", "k_reciprocal:k1=3,k2=3,lambda=1"):
        reranked, _ = reranked_metrics(*parts, rerank=text, metrics=RETRIEVAL)
        assert reranked == pytest.approx(plain, abs=1e-12)
    changed, _ = reranked_metrics(*parts, rerank="k_reciprocal", metrics=RETRIEVAL)
    assert changed != pytest.approx(plain, abs=1e-6)  # lambda = 0.3 re-ranks


# ---- alpha-QE with database-side augmentation -----------------------------------------------


def unit(degrees: float) -> list[float]:
    return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees))]


def chord(degrees: float) -> float:
    """The Euclidean distance of two unit vectors `degrees` apart: 2 sin(angle / 2)."""
    return 2 * math.sin(math.radians(degrees) / 2)


def test_aqe_dba_by_hand_query_against_gallery():
    """Gallery unit vectors at 0, 60 and 90 degrees; one query at 40 degrees; n = 1.

    alpha = 0 (each neighbour weighs 1, and the sum of two unit vectors points halfway):
    DBA: g0 (0) + its nearest other, g1 (60) -> 30; g1 + g2 (30 degrees away, nearer than
    g0) -> 75; g2 + g1 -> 75. aQE: the query's nearest augmented vector is g0' (10 degrees),
    so q' points at (40 + 30) / 2 = 35, and its distances are 2 sin(5 / 2) to g0' and
    2 sin(40 / 2) to g1', g2'. Euclidean ranking put g1 first (20 degrees); now g0 is."""
    gallery = torch.tensor([unit(0), unit(60), unit(90)], dtype=torch.float64)
    query = torch.tensor([unit(40)], dtype=torch.float64)
    got = aqe_dba_distances(query, gallery, alpha=0, n=1)[0].tolist()
    assert got == pytest.approx([chord(5), chord(40), chord(40)], abs=1e-13)
    plain = torch.cdist(query, gallery)[0]
    assert int(plain.argmin()) == 1 and int(np.argmin(got)) == 0
    # alpha = 3: weights cos^3. g0' = unit(g0 + (1/2)^3 g1) = unit(1 + 1/16, sqrt(3)/16);
    # g1' = unit(g1 + (sqrt(3)/2)^3 g2); g2' = unit(g2 + (sqrt(3)/2)^3 g1). The query's most
    # similar augmented vector is g1' (71.7 degrees against 5.8 and 78.3): q' = unit(q + s^3
    # g1') with s = q.g1'; ranked g1, g2, g0, where Euclidean distance ranks g1, g0, g2.
    c = math.sqrt(3) / 2
    g = gallery.numpy()
    g0, g1, g2 = (v / np.linalg.norm(v) for v in (g[0] + g[1] / 8, g[1] + c**3 * g[2],
                                                   g[2] + c**3 * g[1]))  # fmt: skip
    q = query.numpy()[0]
    s = float(q @ g1)
    q1 = (q + s**3 * g1) / np.linalg.norm(q + s**3 * g1)
    expected = [float(np.linalg.norm(q1 - v)) for v in (g0, g1, g2)]
    got = aqe_dba_distances(query, gallery, alpha=3, n=1)[0].tolist()
    assert got == pytest.approx(expected, abs=1e-13)
    assert np.argsort(got).tolist() == [1, 2, 0] and plain.argsort().tolist() == [1, 0, 2]


def test_aqe_dba_by_hand_all_vs_all_leaves_each_item_out_of_its_own_expansion():
    """The same three vectors all-vs-all, alpha = 0, n = 1. DBA as above: 30, 75, 75. aQE
    takes each item's nearest augmented vector other than its own: item 0 (at 0) has g1' and
    g2' (both 75, tied: the lower index, g1') -> 37.5; item 1 (at 60) has g0' (30 away) and
    g2' (15 away) -> 67.5; item 2 (at 90) has g0' and g1' (15 away) -> 82.5. Were its own
    augmented vector allowed, item 0 would take g0' (30) and point at 15, 1.0 from g1'."""
    items = torch.tensor([unit(0), unit(60), unit(90)], dtype=torch.float64)
    got = aqe_dba_distances(items, None, alpha=0, n=1).numpy()
    expected = [[chord(7.5), chord(37.5), chord(37.5)],
                [chord(37.5), chord(7.5), chord(7.5)],
                [chord(52.5), chord(7.5), chord(7.5)]]  # fmt: skip
    # sqrt(2 - 2 cos): a small angle's distance loses a few bits to cancellation
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)
    assert abs(got[0, 1] - 1.0) > 0.3  # not the value that counting itself would give


def loop_aqe_dba(query: np.ndarray, gallery: np.ndarray | None, alpha: float,
                 n: int) -> np.ndarray:  # fmt: skip
    """alpha-QE with DBA written as the definitions read, one vector at a time."""

    def unit_rows(rows):
        return [r / np.linalg.norm(r) for r in rows]

    def expand(vectors, base, skip_own):
        out = []
        for i, v in enumerate(vectors):
            ranked = sorted((-(v @ b), j) for j, b in enumerate(base) if not (skip_own and i == j))
            total = v + sum(max(-neg, 0.0) ** alpha * base[j] for neg, j in ranked[:n])
            out.append(total / np.linalg.norm(total))
        return out

    queries = unit_rows(query)
    database = queries if gallery is None else unit_rows(gallery)
    augmented = expand(database, database, True)
    expanded = expand(queries, augmented, gallery is None)
    return np.array([[np.linalg.norm(a - b) for b in augmented] for a in expanded])


@pytest.mark.parametrize("gallery_size", [0, 50])
@pytest.mark.parametrize("alpha, n", [(3.0, 2), (0.5, 5), (0.0, 3)])
def test_aqe_dba_matches_a_loop_over_the_definitions(gallery_size, alpha, n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(40 + gallery_size, 6)) + 0.5  # mostly positive similarities
    query, gallery = x[:40], (None if gallery_size == 0 else x[40:])
    expected = loop_aqe_dba(query, gallery, alpha, n)
    got = aqe_dba_distances(torch.from_numpy(query),
                            None if gallery is None else torch.from_numpy(gallery),
                            alpha=alpha, n=n)  # fmt: skip
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-9)


def test_n_zero_ranks_by_the_distance_of_the_unit_vectors():
    rng = np.random.default_rng(2)
    q, g = torch.from_numpy(rng.normal(size=(7, 3))), torch.from_numpy(rng.normal(size=(9, 3)))
    unit_q, unit_g = q / q.norm(dim=1, keepdim=True), g / g.norm(dim=1, keepdim=True)
    for alpha in (0.0, 3.0):
        got = aqe_dba_distances(q, g, alpha=alpha, n=0)
        np.testing.assert_allclose(got.numpy(), torch.cdist(unit_q, unit_g).numpy(), atol=1e-12)


# ---- the metrics of a re-ranked order ---------------------------------------------------------


def clustered(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """30 classes x 10 items in 32-d, noisy enough that a neighbour's neighbours help."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(30), 10)
    return rng.normal(size=(30, 32))[labels] + rng.normal(scale=0.8, size=(300, 32)), labels


@pytest.mark.parametrize("text", ["k_reciprocal", "aqe_dba"])
def test_reranking_raises_map_at_r_on_clustered_data(text: str):
    x, labels = clustered()
    plain = compute_metrics(x, labels, metrics=["map@r"])["map@r"]  # 0.851
    reranked, seconds = reranked_metrics(x, labels, rerank=text, metrics=["map@r"])
    assert reranked["map@r"] > plain + 0.1 and seconds >= 0  # 0.984 and 0.980
    query = np.arange(300) % 3 == 0
    parts = (x[query], labels[query], x[~query], labels[~query])
    plain = compute_metrics(*parts, metrics=["map@r"])["map@r"]  # 0.856
    reranked, _ = reranked_metrics(*parts, rerank=text, metrics=["map@r"])
    assert reranked["map@r"] > plain + 0.1  # 0.978 and 0.974


@pytest.mark.parametrize("text", ["k_reciprocal", "aqe_dba", "k_reciprocal:lambda=1"])
def test_all_vs_all_an_item_never_finds_itself(text: str):
    """Random points with random labels: were an item its own neighbour, recall@1 would be 1;
    left out of its own gallery, it is about chance (1 in 10 labels)."""
    rng = np.random.default_rng(3)
    x, labels = rng.normal(size=(200, 8)), rng.integers(0, 10, 200)
    metrics, _ = reranked_metrics(x, labels, rerank=text, metrics=["recall@1"])
    assert metrics["recall@1"] < 0.25


def test_the_diagonal_is_never_read_all_vs_all():
    x, labels = clustered(1)
    reranked = reranked_report(x, labels, rerank="k_reciprocal", metrics=RETRIEVAL)
    for value in (-1e9, 1e9):  # each item nearest to, or farthest from, itself
        reranked.distances.fill_diagonal_(value)
        rows, _, scorer = reranked.ranking()
        again = compute_metrics(rows, labels, metrics=RETRIEVAL, scorer=scorer)
        assert again == reranked.report.metrics


def test_reranked_metrics_keep_the_ranking_free_metrics_and_their_order():
    x, labels = clustered(2)
    plain = compute_metrics(x, labels)
    reranked, _ = reranked_metrics(x, labels, rerank="aqe_dba")
    assert list(reranked) == list(plain)  # recall@K ascending, then the harness's order
    for name in ("nmi", "f1", "lda"):
        assert reranked[name] == plain[name]
    assert reranked["map@r"] > plain["map@r"]


def test_bad_inputs_are_the_metrics_own_errors():
    x, labels = clustered()
    with pytest.raises(HarnessError, match="query embeddings have dimension 32 but gallery"):
        reranked_metrics(x, labels, x[:, :5], labels, rerank="aqe_dba")
    with pytest.raises(HarnessError, match="gallery_embeddings given without gallery_labels"):
        reranked_metrics(x, labels, x, None, rerank="aqe_dba")
    with pytest.raises(HarnessError, match="have 300 rows but the labels have 299"):
        reranked_metrics(x, labels[1:], rerank="k_reciprocal")
    with pytest.raises(HarnessError, match="unknown re-ranking 'akq'"):
        reranked_metrics(x, labels, rerank="akq")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_gives_the_cpus_distances():
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.normal(size=(300, 16)))
    for text in ("k_reciprocal", "aqe_dba"):
        rerank = parse_rerank(text)
        assert rerank is not None
        on_gpu = reranked_distances(x.cuda(), x[:100].cuda(), rerank)
        assert on_gpu.device.type == "cuda"
        np.testing.assert_allclose(on_gpu.cpu().numpy(),
                                   reranked_distances(x, x[:100], rerank).numpy(), atol=1e-9)  # fmt: skip


# ---- the protocol key, the run's evaluation and its record -----------------------------------


def test_the_protocol_key_is_checked_at_load_and_hashed_only_when_set():
    smoke = load_protocol("smoke")
    assert smoke.evaluation.rerank == "none" and "rerank" not in smoke.content()["evaluation"]
    data = json.loads(json.dumps(smoke.content()))  # plain data, as from YAML
    hashes = set()
    for text in ("k_reciprocal", "k_reciprocal:lambda=0.3,k2=6", "k_reciprocal:k1=20"):
        data["evaluation"]["rerank"] = text
        loaded = parse_protocol(data, "x.yaml")
        assert loaded.evaluation.rerank == "k_reciprocal:k1=20,k2=6,lambda=0.3"
        hashes.add(loaded.hash)
    assert len(hashes) == 1 and smoke.hash not in hashes
    data["evaluation"]["rerank"] = "none"
    assert parse_protocol(data, "x.yaml").hash == smoke.hash  # the default leaves it alone
    data["evaluation"]["rerank"] = "aqe_dba:n=-2"
    with pytest.raises(HarnessError) as info:
        parse_protocol(data, "x.yaml")
    assert str(info.value) == ("x.yaml.evaluation: rerank: aqe_dba: n must be an integer >= 0, "
                               "got -2")  # fmt: skip


def with_rerank(text: str):
    protocol = load_protocol("smoke")
    return dataclasses.replace(
        protocol, evaluation=dataclasses.replace(protocol.evaluation, rerank=text)
    )


def test_the_record_says_which_rerank_and_a_learned_scorer_is_refused():
    plain, reranked = load_protocol("smoke"), with_rerank("aqe_dba")
    assert retrieval_record(plain, None) == {"ranking": "euclidean"}
    assert retrieval_record(reranked, None) == {"ranking": "euclidean",
                                                "rerank": "aqe_dba:alpha=3,n=2"}  # fmt: skip
    learned = Method(head=torch.nn.Identity(), scorer=lambda q, g: q @ g.T)
    assert ranking_scorer(learned, plain, all_vs_all=True)[0] is not None
    with pytest.raises(HarnessError) as info:
        ranking_scorer(learned, reranked, all_vs_all=True)
    message = str(info.value)
    assert "evaluation.rerank (aqe_dba:alpha=3,n=2) re-ranks Euclidean distances" in message
    assert "learned scorer" in message and "\n" not in message


class _Pooled(torch.nn.Module):
    def forward(self, features: list[torch.Tensor]) -> Embedded:
        return Embedded(embedding=features[-1])


def test_a_runs_evaluation_ranks_by_the_protocols_rerank():
    """evaluate() under evaluation.rerank: its retrieval metrics, bootstrap and saved
    neighbours come from the re-ranked distances; its timings say what re-ranking cost."""
    channels = 4
    backbone = Backbone([torch.nn.Identity()], [channels], channels, (0.0,) * 4, (1.0,) * 4)
    evaluation = SimpleNamespace(batch_size=16, recall_ks=(1, 2), metrics=("recall@K", "map@r"),
                                 scorer_mode="exact", rerank_top=5, clustering="harness",
                                 rerank="k_reciprocal:k1=6,k2=3,lambda=0.3")  # fmt: skip
    protocol = SimpleNamespace(evaluation=evaluation, augmentation=AugmentationSpec(),
                               backbone=SimpleNamespace(input_size=1), precision="fp32")  # fmt: skip
    gen = torch.Generator().manual_seed(6)
    images = torch.randint(0, 256, (48, channels, 1, 1), generator=gen, dtype=torch.uint8)
    labels = np.arange(48) % 6
    emb = images.float().div(255.0).flatten(1)
    ctx = RunContext(protocol, 0, torch.device("cpu"))
    got = evaluate(ctx, backbone, Method(head=_Pooled()), images, labels, neighbours=5)
    names = ["recall@1", "recall@2", "map@r"]
    expected, _ = reranked_metrics(emb, labels, rerank=evaluation.rerank, metrics=names)
    assert got.metrics == expected and got.metrics != compute_metrics(emb, labels, metrics=names)
    assert got.timings["rerank_seconds"] >= 0
    distances = k_reciprocal_distances(emb, None, k1=6, k2=3, lambda_value=0.3)
    distances.fill_diagonal_(float("inf"))  # never its own neighbour
    order = torch.sort(distances, dim=1, stable=True).indices[:, :5].numpy()
    assert (got.neighbours == order).all()


# ---- evaluate --rerank ------------------------------------------------------------------------


def evaluate_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["evaluate", *args, "--json"]) == 0
    out = capsys.readouterr()
    printed = json.loads(out.out)
    assert out.err.splitlines() == printed["warnings"]
    return printed


def test_evaluate_files_with_rerank(tmp_path: Path, capsys):
    x, labels = clustered()
    np.save(tmp_path / "e.npy", x.astype(np.float32))
    np.save(tmp_path / "l.npy", labels)
    files = ["--embeddings", str(tmp_path / "e.npy"), "--labels", str(tmp_path / "l.npy"),
             "--clustering", "harness"]  # fmt: skip
    printed = evaluate_json(capsys, *files, "--rerank", "k_reciprocal:k1=20")
    text, seconds = printed.pop("rerank"), printed.pop("rerank_seconds")
    assert text == "k_reciprocal:k1=20,k2=6,lambda=0.3" and seconds >= 0
    note = printed.pop("warnings")[-1]
    assert note.startswith(f"note: retrieval metrics ranked by the re-ranking {text} (")
    expected, _ = reranked_metrics(x.astype(np.float32), labels, rerank=text)
    assert printed == pytest.approx(expected, abs=1e-12)
    query = np.arange(300) % 3 == 0
    np.save(tmp_path / "q.npy", x[query].astype(np.float32))
    np.save(tmp_path / "ql.npy", labels[query])
    np.save(tmp_path / "e.npy", x[~query].astype(np.float32))
    np.save(tmp_path / "l.npy", labels[~query])
    printed = evaluate_json(capsys, *files, "--query-embeddings", str(tmp_path / "q.npy"),
                            "--query-labels", str(tmp_path / "ql.npy"), "--rerank", "aqe_dba")  # fmt: skip
    assert printed["rerank"] == "aqe_dba:alpha=3,n=2"
    expected, _ = reranked_metrics(x[query].astype(np.float32), labels[query],
                                   x[~query].astype(np.float32), labels[~query],
                                   rerank="aqe_dba")  # fmt: skip
    assert {k: printed[k] for k in expected} == pytest.approx(expected, abs=1e-12)
    capsys.readouterr()
    assert main(["evaluate", *files, "--rerank", "k_recip"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: --rerank k_recip: unknown re-ranking 'k_recip' (did you mean "
                   "'k_reciprocal'?); choose one of none, k_reciprocal, aqe_dba")  # fmt: skip


def saved_folder(folder: Path, x: np.ndarray, labels: np.ndarray, ranking: dict) -> Path:
    """A format-1 folder as `run --save-embeddings` writes it, all-vs-all."""
    folder.mkdir()
    np.save(folder / "embeddings.npy", x.astype(np.float32))
    np.save(folder / "labels.npy", labels.astype(np.int64))
    meta = {"format": 1, "method": "some_method", "mode": "all_vs_all", "recall_ks": [1, 2],
            "metrics": ["recall@1", "recall@2", "map@r"], "clustering": "harness",
            "kmeans_seed": 0, "ranking": ranking}  # fmt: skip
    (folder / "embeddings.json").write_text(json.dumps(meta))
    return folder


def test_evaluate_dir_reranks_as_its_run_did(tmp_path: Path, capsys):
    x, labels = clustered()
    names = ["recall@1", "recall@2", "map@r"]
    text = "k_reciprocal:k1=20,k2=6,lambda=0.3"
    folder = saved_folder(tmp_path / "seed0.embeddings", x, labels,
                          {"ranking": "euclidean", "rerank": text})  # fmt: skip
    reranked, _ = reranked_metrics(x.astype(np.float32), labels, rerank=text, metrics=names)
    plain = compute_metrics(x.astype(np.float32), labels, metrics=names)
    printed = evaluate_json(capsys, str(folder))
    assert printed["rerank"] == text and printed["warnings"][0] == (
        f"note: re-ranked as the run was (evaluation.rerank: {text}); --rerank none for the "
        "Euclidean ranking")  # fmt: skip
    assert {k: printed[k] for k in names} == reranked
    printed = evaluate_json(capsys, str(folder), "--rerank", "none")
    assert "rerank" not in printed and {k: printed[k] for k in names} == plain
    assert printed["warnings"][0] == (f"warning: the run re-ranked by {text}, not by --rerank "
                                      "none: these are not the run's metrics")  # fmt: skip


def test_evaluate_dir_of_a_learned_scorer_run_reranks_its_euclidean_distances(
    tmp_path: Path, capsys
):
    x, labels = clustered()
    ranking = {"ranking": "learned_scorer", "mode": "exact", "rerank_top": None,
               "pair_scores": 90000}  # fmt: skip
    folder = saved_folder(tmp_path / "seed0.embeddings", x, labels, ranking)
    capsys.readouterr()
    assert main(["evaluate", str(folder)]) == 2  # refused, as without --rerank before
    assert "--euclidean" in capsys.readouterr().err
    printed = evaluate_json(capsys, str(folder), "--rerank", "aqe_dba")
    assert printed["warnings"][0] == ("warning: re-ranked from Euclidean distances, not by the "
                                      "run's learned scorer: these are not the run's metrics")  # fmt: skip
    names = ["recall@1", "recall@2", "map@r"]
    expected, _ = reranked_metrics(x.astype(np.float32), labels, rerank="aqe_dba", metrics=names)
    assert {k: printed[k] for k in names} == expected
