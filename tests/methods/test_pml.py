"""`pml:<LossClass>[+<MinerClass>]` methods and the adapter every PML-backed method uses: typed
tuples to PML's index tuples and back, the same loss as PML's own call, keyword overrides
checked against the class's signature, and training on smoke for a handful of classes."""

from __future__ import annotations

import json
from pathlib import Path

import harness.methods  # noqa: F401
import pytest
import torch
from harness.methods._pml import AllTuples, PmlMiner, pml_listing, to_indices, to_tuples
from pml_cases import batch
from pytorch_metric_learning import losses, miners

from harness.core import METHODS, HarnessError, MethodContext, Pairs, Triplets
from harness.sweep import RunSpec, execute


def test_index_tuples_round_trip_through_typed_tuples():
    out, b = batch(0)
    pairs = miners.MultiSimilarityMiner()(out.embedding, b.labels)
    typed = to_tuples(pairs, 66)
    assert isinstance(typed, Pairs) and typed.count() == len(pairs[0]) + len(pairs[2])
    assert all(torch.equal(x, y) for x, y in zip(to_indices(typed), pairs, strict=True))
    triplets = miners.BatchHardMiner()(out.embedding, b.labels)
    typed = to_tuples(triplets, 66)
    assert isinstance(typed, Triplets)
    assert all(torch.equal(x, y) for x, y in zip(to_indices(typed), triplets, strict=True))


@pytest.mark.parametrize(
    "loss, kind", [(losses.TripletMarginLoss(), "triplets"), (losses.CircleLoss(), "pairs")]
)
def test_all_tuples_give_what_pml_does_with_no_miner(loss, kind):
    out, b = batch(1)
    mined = AllTuples(kind)(out, b)
    assert float(loss(out.embedding, b.labels, to_indices(mined))) == pytest.approx(
        float(loss(out.embedding, b.labels)), rel=1e-12
    )


def test_a_pml_miner_counts_the_distances_it_computed():
    out, b = batch(2)
    mined = PmlMiner(miners.BatchHardMiner())(out, b)
    assert mined.evaluated == 12 * 11 // 2 and mined.count() == 12


@pytest.mark.parametrize(
    "name, family",
    [("pml:TupletMarginLoss", "pairs"), ("pml:TripletMarginLoss+BatchHardMiner", "triplets"),
     ("pml:ProxyAnchorLoss", "proxies"), ("pml:FastAPLoss", "batch"),
     ("pml:MultiSimilarityLoss+MultiSimilarityMiner", "pairs")],
)  # fmt: skip
def test_any_pml_loss_by_name_trains_on_smoke(name: str, family: str, tmp_path: Path):
    spec = METHODS.get(name)
    assert spec.family == family and name not in METHODS.names()  # not part of --all
    status, path = execute(RunSpec(protocol="smoke", method=name, seed=0,
                                   results_dir=str(tmp_path)), progress=False)  # fmt: skip
    result = json.loads(path.read_text())
    assert status == "ok", result.get("failure")
    assert result["method"]["name"] == name and result["training"]["steps"] == 4
    assert result["environment"]["packages"]["pytorch-metric-learning"]


def test_pml_keywords_are_the_class_signature_and_checked():
    spec = METHODS.get("pml:TripletMarginLoss+BatchHardMiner")
    assert spec.defaults()["margin"] == 0.05 and spec.defaults()["loss_lr_multiplier"] == 1.0
    method = spec.build(MethodContext((8,), 6, 5), **spec.hyperparameters({"margin": 0.3}))
    assert method.loss.loss.margin == 0.3
    with pytest.raises(HarnessError, match="no hyperparameter 'margn'.*takes: margin, swap"):
        spec.hyperparameters({"margn": 0.3})
    assert "miner_epsilon" in METHODS.get("pml:MultiSimilarityLoss+MultiSimilarityMiner").defaults()


@pytest.mark.parametrize(
    "name, message",
    [("pml:TripletMarginLos", "no loss 'TripletMarginLos'.*did you mean 'TripletMarginLoss'"),
     ("pml:TripletMarginLoss+BatchHard", "no miner 'BatchHard'.*did you mean 'BatchHardMiner'"),
     ("pml:VICRegLoss", "no loss 'VICRegLoss'")],
)  # fmt: skip
def test_unknown_pml_classes_are_one_line_errors(name: str, message: str):
    with pytest.raises(HarnessError, match=message):
        METHODS.get(name)
    assert name not in METHODS


def test_the_listing_names_losses_and_miners():
    listing = pml_listing()
    assert {"TupletMarginLoss", "ProxyAnchorLoss", "+BatchHardMiner"} <= set(listing)
    assert "GenericPairLoss" not in listing and "VICRegLoss" not in listing
    assert METHODS.prefixes()["pml"] == listing


def test_a_protocol_overrides_a_pml_method(tmp_path: Path):
    import yaml

    from harness.core import PROTOCOL_DIR

    data = yaml.safe_load((PROTOCOL_DIR / "smoke.yaml").read_text())
    data["methods"] = {"pml:TupletMarginLoss": {"margin": 3.0}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    status, result = execute(RunSpec(protocol=str(path), method="pml:TupletMarginLoss", seed=0,
                                     results_dir=str(tmp_path / "r")), progress=False)  # fmt: skip
    assert status == "ok"
    assert json.loads(result.read_text())["method"]["hyperparameters"]["margin"] == 3.0


def test_resolving_a_name_leaves_the_seeded_random_stream_alone():
    """The family probe runs a sampling miner; a run's seeded stream must not see it."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert METHODS.get("pml:TripletMarginLoss+DistanceWeightedMiner").family == "triplets"
    assert torch.equal(torch.rand(3), expected)
