"""A method's hyperparameters are checked against what its build function declares before any
training: a wrong type in a protocol, a tuning overlay or a search space is a one-line error,
never a TypeError half-way through a run."""

from __future__ import annotations

from pathlib import Path

import harness.methods  # noqa: F401  (registers every method)
import pytest
import yaml

from harness.core import (
    METHODS,
    Choice,
    Float,
    HarnessError,
    Method,
    MethodContext,
    load_protocol,
    register_method,
)
from harness.sweep import overlay_path, plan


def test_numbers_take_ints_but_not_bools_or_strings():
    spec = METHODS.get("contrastive")
    assert spec.hyperparameters({"margin": 2})["margin"] == 2  # an int where a float is declared
    assert spec.hyperparameters({"margin": 0.5})["margin"] == 0.5
    for bad in ("fast", True, [1, 2], None):
        with pytest.raises(HarnessError, match="x.yaml: methods.contrastive.margin: method "
                           "contrastive takes a number for margin, got"):  # fmt: skip
            spec.hyperparameters({"margin": bad}, "x.yaml: methods.contrastive")


def test_lists_optionals_and_bools_go_by_the_declaration():
    spec = METHODS.get("hdc_contrastive")
    ok = spec.hyperparameters({"stages": [-2, -1], "hard_ratios": (1, 0.5), "head_dim": 64,
                               "cascade": False})  # fmt: skip
    assert ok["stages"] == [-2, -1] and ok["hard_ratios"] == [1, 0.5]  # tuples become lists
    assert spec.hyperparameters({"head_dim": None})["head_dim"] is None
    bad = {"stages": ([-1.5], "a list of integers"), "hard_ratios": (0.5, "a list of numbers"),
           "head_dim": ("64", "an integer or null"), "cascade": (1, "true or false"),
           "loss_weights": (["a"], "a list of numbers")}  # fmt: skip
    for key, (value, expected) in bad.items():
        with pytest.raises(HarnessError, match=f"{key}: method hdc_contrastive takes {expected}"):
            spec.hyperparameters({key: value})


def test_an_undeclared_int_default_takes_any_number():
    """Third-party signatures (pytorch-metric-learning's) write scale=64 for a float."""
    pytest.importorskip("pytorch_metric_learning")
    spec = METHODS.get("pml:ArcFaceLoss")
    assert spec.hyperparameters({"scale": 30.5})["scale"] == 30.5
    with pytest.raises(HarnessError, match="takes a number for scale, got str"):
        spec.hyperparameters({"scale": "big"})


def test_a_tuned_overlay_of_the_wrong_type_fails_at_plan_time(tmp_path: Path):
    protocol = load_protocol("smoke")
    path = overlay_path(tmp_path, protocol.name, "contrastive")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({
        "protocol_hash": protocol.hash, "method_version": METHODS.get("contrastive").version,
        "hyperparameters": {"margin": "fast"}, "study": {},
    }))  # fmt: skip
    with pytest.raises(HarnessError, match=r"contrastive.yaml: hyperparameters.margin: method "
                       "contrastive takes a number"):  # fmt: skip
        plan(protocol, ["contrastive"], tuned=True, results_dir=str(tmp_path))


def _build(ctx: MethodContext, *, count: int = 2, scale: float = 1.0) -> Method:
    raise AssertionError("never built")


@pytest.mark.parametrize("search", [{"count": Float(1, 4)}, {"scale": Choice((1.0, "big"))}])
def test_a_search_space_of_the_wrong_type_fails_at_registration(search):
    with pytest.raises(HarnessError, match="method test_bad_space: search"):
        register_method("test_bad_space", version=1, family="pairs", search=search)(_build)
    assert "test_bad_space" not in METHODS
