"""Quadruplet selection (Karaman et al. 2019): each miner on a hand-placed batch whose answer is
known, the loss against a value worked by hand, reproducible random draws, clear coarse-label
errors, and the distance-matrix form against gathered rows."""

from __future__ import annotations

import dataclasses
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
    ref_quadruplet_selection_distances,
    value_and_grad,
)
from harness.methods.quadruplet_selection import (
    HierarchicalHead,
    QuadrupletSelectionLoss,
    hypersphere_quadruplets,
    random_quadruplets,
)

import harness.sweep.runner
from harness.core import METHODS, Batch, Embedded, HarnessError, MethodContext, Quadruplets
from harness.sweep import RunSpec, execute


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


NAMES = ["quadruplet_random", "quadruplet_method1", "quadruplet_method2"]


# Seven points on the x-axis of the plane, so every distance is a difference of x.
#   idx:     0  1  2  3  4   5   6
#   x:       0  1  6  2  9  -3  14
#   fine:    A  A  A  B  B   C   C      coarse: A, B in block 0; C in block 1
X = torch.tensor([0.0, 1.0, 6.0, 2.0, 9.0, -3.0, 14.0], dtype=torch.float64)


EMB = torch.stack([X, torch.zeros_like(X)], dim=1)


BATCH = Batch(torch.tensor([0, 0, 0, 1, 1, 2, 2]), torch.tensor([0, 0, 0, 0, 0, 1, 1]))


# Per reference: n = the closest C, radius R = D(r, n); p+ among A (or B), p- among the other.
#   r=0: n=5 (3 < 14), R=3.  p+: 1 at 1 (in), 2 at 6 (out) -> 2.  p-: 3 at 2 (in), 4 at 9 (out) -> 4
#   r=1: n=5 (4 < 13), R=4.  p+: 0 at 1 (in), 2 at 5 (out) -> 2.  p-: 3 at 1 (in), 4 at 8 (out) -> 4
#   r=2: n=6 (8 < 9),  R=8.  p+: 0 at 6, 1 at 5: all in.            p-: 3 at 4, 4 at 3: all in
#        Method 1: none.  Method 2: the farthest inside: p+ = 0 (6), p- = 3 (4)
#   r=3: n=5 (5 < 12), R=5.  p+: 4 at 7 (out) -> 4.                   p-: 0 at 2, 1 at 1, 2 at 4: all in
#        Method 1: none (p+ alone is not enough).  Method 2: p- = 2, the farthest inside
#   r=4: n=6 (5 < 12), R=5.  p+: 3 at 7 (out) -> 3.  p-: 2 at 3 (in), 1 at 8, 0 at 9 (out) -> 1
#   r=5, r=6 (C): block 1 holds no other fine class, so no p-: no quadruplet.
METHOD1 = [(0, 2, 4, 5), (1, 2, 4, 5), (4, 3, 1, 6)]


METHOD2 = [(0, 2, 4, 5), (1, 2, 4, 5), (2, 0, 3, 6), (3, 4, 2, 5), (4, 3, 1, 6)]


def rows(q: Quadruplets) -> list[tuple[int, ...]]:
    return list(zip(*(t.tolist() for t in q.indices()), strict=True))


def test_method1_takes_the_closest_positives_beyond_the_hardest_negative():
    q = hypersphere_quadruplets(Embedded(EMB), BATCH, fallback=False)
    assert rows(q) == METHOD1
    assert q.evaluated == 7 * 6 // 2  # the dense distance matrix


def test_method2_falls_back_to_the_farthest_inside_the_hypersphere():
    q = hypersphere_quadruplets(Embedded(EMB), BATCH, fallback=True)
    assert rows(q) == METHOD2
    assert q.evaluated == 21


def test_a_candidate_on_the_sphere_is_inside():
    # 0: A at (0,0); 1: A at (2,0); 2: B at (-2,0); 3: C at (0,2) (coarse 1); A, B coarse 0.
    # r=0: n=3, R = 2 exactly; p+ = 1 at 2 (on the sphere: inside), p- = 2 at 2 (inside):
    #      Method 1 none; Method 2 the farthest inside: (0, 1, 2, 3).
    # r=1: n=3 at sqrt(8), p+ = 0 at 2 (inside), p- = 2 at 4 (outside): Method 2 (1, 0, 2, 3).
    # r=2: B has no second sample (no p+); r=3: block 1 has no other fine class (no p-).
    emb = torch.tensor([[0.0, 0.0], [2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]])
    batch = Batch(torch.tensor([0, 0, 1, 2]), torch.tensor([0, 0, 0, 1]))
    assert rows(hypersphere_quadruplets(Embedded(emb), batch, fallback=False)) == []
    assert rows(hypersphere_quadruplets(Embedded(emb), batch, fallback=True)) == [
        (0, 1, 2, 3),
        (1, 0, 2, 3),
    ]


def test_registered_miners_are_the_paper_rules():
    ctx = MethodContext((4,), 2, 3, 2)
    m1, m2 = (METHODS.get(n).build(ctx).miner for n in NAMES[1:])
    assert rows(m1(Embedded(EMB), BATCH)) == METHOD1
    assert rows(m2(Embedded(EMB), BATCH)) == METHOD2


def test_random_quadruplets_obey_the_constraints_and_are_reproducible():
    q = random_quadruplets(Embedded(EMB), BATCH)
    assert q.evaluated == 0  # it looks at labels only
    fine, coarse = BATCH.labels, BATCH.coarse_labels
    assert q.i.tolist() == [0, 1, 2, 3, 4]  # C has no p-: no quadruplet for 5, 6
    assert (q.j != q.i).all() and (fine[q.j] == fine[q.i]).all()
    assert (coarse[q.k] == coarse[q.i]).all() and (fine[q.k] != fine[q.i]).all()
    assert (coarse[q.l] != coarse[q.i]).all()
    again = random_quadruplets(Embedded(torch.randn(7, 2)), BATCH)  # embedding plays no part
    assert rows(again) == rows(q)


def test_random_quadruplets_cover_every_candidate_across_batches():
    """Seeded from the batch contents: reordered batches give other, but valid, draws; over
    40 orders reference A at x=0 meets both of its p+ (1, 2), both p- (3, 4), both n (5, 6)."""
    seen: dict[str, set[int]] = {"j": set(), "k": set(), "l": set()}
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        order = torch.randperm(7, generator=gen)
        batch = Batch(BATCH.labels[order], BATCH.coarse_labels[order])
        q = random_quadruplets(Embedded(EMB[order]), batch)
        at = (order[q.i] == 0).nonzero().item()
        for name in seen:
            seen[name].add(order[getattr(q, name)[at]].item())
    assert seen == {"j": {1, 2}, "k": {3, 4}, "l": {5, 6}}


# Two quadruplets with hand-placed distances (r, p+, p-, n) = (0, 1, 2, 3) and (4, 5, 6, 7):
#   q1: D(r,p+) = 0.5, D(r,p-) = 0.6, D(r,n) = 0.8;  q2: 0.3, 0.9, 1.5.
LOSS_EMB = torch.tensor(
    [[0, 0], [0.5, 0], [0, 0.6], [-0.8, 0], [10, 0], [10.3, 0], [10, 0.9], [8.5, 0]],
    dtype=torch.float64,
)


LOSS_BATCH = Batch(torch.tensor([0, 0, 1, 2, 0, 0, 1, 3]), torch.tensor([0, 0, 0, 1, 0, 0, 0, 1]))


LOSS_QUADS = Quadruplets(0, *(torch.tensor(c) for c in ([0, 4], [1, 5], [2, 6], [3, 7])))


def loss_inputs() -> Embedded:
    # fine logits: ln 3 at the true class of 4, 0 elsewhere -> p = 3 / (3 + 3), CE = ln 2;
    # coarse logits all 0 over 2 classes -> CE = ln 2.
    fine = torch.zeros(8, 4, dtype=torch.float64)
    fine[torch.arange(8), LOSS_BATCH.labels] = math.log(3)
    coarse = torch.zeros(8, 2, dtype=torch.float64)
    return Embedded(LOSS_EMB, {"fine_logits": fine, "coarse_logits": coarse})


def test_loss_matches_eqs_3_to_6_by_hand():
    # m1 = 0.2, m2 = 0.4 (Eq. 5):  q1: [0.5 + 0.2 - 0.6]_+ + [0.6 + 0.4 - 0.8]_+ = 0.1 + 0.2
    #                               q2: [0.3 + 0.2 - 0.9]_+ + [0.9 + 0.4 - 1.5]_+ = 0;  mean 0.15
    # global (Eq. 3), lambda = 1, t1 = 0.5, t2 = 0.6:
    #   D(r,p+) = {0.5, 0.3}: mean 0.4, var 0.01;  D(r,p-) = {0.6, 0.9}: mean 0.75, var 0.0225
    #   D(r,n) = {0.8, 1.5}: mean 1.15, var 0.1225
    #   first:  0.01 + 0.0225 + [0.4 - 0.75 + 0.5]_+ = 0.0325 + 0.15 = 0.1825
    #   second: 0.0225 + 0.1225 + [0.75 - 1.15 + 0.6]_+ = 0.145 + 0.2 = 0.345
    # Eq. 6 with weights fine 0.5, coarse 2, distance 1, global 0.5:
    #   0.5 ln 2 + 2 ln 2 + 0.15 + 0.5 (0.1825 + 0.345) = 2.5 ln 2 + 0.41375
    loss = QuadrupletSelectionLoss((0.5, 2.0, 1.0, 0.5), (0.2, 0.4, 0.5, 0.6), 1.0, 4, 2)
    value = loss(loss_inputs(), LOSS_BATCH, LOSS_QUADS)
    assert value.item() == pytest.approx(2.5 * math.log(2) + 0.41375, abs=1e-9)
    # no quadruplet: the two classification terms alone
    empty = Quadruplets(0, *(torch.zeros(0, dtype=torch.long),) * 4)
    value = loss(loss_inputs(), LOSS_BATCH, empty)
    assert value.item() == pytest.approx(2.5 * math.log(2), abs=1e-9)


def test_head_returns_embedding_and_both_logits():
    head = HierarchicalHead(8, 4, fine=5, coarse=3)
    out = head([torch.randn(6, 8)])
    assert out.embedding.shape == (6, 4)
    assert torch.allclose(out.embedding.norm(dim=1), torch.ones(6))
    assert out.extras["fine_logits"].shape == (6, 5) and out.extras["coarse_logits"].shape == (6, 3)


@pytest.mark.parametrize("name", NAMES)
def test_missing_or_bad_coarse_labels_are_one_line_errors(name: str):
    spec = METHODS.get(name)
    assert spec.needs_coarse_labels
    with pytest.raises(HarnessError, match="needs coarse labels"):
        spec.build(MethodContext((4,), 2, 3))
    method = spec.build(MethodContext((4,), 2, 3, 2))
    out = method.head([torch.randn(7, 4)])
    no_coarse = Batch(BATCH.labels)
    with pytest.raises(HarnessError, match="needs coarse labels but the batch has none") as err:
        method.miner(out, no_coarse)
    assert "\n" not in str(err.value)
    with pytest.raises(HarnessError, match="needs coarse labels"):
        method.loss(out, no_coarse, method.miner(out, BATCH))
    out_of_range = Batch(BATCH.labels, BATCH.coarse_labels + 1)  # coarse id 2 of 2 classes
    with pytest.raises(HarnessError, match="labels out of range"):
        method.loss(out, out_of_range, method.miner(out, out_of_range))


def test_runner_marks_a_dataset_without_coarse_labels_not_applicable(tmp_path, monkeypatch):
    real = harness.sweep.runner.prepare_data

    def without_coarse(protocol, data_root):
        prepared = real(protocol, data_root)
        data = dataclasses.replace(prepared.data, coarse_labels=None, coarse_names=None)
        return dataclasses.replace(prepared, data=data)

    monkeypatch.setattr(harness.sweep.runner, "prepare_data", without_coarse)
    spec = RunSpec(protocol="smoke", method="quadruplet_method2", seed=0, results_dir=str(tmp_path))
    status, path = execute(spec, progress=False)
    record = json.loads(path.read_text())
    assert status == "not_applicable" and record["status"] == "not_applicable"
    assert record["failure"] == "quadruplet_method2 needs coarse labels; glyphs has none"


def test_random_run_is_bit_reproducible(tmp_path: Path):
    """A protocol whose batches hold several classes of one Unicode block (8 x 2 of 12)."""
    protocol = tmp_path / "qsel.yaml"
    text = (Path(__file__).resolve().parents[2] / "protocols" / "smoke.yaml").read_text()
    text = text.replace("{classes_per_batch: 4, images_per_class: 4}",
                        "{classes_per_batch: 8, images_per_class: 2}")  # fmt: skip
    protocol.write_text(text)
    runs = []
    for folder in ("a", "b"):
        spec = RunSpec(protocol=str(protocol), method="quadruplet_random", seed=0,
                       results_dir=str(tmp_path / folder))  # fmt: skip
        status, path = execute(spec, progress=False)
        assert status == "ok"
        runs.append(json.loads(path.read_text()))
    a, b = runs
    assert a["tuples"]["mined"] > 0
    assert a["metrics"] == b["metrics"] and a["tuples"] == b["tuples"]
    assert a["training"]["epoch_loss"] == b["training"]["epoch_loss"]
