"""Every registered method (parametrized over the registry, as timm does) trains a few steps
under the smoke protocol and changes the embedding; the registry checks names and overrides."""

from __future__ import annotations

import json
import math
from pathlib import Path

import harness.methods  # noqa: F401
import pytest
import torch

from harness.core import METHODS, Batch, HarnessError, MethodContext, Registry, register_method
from harness.sweep import RunSpec, execute


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_trains_and_evaluates_on_smoke(name: str, tmp_path: Path):
    status, path = execute(
        RunSpec(protocol="smoke", method=name, seed=0, results_dir=str(tmp_path)), progress=False
    )
    result = json.loads(path.read_text())
    assert status == "ok", result.get("failure")
    assert 0 <= result["metrics"]["recall@1"] <= 1
    if METHODS.get(name).build(MethodContext((16,), 8, 4, 2)).trains:
        assert result["training"]["steps"] == 4
        assert all(math.isfinite(v) for v in result["training"]["epoch_loss"])


@pytest.mark.parametrize("name", METHODS.names())
def test_training_changes_the_embedding(name: str):
    """A trained method's parameters move; an untrained one has none to move."""
    spec = METHODS.get(name)
    torch.manual_seed(0)  # before the build: its initial weights must not depend on test order
    method = spec.build(MethodContext((8,), 4, 3, 2))
    if not method.trains:
        assert sum(p.numel() for p in method.head.parameters()) == 0
        return
    features = [torch.randn(12, 8, requires_grad=True)]
    labels = torch.arange(3).repeat_interleave(4)
    out = method.head(features)
    batch = Batch(labels, torch.tensor([0, 0, 1]).repeat_interleave(4))  # 2 coarse classes
    mined = method.miner(out, batch) if method.miner else None
    loss = method.loss(out, batch, mined)
    loss.backward()
    assert features[0].grad is not None and features[0].grad.abs().sum() > 0


@pytest.mark.parametrize("name", METHODS.names())
def test_declared_family_is_what_the_miner_returns(name: str):
    """The family the figures group a method by is the kind of tuples its miner hands the
    loss; a method with nothing to mine declares "proxies" (trains) or "none" (does not)."""
    spec = METHODS.get(name)
    method = spec.build(MethodContext((8,), 4, 3, 2))
    if method.miner is None:
        assert spec.family == ("proxies" if method.trains else "none")
        return
    torch.manual_seed(0)
    labels = torch.arange(3).repeat_interleave(4)
    batch = Batch(labels, torch.tensor([0, 0, 1]).repeat_interleave(4))
    with torch.no_grad():
        mined = method.miner(method.head([torch.randn(12, 8)]), batch)
    assert type(mined).family == spec.family


def test_unknown_family_is_refused_with_a_suggestion():
    with pytest.raises(HarnessError, match="unknown method family 'pair' \\(did you mean 'pairs'"):
        register_method("x", version=1, family="pair")


def test_hyperparameter_overrides_are_checked():
    spec = METHODS.get("contrastive")
    assert spec.defaults() == {"margin": 1.0}
    assert spec.hyperparameters({"margin": 0.5}) == {"margin": 0.5}
    with pytest.raises(
        HarnessError, match="no hyperparameter 'margn' \\(did you mean 'margin'\\?\\)"
    ):
        spec.hyperparameters({"margn": 0.5})


def test_registry_rejects_duplicates_and_suggests_names():
    reg: Registry[int] = Registry("thing")
    reg.add("alpha", 1)
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("alpha", 2)
    with pytest.raises(HarnessError, match="unknown thing 'alpah' \\(did you mean 'alpha'\\?\\)"):
        reg.get("alpah")
