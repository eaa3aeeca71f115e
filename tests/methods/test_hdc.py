"""HDC (Yuan et al., ICCV 2017): the cascade's pair sets and loss on hand-worked batches, the
sets' sizes against h, cascade against the Caffe code's independent heads, the LDA score by
hand, a smoke run reporting every head, and the distance-matrix form against gathered rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import harness.methods  # noqa: F401
import pytest
import torch
from gathered_forms import (
    SEEDS,
    assert_same,
    random_batch,
    ref_contrastive_pair_loss,
    value_and_grad,
)
from harness.methods.hdc import CascadeLoss, CascadeMiner, CascadePairs, hardest

from harness.core import METHODS, Batch, Embedded, HarnessError, MethodContext, Pairs, all_pairs
from harness.evaluate import compute_metrics, lda_score
from harness.evaluate.metrics.report import _lda
from harness.report import render
from harness.sweep import RunSpec, execute


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


# Four items, classes [0, 0, 1, 1]; pairs in order (0,1)+ (0,2)- (0,3)- (1,2)- (1,3)- (2,3)+.
# Three 1-D heads and their per-pair losses, y D^2 + (1 - y) [1 - D]_+^2 (margin 1):
#   head 1 x = (0, .2, .5, .9):  D  .2  .5  .9  .3  .7  .4  ->  .04 .25 .01 .49 .09 .16
#   head 2 x = (0, .6, .7, .8):  D  .6  .7  .8  .1  .2  .1  ->  .36 .09 .04 .81 .64 .01
#   head 3 x = (0, .1, .95, .4): D  .1  .95 .4  .85 .3  .55 ->  .01 .0025 .36 .0225 .49 .3025
LABELS = torch.tensor([0, 0, 1, 1])


HEADS = {
    "head1": torch.tensor([[0.0], [0.2], [0.5], [0.9]]),
    "head2": torch.tensor([[0.0], [0.6], [0.7], [0.8]]),
    "head3": torch.tensor([[0.0], [0.1], [0.95], [0.4]]),
}


OUT = Embedded(torch.cat(list(HEADS.values()), dim=1), HEADS)


RATIOS = [1.0, 0.5, 0.5]


def pair_lists(mined: CascadePairs) -> list[list[tuple[int, int]]]:
    return [list(zip(p.first.tolist(), p.second.tolist(), strict=True)) for p in mined.heads]


def test_cascade_passes_the_previous_heads_hard_pairs_by_hand():
    # Head 1: all 6 pairs (h1 = 100 %). Head 2: the top 50 % of head 1's pairs by head 1's
    # loss: positive (2,3) (.16 > .04), negatives (1,2) .49 and (0,2) .25. Head 3: the top 50 %
    # of head 2's pairs by head 2's loss: positive (2,3) (ceil(0.5) = 1), negative (1,2) (.81 >
    # .09). Head 1 ranked 6 pairs, head 2 ranked 3: 9 losses evaluated.
    mined = CascadeMiner(1.0, RATIOS, cascade=True)(OUT, Batch(LABELS))
    assert pair_lists(mined) == [
        [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)],
        [(0, 2), (1, 2), (2, 3)],
        [(1, 2), (2, 3)],
    ]
    assert mined.evaluated == 9 and mined.count() == 11
    mined.check(4)


def test_independent_heads_rank_every_pair_by_their_own_loss_by_hand():
    # Caffe: head 2 by its own loss over all pairs: positive (0,1) .36, negatives (1,2) .81 and
    # (1,3) .64; head 3 by its own: positive (2,3) .3025, negatives (1,3) .49 and (0,3) .36.
    # Differs from the cascade at heads 2 and 3. Heads 2 and 3 ranked 6 pairs each.
    mined = CascadeMiner(1.0, RATIOS, cascade=False)(OUT, Batch(LABELS))
    assert pair_lists(mined) == [
        [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)],
        [(0, 1), (1, 2), (1, 3)],
        [(0, 3), (1, 3), (2, 3)],
    ]
    assert mined.evaluated == 12


def test_cascade_loss_matches_the_hand_worked_sum():
    # L_k = sum of head k's losses over its pairs / (2 x their number):
    # cascade:     L1 = 1.04 / 12, L2 = (.09 + .81 + .01) / 6, L3 = (.0225 + .3025) / 4
    # independent: L2 = (.36 + .81 + .64) / 6, L3 = (.36 + .49 + .3025) / 6
    batch = Batch(LABELS)
    cascade = CascadeMiner(1.0, RATIOS, cascade=True)(OUT, batch)
    independent = CascadeMiner(1.0, RATIOS, cascade=False)(OUT, batch)
    l1, l2, l3 = 1.04 / 12, 0.91 / 6, 0.325 / 4
    assert CascadeLoss(1.0, [1, 1, 1])(OUT, batch, cascade).item() == pytest.approx(l1 + l2 + l3)
    weighted = CascadeLoss(1.0, [1.0, 2.0, 0.5])(OUT, batch, cascade).item()
    assert weighted == pytest.approx(l1 + 2 * l2 + 0.5 * l3)  # sum_k lambda_k L_k
    got = CascadeLoss(1.0, [1, 1, 1])(OUT, batch, independent).item()
    assert got == pytest.approx(l1 + 1.81 / 6 + 1.1525 / 6)


def test_hardest_rounds_up_exactly_and_breaks_ties_by_order():
    # 50 positive pairs with losses 0..49 and 4 negatives with equal loss. Top 14 %: 0.14 x 50
    # is 7.000000000000001 in floats, but 7 pairs are meant: those of loss 43..49. Of the
    # tied negatives, ceil(0.14 x 4) = 1: the first one.
    n = 54
    pairs = Pairs(0, torch.arange(n), torch.arange(n) + 1, torch.arange(n) < 50)
    losses = torch.cat([torch.arange(50.0), torch.ones(4)])
    kept = hardest(pairs, losses, 0.14)
    assert kept.first.tolist() == [43, 44, 45, 46, 47, 48, 49, 50]


def pair_losses(emb: torch.Tensor, first, second, positive) -> torch.Tensor:
    d = (emb[first] - emb[second]).norm(dim=1)
    return torch.where(positive, d**2, (1 - d).clamp(min=0) ** 2)


@pytest.mark.parametrize("cascade", [True, False])
def test_pair_sets_shrink_as_h_says_and_keep_the_hardest(cascade: bool):
    # 5 classes x 4 images: 30 positive, 160 negative pairs. h = (100, 50, 20) %.
    # Cascade: 30/160, then 15/80, then 20 % of those: 3/16 (0.2 x 15 must not round to 4).
    # Independent (Caffe): 20 % of all pairs at head 3: 6/32.
    torch.manual_seed(0)
    labels = torch.arange(5).repeat_interleave(4)
    method = METHODS.get("hdc_contrastive").build(MethodContext((8, 8, 8), 4, 5), cascade=cascade)
    out = method.head([torch.randn(20, 8) for _ in range(3)])
    mined = method.miner(out, Batch(labels))
    sizes = [(int(p.positive.sum()), int((~p.positive).sum())) for p in mined.heads]
    assert sizes == ([(30, 160), (15, 80), (3, 16)] if cascade else [(30, 160), (15, 80), (6, 32)])
    everything = mined.heads[0]
    for k in (1, 2):
        kept = mined.heads[k]
        # the pool head k+1 chose from and the head whose loss ranked it
        pool, judge = (mined.heads[k - 1], k) if cascade else (everything, k + 1)
        pool_keys = list(zip(pool.first.tolist(), pool.second.tolist(), strict=True))
        kept_keys = set(zip(kept.first.tolist(), kept.second.tolist(), strict=True))
        assert kept_keys <= set(pool_keys)
        loss = pair_losses(out.extras[f"head{judge}"], pool.first, pool.second, pool.positive)
        is_kept = torch.tensor([key in kept_keys for key in pool_keys])
        for sign in (pool.positive, ~pool.positive):
            # every kept pair is at least as hard as every pair left out
            assert loss[sign & is_kept].min() >= loss[sign & ~is_kept].max()


def test_head_normalises_each_stage_and_concatenates():
    ctx = MethodContext((3, 4, 5, 6), embedding_dim=7, num_classes=2)
    method = METHODS.get("hdc_contrastive").build(ctx)
    assert method.head.stages == [1, 2, 3]  # the last three of four stages
    assert method.sub_embeddings == ("head1", "head2", "head3")
    feats = [torch.randn(5, d) for d in (3, 4, 5, 6)]
    out = method.head(feats)
    assert out.embedding.shape == (5, 21)  # 3 x embedding_dim
    for k in (1, 2, 3):
        assert torch.allclose(out.extras[f"head{k}"].norm(dim=1), torch.ones(5))
    assert torch.equal(out.embedding[:, 7:14], out.extras["head2"])
    other = METHODS.get("hdc_contrastive").build(ctx, stages=[0, 2, 3], head_dim=2)
    assert other.head.stages == [0, 2, 3] and other.head(feats).embedding.shape == (5, 6)


@pytest.mark.parametrize(
    "bad",
    [
        {"stages": [1, 2, 4]},  # the backbone has 4 stages
        {"stages": [3, 2, 1]},  # deep to shallow
        {"hard_ratios": [1.0, 0.5]},  # two ratios for three heads
        {"hard_ratios": [1.0, 0.0, 0.2]},  # 0 % keeps nothing
    ],
)
def test_bad_hyperparameters_are_clear_errors(bad: dict):
    with pytest.raises(HarnessError, match="hdc"):
        METHODS.get("hdc_contrastive").build(MethodContext((3, 4, 5, 6), 7, 2), **bad)


# LDA score, all-vs-all: x = (0, 1, 3, 6), classes (0, 0, 1, 1).
# Positive pairs (0,1) D 1, (2,3) D 3: m+ = 2, v+ = (1 + 1) / 2 = 1.
# Negative pairs (0,2) 3, (0,3) 6, (1,2) 2, (1,3) 5: m- = 4, v- = (1 + 4 + 4 + 1) / 4 = 2.5.
# LDA = (4 - 2)^2 / (1 + 2.5) = 8 / 7 (above 1: a ratio, not clamped to [0, 1]).
LDA_X = torch.tensor([[0.0], [1.0], [3.0], [6.0]])


LDA_Y = torch.tensor([0, 0, 1, 1])


def test_lda_score_by_hand():
    assert lda_score(LDA_X, LDA_Y) == pytest.approx(8 / 7)
    assert compute_metrics(LDA_X, LDA_Y, metrics=["lda"]) == pytest.approx({"lda": 8 / 7})
    # one distance per chunk: the chunks' moments merge to the same value
    assert _lda(LDA_X, LDA_Y, LDA_X, LDA_Y, all_vs_all=True, chunk_elements=1) == pytest.approx(
        8 / 7
    )
    # query/gallery: queries 0 (class 0) and 4 (class 1), gallery 1 (0), 2 (1), 5 (0).
    # Positive D: 1, 5 (query 0), 2 (query 4): m+ = 8/3, v+ = (25 + 49 + 4) / 27 = 26/9.
    # Negative D: 2 (query 0), 3, 1 (query 4): m- = 2, v- = 2/3.
    # LDA = (2 - 8/3)^2 / (26/9 + 6/9) = (4/9) / (32/9) = 1/8.
    q, g = torch.tensor([[0.0], [4.0]]), torch.tensor([[1.0], [2.0], [5.0]])
    assert lda_score(q, [0, 1], g, [0, 1, 0]) == pytest.approx(1 / 8)


def test_lda_degenerate_and_bad_input():
    # a collapsed embedding: every distance 0, no separation at all (0, not 0/0)
    assert lda_score(torch.zeros(4, 2), LDA_Y) == 0.0
    # positive D 0; negatives D 2 and 2: both variances 0, means apart -> inf
    assert lda_score(torch.tensor([[0.0], [0.0], [2.0]]), [0, 0, 1]) == math.inf
    with pytest.raises(HarnessError, match="lda needs positive and negative pairs"):
        lda_score(LDA_X, [0, 1, 2, 3])


def test_smoke_run_reports_every_head_and_reruns_are_skipped(tmp_path: Path):
    spec = RunSpec(
        protocol="smoke", method="hdc_contrastive", seed=0, results_dir=str(tmp_path), max_steps=2
    )
    status, path = execute(spec, progress=False)
    result = json.loads(path.read_text())
    assert status == "ok", result.get("failure")
    assert result["method"]["hyperparameters"]["hard_ratios"] == [1.0, 0.5, 0.2]
    assert result["tuples"]["kind"] == "cascadepairs"
    # 4 x 4 batch: 24+96 pairs, then 12+48, then ceil(2.4)=3 + ceil(9.6)=10 -> 193 per step
    assert result["tuples"]["mined"] == 2 * 193
    assert "lda" in result["metrics"]
    parts = result["metrics_by_part"]
    assert list(parts) == ["head1", "head2", "head3"]
    assert all(list(m) == list(result["metrics"]) for m in parts.values())
    table = render([result])
    assert "hdc_contrastive / head1" in table and "hdc_contrastive / head3" in table
    # tuple defaults are recorded as lists, so the same run is recognised and skipped
    assert execute(spec, progress=False)[0] == "skipped"
