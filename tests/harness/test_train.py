"""The training loop's bookkeeping: losses read back in windows, exact failure steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import harness.methods  # noqa: F401
import numpy as np
import pytest
import torch

from harness.backbones import build_backbone
from harness.core import (
    Batch,
    Embedded,
    EmbeddingHead,
    Method,
    PhaseTimer,
    RunContext,
    TrainingFailed,
    load_protocol,
)
from harness.train import (
    LOSS_READBACK_STEPS,
    Checkpoint,
    EpochHooks,
    Model,
    TrainingSet,
    TrainingState,
    train,
)

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


class NanFrom(torch.nn.Module):
    """A loss that is finite until step `bad`, then NaN; counts its calls."""

    def __init__(self, bad: int) -> None:
        super().__init__()
        self.bad, self.calls = bad, 0

    def forward(self, out: Embedded, batch: Batch, mined: None) -> torch.Tensor:
        self.calls += 1
        value = out.embedding.pow(2).mean()
        return value * float("nan") if self.calls > self.bad else value


def setup(steps: int):
    protocol = load_protocol("smoke")
    protocol = dataclasses.replace(
        protocol, budget=dataclasses.replace(protocol.budget, steps=steps)
    )
    torch.manual_seed(0)
    backbone = build_backbone(protocol.backbone, 1)
    images = torch.randint(0, 255, (48, 1, 16, 16), dtype=torch.uint8)
    labels = np.repeat(np.arange(6), 8)
    return protocol, backbone, images, labels


def test_a_nan_inside_a_readback_window_is_reported_at_its_exact_step():
    protocol, backbone, images, labels = setup(40)
    loss = NanFrom(bad=7)  # steps 0..6 finite, step 7 the first NaN
    method = Method(head=EmbeddingHead(16, 8), loss=loss)
    with pytest.raises(TrainingFailed, match=r"loss became nan at step 7 "):
        train(RunContext(protocol, 0, CPU), Model(backbone, method), TrainingSet(images, labels))
    # it is noticed at the latest at the end of its read-back window, never later
    assert 8 <= loss.calls <= LOSS_READBACK_STEPS


def test_epoch_losses_are_the_means_of_the_step_losses():
    protocol, backbone, images, labels = setup(12)  # 48 images / 16 per batch: 3 per epoch
    method = Method(head=EmbeddingHead(16, 8, normalize=False), loss=NanFrom(bad=10**9))
    stats = train(
        RunContext(protocol, 0, CPU), Model(backbone, method), TrainingSet(images, labels)
    )
    assert stats.steps == 12 and len(stats.epoch_loss) == 4
    assert all(np.isfinite(stats.epoch_loss)) and stats.epoch_loss[-1] < stats.epoch_loss[0]


def test_phase_timer_accumulates_on_the_cpu():
    timer = PhaseTimer(CPU)
    for _ in range(3):
        with timer.phase("mining"):
            sum(range(10000))
    assert timer.seconds["mining"] > 0 and set(timer.seconds) == {"mining"}


def test_the_best_validation_epoch_is_kept_and_recorded():
    protocol, backbone, images, labels = setup(12)  # 3 steps per epoch: 4 epochs
    method = Method(head=EmbeddingHead(16, 8, normalize=False), loss=NanFrom(bad=10**9))
    scores = iter([0.1, 0.5, 0.2, 0.4])  # epoch 2 is the best
    snapshots = {}

    def snapshot(epoch: int) -> None:
        snapshots[epoch] = {k: v.clone() for k, v in method.head.state_dict().items()}

    stats = train(
        RunContext(protocol, 0, CPU),
        Model(backbone, method),
        TrainingSet(images, labels),
        validate=lambda: next(scores),
        hooks=EpochHooks(on_epoch_end=snapshot),
    )
    assert stats.validation == [0.1, 0.5, 0.2, 0.4] and stats.best_epoch == 2
    final = method.head.state_dict()
    assert all(torch.equal(final[k], snapshots[2][k]) for k in final)
    assert not all(torch.equal(final[k], snapshots[4][k]) for k in final)
    assert method.head.training  # back in train mode after each validation


@pytest.mark.parametrize("select_by", ["map@r", "recall@2"])
def test_a_protocol_with_validation_classes_selects_on_them(tmp_path, select_by):
    import json

    import yaml

    from harness.sweep import RunSpec, execute

    spec = yaml.safe_load((REPO / "protocols" / "smoke.yaml").read_text())
    spec["split"] = {"train_fraction": 0.5, "validation_fraction": 0.34}
    spec["budget"] = {"steps": 6}
    spec["evaluation"]["select_by"] = select_by
    path = tmp_path / "withval.yaml"
    path.write_text(yaml.safe_dump(spec))
    status, out = execute(RunSpec(str(path), "contrastive", 0, results_dir=str(tmp_path)),
                          progress=False)  # fmt: skip
    result = json.loads(out.read_text())
    assert status == "ok" and result["split"]["validation_classes"] == 4
    selection = result["selection"]
    assert selection["metric"] == select_by and selection["split"] == "validation"
    assert len(selection["per_epoch"]) == len(result["training"]["epoch_loss"]) >= 2
    assert selection["best_epoch"] == 1 + selection["per_epoch"].index(max(selection["per_epoch"]))


def _contrastive(protocol, backbone):
    from harness.core import METHODS, MethodContext

    ctx = MethodContext(tuple(backbone.stage_dims), protocol.embedding_dim, 6)
    return METHODS.get("contrastive").build(ctx)


@pytest.mark.parametrize("channels_last", [False, True])
def test_an_interrupted_train_resumes_bit_identically(tmp_path: Path, channels_last: bool):
    """train() itself, interrupted after epoch 2 of 4 and resumed from its checkpoint, ends
    with exactly the weights and losses of an uninterrupted call (sampler, RNG and
    optimizer state all restored), in either memory format."""
    protocol, _, images, labels = setup(12)  # 3 steps per epoch: 4 epochs
    backbone_spec = dataclasses.replace(protocol.backbone, channels_last=channels_last)
    protocol = dataclasses.replace(protocol, backbone=backbone_spec)

    def fresh():
        torch.manual_seed(0)
        backbone = build_backbone(protocol.backbone, 1)
        return backbone, _contrastive(protocol, backbone)

    backbone, method = fresh()
    whole = train(
        RunContext(protocol, 0, CPU), Model(backbone, method), TrainingSet(images, labels)
    )
    expected = {k: v.clone() for k, v in backbone.state_dict().items()}

    def crash(epoch: int) -> None:
        if epoch == 2:
            raise KeyboardInterrupt

    ckpt = tmp_path / "run.pt"
    backbone, method = fresh()
    with pytest.raises(KeyboardInterrupt):
        train(
            RunContext(protocol, 0, CPU),
            Model(backbone, method),
            TrainingSet(images, labels),
            checkpoint=Checkpoint(ckpt, "a"),
            hooks=EpochHooks(on_epoch_end=crash),
        )
    assert ckpt.exists()
    torch.manual_seed(123)  # the checkpoint restores the RNG, whatever happened meanwhile
    backbone, method = fresh()
    resumed = train(
        RunContext(protocol, 0, CPU),
        Model(backbone, method),
        TrainingSet(images, labels),
        checkpoint=Checkpoint(ckpt, "a"),
    )
    assert resumed.resumed_from_step == 6 and resumed.steps == whole.steps == 12
    assert resumed.epoch_loss == whole.epoch_loss
    assert resumed.tuples_mined == whole.tuples_mined
    final = backbone.state_dict()
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    # a checkpoint of another configuration is not resumed: training starts afresh, and that
    # checkpoint is kept aside (that run may still be resumed), never overwritten
    backbone, method = fresh()
    other = train(
        RunContext(protocol, 0, CPU),
        Model(backbone, method),
        TrainingSet(images, labels),
        checkpoint=Checkpoint(ckpt, "b"),
    )
    assert other.resumed_from_step == 0 and other.epoch_loss == whole.epoch_loss
    (aside,) = tmp_path.glob("run-other-*.pt")
    assert torch.load(aside, weights_only=False)["identity"] == "a"
    assert torch.load(ckpt, weights_only=False)["identity"] == "b"


def test_a_channels_last_backbone_is_the_same_network_in_nhwc():
    """backbone.channels_last: the same initial weights and the same features (to float
    rounding), with weights and prepared images in NHWC, and still NHWC after training."""
    protocol, _, images, labels = setup(4)
    nhwc_spec = dataclasses.replace(protocol.backbone, channels_last=True)
    torch.manual_seed(0)  # 3 channels: a 1-channel tensor is contiguous in both formats
    nchw = build_backbone(protocol.backbone, 3)
    torch.manual_seed(0)
    nhwc = build_backbone(nhwc_spec, 3)
    convs = [m for m in nhwc.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    x = nhwc.prepare(images)
    assert x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] == 3
    assert not nchw.prepare(images).is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(nchw.state_dict().values(), nhwc.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(nchw(nchw.prepare(images)), nhwc(x), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    protocol = dataclasses.replace(protocol, backbone=nhwc_spec)
    train(
        RunContext(protocol, 0, CPU),
        Model(nhwc, _contrastive(protocol, nhwc)),
        TrainingSet(images, labels),
    )
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)


def test_training_state_saves_what_a_resume_needs(tmp_path: Path):

    protocol, backbone, _, labels = setup(12)
    method = _contrastive(protocol, backbone)
    ctx = RunContext(protocol, 0, CPU)
    state = TrainingState(Model(backbone, method), labels, ctx)
    state.sampler.next_batch()
    state.stats.steps, state.stats.validation = 5, [0.2, 0.7]
    state.keep_if_best()
    assert state.stats.best_epoch == 2 and state.best_state is not None
    state.save(Checkpoint(tmp_path / "s.pt", "me"))
    saved = torch.load(tmp_path / "s.pt", weights_only=False)
    assert set(saved) == {"identity", "modules", "optimizer", "scaler", "sampler", "torch_rng",
                          "cuda_rng", "stats", "best_state"}  # fmt: skip
    again = TrainingState(Model(backbone, method), labels, ctx)
    assert again.resume(Checkpoint(tmp_path / "s.pt", "me"))
    assert again.stats.steps == 5 and again.stats.resumed_from_step == 5
    assert np.array_equal(again.sampler.next_batch(), state.sampler.next_batch())
    other = TrainingState(Model(backbone, method), labels, ctx)
    assert not other.resume(
        Checkpoint(tmp_path / "s.pt", "someone else")
    )  # kept aside for its own run
    assert other.stats.steps == 0 and len(list(tmp_path.glob("s-other-*.pt"))) == 1


def test_the_split_backward_step_trains_like_the_plain_one():
    """The cost command's step (backward split at the head's outputs, to time the loss
    alone) reaches the same parameters as the training loop's step."""
    from harness.train import TrainingStep, make_optimizer

    protocol, _, images, labels = setup(12)
    results = []
    for split in (False, True):
        torch.manual_seed(0)
        backbone = build_backbone(protocol.backbone, 1)
        method = _contrastive(protocol, backbone)
        params = [*backbone.parameters(), *method.head.parameters()]
        step = TrainingStep(Model(backbone, method), make_optimizer(params, protocol),
                            TrainingSet(images, labels), RunContext(protocol, 0, CPU),
                            split_backward=split)  # fmt: skip
        outcome = step(torch.arange(16), check_indices=True)
        assert outcome.trained and outcome.images == 16 and outcome.mined.count() > 0
        assert step.timer.seconds["mining"] > 0 and step.timer.seconds["loss"] > 0
        results.append([p.detach().clone() for p in params])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*results, strict=True))


def test_the_model_builder_seeds_as_the_runner_always_did():
    """build_model: seed, backbone, then the method's head drawing from the same RNG; the
    numbers of every committed result depend on this order."""
    from harness.core import METHODS, MethodContext
    from harness.train import build_model

    protocol = load_protocol("smoke")
    model = build_model(RunContext(protocol, 3, CPU), "contrastive", {}, in_channels=1,
                        num_classes=6, num_coarse_classes=None)  # fmt: skip
    torch.manual_seed(3)
    backbone = build_backbone(protocol.backbone, 1)
    ctx = MethodContext(tuple(backbone.stage_dims), protocol.embedding_dim, 6, None)
    head = METHODS.get("contrastive").build(ctx).head
    assert model.context == ctx
    for mine, theirs in ((model.backbone, backbone), (model.method.head, head)):
        expected = theirs.state_dict()
        assert all(torch.equal(v, expected[k]) for k, v in mine.state_dict().items())


def test_training_seconds_end_before_the_data_workers_stop(monkeypatch):
    """Stopping worker processes takes seconds; like their start-up it is once per run, not
    training time (else `cost`'s harness-against-bare-loop ratio would count it)."""
    from tiny_training import fresh_contrastive, tiny_images

    from harness.train import loop as train_module

    events = []
    close, record = train_module.Feeder.close, train_module._Session.record_times
    monkeypatch.setattr(train_module.Feeder, "close",
                        lambda self: (events.append("close"), close(self))[1])  # fmt: skip
    monkeypatch.setattr(train_module._Session, "record_times",
                        lambda self: (events.append("record"), record(self))[1])  # fmt: skip
    protocol = load_protocol("smoke")
    backbone, method = fresh_contrastive(protocol)
    images, labels = tiny_images()
    stats = train(
        RunContext(protocol, 0, torch.device("cpu"), max_steps=2, workers=0),
        Model(backbone, method),
        TrainingSet(images, labels),
    )
    assert stats.steps == 2 and stats.train_seconds > 0
    assert events[-2:] == ["record", "close"]


def test_the_progress_bar_is_drawn_on_a_terminal_only(capsys):
    """With stderr redirected to a file, the log gets the per-epoch lines, not bar frames
    (once glued to them: '...2/2 [00:00...]00:28:50 epoch 1/1 loss ...')."""
    protocol, backbone, images, labels = setup(3)
    method = Method(head=EmbeddingHead(16, 8), loss=NanFrom(bad=10**6))
    train(
        RunContext(protocol, 0, CPU, progress=True),
        Model(backbone, method),
        TrainingSet(images, labels),
    )
    assert "train:" not in capsys.readouterr().err
