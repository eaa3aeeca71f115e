"""Shared loss pieces against values worked by hand."""

import pytest
import torch

from methods._pair_losses import global_loss


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
