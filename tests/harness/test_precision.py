"""Mixed precision: the backbone and head compute in bf16/fp16 under autocast, mining and the
loss see float32, fp16's loss scaler is checkpointed, and results record the precision."""

from __future__ import annotations

import dataclasses
import json

import harness.methods  # noqa: F401
import numpy as np
import pytest
import torch
import yaml
from tiny_training import crash_after_epoch_2, fresh_contrastive, tiny_images

from harness.cli import main
from harness.core import PROTOCOL_DIR, HarnessError, RunContext, load_protocol, parse_protocol
from harness.train import Checkpoint, EpochHooks, Model, TrainingSet, train

CPU = torch.device("cpu")


def _setup(precision: str, steps: int = 6):
    protocol = load_protocol("smoke")
    protocol = dataclasses.replace(
        protocol, precision=precision, budget=dataclasses.replace(protocol.budget, steps=steps)
    )
    return protocol, *tiny_images()


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_the_backbone_computes_in_low_precision_and_the_loss_in_float32(precision, dtype):
    protocol, images, labels = _setup(precision)
    backbone, method = fresh_contrastive(protocol)
    seen: dict[str, set] = {"conv": set(), "loss": set()}
    first_conv = next(m for m in backbone.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_hook(lambda m, i, o: seen["conv"].add(o.dtype))
    method.loss.register_forward_pre_hook(lambda m, args: seen["loss"].add(args[0].embedding.dtype))
    stats = train(
        RunContext(protocol, 0, CPU), Model(backbone, method), TrainingSet(images, labels)
    )
    assert seen == {"conv": {dtype}, "loss": {torch.float32}}
    assert all(np.isfinite(stats.epoch_loss)) and stats.steps == 6
    assert all(p.dtype == torch.float32 for p in backbone.parameters())  # float32 master weights


def test_fp16_resumes_bit_identically_with_its_loss_scaler(tmp_path):
    protocol, images, labels = _setup("fp16", steps=9)  # 3 steps per epoch
    backbone, method = fresh_contrastive(protocol)
    whole = train(
        RunContext(protocol, 0, CPU), Model(backbone, method), TrainingSet(images, labels)
    )
    expected = {k: v.clone() for k, v in backbone.state_dict().items()}

    backbone, method = fresh_contrastive(protocol)
    with pytest.raises(KeyboardInterrupt):
        train(
            RunContext(protocol, 0, CPU),
            Model(backbone, method),
            TrainingSet(images, labels),
            checkpoint=Checkpoint(tmp_path / "c.pt", "a"),
            hooks=EpochHooks(on_epoch_end=crash_after_epoch_2),
        )
    saved = torch.load(tmp_path / "c.pt", weights_only=False)
    assert saved["scaler"]["scale"] > 0  # the scaler's state travels with the checkpoint
    backbone, method = fresh_contrastive(protocol)
    resumed = train(
        RunContext(protocol, 0, CPU),
        Model(backbone, method),
        TrainingSet(images, labels),
        checkpoint=Checkpoint(tmp_path / "c.pt", "a"),
    )
    assert resumed.resumed_from_step == 6 and resumed.epoch_loss == whole.epoch_loss
    assert all(torch.equal(backbone.state_dict()[k], expected[k]) for k in expected)


def test_precision_is_protocol_data():
    data = yaml.safe_load((PROTOCOL_DIR / "smoke.yaml").read_text())
    assert "precision" not in load_protocol("smoke").content()  # fp32: older hashes kept
    data["precision"] = "bf16"
    assert parse_protocol(data, "p.yaml").content()["precision"] == "bf16"
    data["precision"] = "fp8"
    with pytest.raises(HarnessError, match="precision must be fp32, bf16 or fp16, got 'fp8'"):
        parse_protocol(data, "p.yaml")


def test_run_precision_overrides_the_protocol_and_the_result_records_it(tmp_path):
    args = ["-q", "run", "--protocol", "smoke", "--method", "contrastive", "--precision", "bf16",
            "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    result = json.loads((tmp_path / "runs/smoke/contrastive/seed0.json").read_text())
    assert result["protocol"]["content"]["precision"] == "bf16"
    assert result["protocol"]["hash"] != load_protocol("smoke").hash
    assert result["status"] == "ok" and 0 <= result["metrics"]["map@r"] <= 1
