"""Augmentation as protocol data: the ops, their seeding by (seed, step, position), the strict
`augmentation:` section, and training fed by worker processes (same result for any count)."""

from __future__ import annotations

import dataclasses
import json

import harness.methods  # noqa: F401
import numpy as np
import pytest
import torch
import torchvision.transforms.v2
import torchvision.transforms.v2.functional as TF
import yaml
from tiny_training import DiesInAWorker, crash_after_epoch_2, fresh_contrastive, tiny_images

from harness.cli import main
from harness.core import (
    PROTOCOL_DIR,
    AugmentationSpec,
    HarnessError,
    OpSpec,
    RunContext,
    load_protocol,
    parse_protocol,
)
from harness.data import EvalView, Feeder, LazyImages, TrainPipeline, default_workers
from harness.data.augment import apply_op, generator
from harness.data.pipeline import MAX_AUTO_WORKERS
from harness.train import Checkpoint, EpochHooks, Model, TrainingSet, train

CPU = torch.device("cpu")
IMAGE = torch.arange(3 * 6 * 8, dtype=torch.uint8).reshape(3, 6, 8)


def op(name: str, **params) -> OpSpec:
    return OpSpec(op=name, **params)


def test_deterministic_ops_are_the_plain_crops_and_resizes():
    assert torch.equal(apply_op(IMAGE, op("center_crop", size=4)), IMAGE[:, 1:5, 2:6])
    assert torch.equal(apply_op(IMAGE, op("resize", size=5)),
                       TF.resize(IMAGE, [5, 5], antialias=True))  # fmt: skip
    flipped = apply_op(IMAGE, op("horizontal_flip", p=1.0), generator(0, 0, 0))
    assert torch.equal(flipped, IMAGE.flip(-1))
    assert torch.equal(apply_op(IMAGE, op("horizontal_flip", p=0.0), generator(0, 0, 0)), IMAGE)


def test_a_random_crop_is_a_window_of_the_image_drawn_by_its_own_generator():
    out = apply_op(IMAGE, op("random_crop", size=4), generator(0, 3, 1))
    windows = [IMAGE[:, t : t + 4, s : s + 4] for t in range(3) for s in range(5)]
    assert any(torch.equal(out, w) for w in windows)
    again = apply_op(IMAGE, op("random_crop", size=4), generator(0, 3, 1))
    assert torch.equal(out, again)  # the same (seed, step, position): the same draw
    tops = {int(torch.randint(0, 100, (), generator=generator(0, s, 0))) for s in range(20)}
    assert len(tops) > 10  # other steps draw otherwise


def test_the_random_resized_crop_box_keeps_to_its_scale_and_ratio():
    from harness.data.augment import _crop_box

    spec = op("random_resized_crop", size=8, scale=[0.25, 0.5], ratio=[0.5, 2.0])
    for step in range(200):
        top, left, h, w = _crop_box(100, 120, spec, generator(1, step, 0))
        assert 0 <= top <= 100 - h and 0 <= left <= 120 - w
        assert 0.25 * 12000 * 0.9 <= h * w <= 0.5 * 12000 * 1.1
        assert 0.5 * 0.9 <= w / h <= 2.0 * 1.1
    whole = op("random_resized_crop", size=4, scale=[1.0, 1.0], ratio=[1.0, 1.0])
    square = IMAGE[:, :, :6]
    assert torch.equal(apply_op(square, whole, generator(0, 0, 0)),
                       TF.resize(square, [4, 4], antialias=True))  # fmt: skip


def test_brightness_jitter_scales_by_a_factor_in_its_range():
    image = torch.full((3, 4, 4), 100, dtype=torch.uint8)
    factors = {
        int(apply_op(image, op("color_jitter", brightness=0.4), generator(0, s, 0))[0, 0, 0])
        for s in range(50)
    }
    assert min(factors) >= 60 and max(factors) <= 140 and len(factors) > 20
    with pytest.raises(HarnessError, match="saturation and hue need RGB"):
        apply_op(image[:1], op("color_jitter", hue=0.1), generator(0, 0, 0))


def test_an_image_is_augmented_by_its_step_and_position_not_by_its_batch():
    """What makes workers and ranks irrelevant: a shard at positions 2..3 gets the same
    images as positions 2..3 of the whole batch."""
    ops = [op("random_resized_crop", size=4, scale=[0.3, 1.0]), op("horizontal_flip")]
    pipe = TrainPipeline(ops, seed=5)
    batch = torch.stack([IMAGE[:, :, :6]] * 4)
    whole = pipe(batch, step=7, positions=range(4))
    assert torch.equal(pipe(batch[2:], step=7, positions=range(2, 4)), whole[2:])
    assert not torch.equal(whole[0], whole[1])  # each position draws its own crop
    assert not torch.equal(pipe(batch, step=8, positions=range(4)), whole)


def _protocol_with(augmentation: dict) -> dict:
    data = yaml.safe_load((PROTOCOL_DIR / "smoke.yaml").read_text())
    data["augmentation"] = augmentation
    return data


@pytest.mark.parametrize(
    ("augmentation", "message"),
    [
        (
            {"train": [{"op": "random_resized_crp", "size": 16}]},
            "did you mean 'random_resized_crop'",
        ),
        ({"train": [{"op": "horizontal_flip", "size": 16}]}, "horizontal_flip takes p, not size"),
        ({"test": [{"op": "horizontal_flip"}]}, "test pipeline must be deterministic"),
        (
            {"load_size": 20, "train": [{"op": "random_crop", "size": 14}]},
            "train ends at 14 px but backbone.input_size is 16",
        ),
        ({"load_size": 20}, "train ends at 20 px"),
        ({"train": [{"op": "center_crop", "size": 18}]}, "center_crop to 18 px from images of 16"),
        ({"train": [{"op": "random_resized_crop", "size": 16, "scale": [0.5, 2]}]}, "scale must"),
        ({"trian": []}, "unknown key 'trian'"),
        ({"load": "orignal"}, "load must be square or original"),
        ({"load": "original", "load_size": 20}, "drop it with load: original"),
        (
            {"load": "original", "train": [{"op": "center_crop", "size": 16}]},
            r"train\[0\]: center_crop of images of unknown size",
        ),
        ({"load": "original", "train": [{"op": "horizontal_flip"}]}, "original sizes"),
        (
            {
                "load": "original",
                "train": [{"op": "random_resized_crop", "size": 16}],
                "test": [{"op": "resize_shorter", "size": 16}],
            },
            r"test ends at 16 px \(shorter side\)",
        ),
    ],
)
def test_the_augmentation_section_is_strict(augmentation, message):
    with pytest.raises(HarnessError, match=message):
        parse_protocol(_protocol_with(augmentation), "p.yaml")


def test_augmentation_is_in_the_hash_and_absent_from_older_protocols():
    plain = load_protocol("smoke")
    assert "augmentation" not in plain.content()
    data = _protocol_with({"load_size": 20, "train": [{"op": "random_crop", "size": 16}],
                           "test": [{"op": "center_crop", "size": 16}]})  # fmt: skip
    augmented = parse_protocol(data, "p.yaml")
    assert augmented.hash != plain.hash and augmented.load_size == 20
    assert augmented.content()["augmentation"]["train"] == [{"op": "random_crop", "size": 16}]


def test_resize_shorter_is_torchvisions_resize_of_the_shorter_side():
    """6 x 8 to a shorter side of 4: the longer side is int(4 * 8 / 6) = 5, aspect kept."""
    out = apply_op(IMAGE, op("resize_shorter", size=4))
    assert out.shape == (3, 4, 5)
    assert torch.equal(out, torchvision.transforms.v2.Resize(4, antialias=True)(IMAGE))
    bicubic = apply_op(IMAGE, op("resize_shorter", size=4, interpolation="bicubic"))
    resize = torchvision.transforms.v2.Resize(4, TF.InterpolationMode.BICUBIC, antialias=True)
    assert torch.equal(bicubic, resize(IMAGE))
    assert "interpolation" not in op("resize", size=4).content()  # older protocols' hashes
    assert op("resize", size=4, interpolation="bicubic").content()["interpolation"] == "bicubic"
    square = torch.zeros(3, 8, 8, dtype=torch.uint8)
    assert apply_op(square, op("resize_shorter", size=4)).shape == (3, 4, 4)


def test_original_loading_is_in_the_hash_only_when_chosen():
    square = {"load_size": 20, "train": [{"op": "random_crop", "size": 16}],
              "test": [{"op": "center_crop", "size": 16}]}  # fmt: skip
    assert "load" not in parse_protocol(_protocol_with(square), "p.yaml").content()["augmentation"]
    original = {"load": "original",
                "train": [{"op": "random_resized_crop", "size": 16}, {"op": "horizontal_flip"}],
                "test": [{"op": "resize_shorter", "size": 18}, {"op": "center_crop", "size": 16}]}  # fmt: skip
    protocol = parse_protocol(_protocol_with(original), "p.yaml")
    assert protocol.content()["augmentation"]["load"] == "original" and protocol.load_size == 0


def test_images_at_their_own_sizes_are_cropped_one_by_one(tmp_path):
    """load: original on JPEGs: the loader keeps each image's size and aspect (its bounding
    box when given), training crops each to the input size, the test view resizes the shorter
    side and takes the center."""
    from PIL import Image

    from harness.data import LazyImages

    sizes = [(50, 30), (40, 64)]  # (width, height)
    paths = []
    for n, (w, h) in enumerate(sizes):
        paths.append(str(tmp_path / f"{n}.png"))
        pixels = np.random.default_rng(n).integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(paths[-1])
    boxes = np.array([[np.nan] * 4, [10, 20, 30, 60]])
    images = LazyImages(paths, 32, boxes).resized(0)
    loaded = images.load()
    assert [tuple(x.shape) for x in loaded] == [(3, 30, 50), (3, 40, 20)]
    assert torch.equal(loaded[0], torch.from_numpy(np.array(Image.open(paths[0]))).permute(2, 0, 1))
    with pytest.raises(HarnessError, match="need a pipeline that resizes them"):
        images.to(CPU)
    pipeline = TrainPipeline([op("random_resized_crop", size=16), op("horizontal_flip")], 0)
    assert pipeline(loaded, 3, [0, 1]).shape == (2, 3, 16, 16)
    view = EvalView(images, [op("resize_shorter", size=18), op("center_crop", size=16)], 16)
    expected = TF.center_crop(TF.resize(loaded[1], [18], antialias=True), [16, 16])
    assert torch.equal(view[1:].to(CPU)[0], expected)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_channels_last_originals_crop_to_the_same_pixels(tmp_path, interpolation):
    """Images at their own sizes stay channels-last in memory (PIL's layout; torchvision's
    uint8 resize is 2-3x faster on it): the crops must equal those of channels-first copies."""
    from PIL import Image

    from harness.data import LazyImages

    rng = np.random.default_rng(0)
    paths = []
    for n, (w, h) in enumerate([(500, 375), (333, 500), (241, 97)]):
        paths.append(str(tmp_path / f"{n}.png"))
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    loaded = LazyImages(paths, 0).load()
    assert [x.stride() for x in loaded] == [(1, w * 3, 3) for w in (500, 333, 241)]
    ops = [op("random_resized_crop", size=64, interpolation=interpolation),
           op("horizontal_flip"), op("color_jitter", brightness=0.4, saturation=0.4)]  # fmt: skip
    pipeline = TrainPipeline(ops, 0)
    for step in range(4):
        assert torch.equal(pipeline(loaded, step, [0, 1, 2]),
                           pipeline([x.contiguous() for x in loaded], step, [0, 1, 2]))  # fmt: skip
    test_ops = [op("resize_shorter", size=72, interpolation=interpolation),
                op("center_crop", size=64)]  # fmt: skip
    for x in loaded:
        assert torch.equal(EvalView([x], test_ops, 64).load(),
                           EvalView([x.contiguous()], test_ops, 64).load())  # fmt: skip


def test_the_test_view_is_the_images_through_the_test_pipeline():
    images = torch.randint(0, 255, (5, 3, 20, 20), dtype=torch.uint8)
    ops = [op("resize", size=18), op("center_crop", size=16)]
    view = EvalView(images, ops, 16)
    assert view.shape == (5, 3, 16, 16) and len(view[1:4]) == 3
    expected = TF.center_crop(TF.resize(images[1:4], [18, 18], antialias=True), [16, 16])
    assert torch.equal(view[1:4].to(CPU), expected)


def _augmented_smoke(steps: int) -> tuple:
    protocol = load_protocol("smoke")
    spec = AugmentationSpec(
        load_size=20,
        train=[op("random_resized_crop", size=16, scale=[0.5, 1.0]), op("horizontal_flip"),
               op("color_jitter", brightness=0.3, contrast=0.3)],
        test=[op("center_crop", size=16)],
    )  # fmt: skip
    protocol = dataclasses.replace(protocol, augmentation=spec,
                                   budget=dataclasses.replace(protocol.budget, steps=steps))  # fmt: skip
    return protocol, *tiny_images(20)


@pytest.mark.slow
def test_training_fed_by_two_workers_equals_training_in_process(tmp_path):
    """The same weights and losses with 0 and 2 worker processes; augmentation changes what
    is trained; an interrupted augmented run resumes bit-identically."""
    protocol, images, labels = _augmented_smoke(9)  # 3 steps per epoch
    runs = {}
    for workers in (0, 2):
        backbone, method = fresh_contrastive(protocol)
        stats = train(
            RunContext(protocol, 0, CPU, workers=workers),
            Model(backbone, method),
            TrainingSet(images, labels),
        )
        runs[workers] = (stats, backbone.state_dict())
        assert stats.data_workers == workers and stats.data_wait_seconds > 0
    (s0, w0), (s2, w2) = runs[0], runs[2]
    # spawned workers import torch before their first batch: that wait is their start-up
    assert s0.data_startup_seconds == 0 < s2.data_startup_seconds <= s2.data_wait_seconds
    assert s0.epoch_loss == s2.epoch_loss and all(torch.equal(w0[k], w2[k]) for k in w0)
    plain = dataclasses.replace(protocol, augmentation=AugmentationSpec())
    backbone, method = fresh_contrastive(plain)
    unaugmented = train(
        RunContext(plain, 0, CPU),
        Model(backbone, method),
        TrainingSet(images[:, :, 2:18, 2:18].contiguous(), labels),
    )
    assert unaugmented.epoch_loss != s0.epoch_loss

    backbone, method = fresh_contrastive(protocol)
    with pytest.raises(KeyboardInterrupt):
        train(
            RunContext(protocol, 0, CPU, workers=2),
            Model(backbone, method),
            TrainingSet(images, labels),
            checkpoint=Checkpoint(tmp_path / "c.pt", "a"),
            hooks=EpochHooks(on_epoch_end=crash_after_epoch_2),
        )
    backbone, method = fresh_contrastive(protocol)
    resumed = train(
        RunContext(protocol, 0, CPU, workers=0),
        Model(backbone, method),
        TrainingSet(images, labels),
        checkpoint=Checkpoint(tmp_path / "c.pt", "a"),
    )
    assert resumed.resumed_from_step == 6 and resumed.epoch_loss == s0.epoch_loss
    assert all(torch.equal(backbone.state_dict()[k], w0[k]) for k in w0)


def _fed(images, keys, workers: int = 1) -> list:
    feeder = Feeder(images, None, workers)
    try:
        return list(feeder.batches(keys))
    finally:
        feeder.close()


@pytest.mark.slow
def test_workers_leave_the_global_generator_alone_and_fail_in_one_line(tmp_path):
    """Results must not depend on the worker count: the DataLoader's seed draw must not move
    torch's global generator, which a method's dropout reads (PDDM's did). An error a worker
    meets (a corrupt file) is the same one line as without workers; a killed worker says
    what to do."""
    images, _ = tiny_images()
    keys = [(n, np.arange(4) + 4 * n) for n in range(2)]
    state = torch.get_rng_state()
    fed = _fed(images, keys)
    assert torch.equal(torch.get_rng_state(), state) and torch.equal(fed[1][2], images[4:8])
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8" + b"\x00" * 100)
    for workers in (0, 1):
        with pytest.raises(HarnessError) as error:
            _fed(LazyImages([str(tmp_path / "bad.jpg")] * 4, 16), keys[:1], workers)
        assert str(error.value).startswith("cannot decode image") and "\n" not in str(error.value)
    with pytest.raises(HarnessError, match=r"a data worker process died \(.*fewer --workers"):
        _fed(DiesInAWorker(), keys)


def test_a_run_records_its_augmentation_and_its_data_pipeline(tmp_path):
    data = _protocol_with({"load_size": 18, "train": [{"op": "random_crop", "size": 16},
                                                      {"op": "horizontal_flip"}],
                           "test": [{"op": "center_crop", "size": 16}]})  # fmt: skip
    path = tmp_path / "augmented.yaml"
    path.write_text(yaml.safe_dump(data))
    args = ["-q", "run", "--protocol", str(path), "--method", "contrastive", "--workers", "0",
            "--results-dir", str(tmp_path)]  # fmt: skip
    assert main(args) == 0
    result = json.loads((tmp_path / "runs/smoke/contrastive/seed0.json").read_text())
    assert result["protocol"]["content"]["augmentation"]["load_size"] == 18
    assert result["timings"]["data_workers"] == 0
    assert 0 <= result["timings"]["data_wait_share"] < 1


def test_default_workers_share_the_cores_among_torchruns_processes(monkeypatch):
    """Without --workers: none for images in memory without augmentation; else the cores,
    at most MAX_AUTO_WORKERS, divided among the node's torchrun processes (8 ranks of 8
    workers each would start 64 decoding processes on one node)."""
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    images = torch.zeros(4, 1, 8, 8, dtype=torch.uint8)
    assert default_workers(images, None) == 0
    assert default_workers(images, lambda x, s, i: x) == MAX_AUTO_WORKERS == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert default_workers(images, lambda x, s, i: x) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert default_workers(images, lambda x, s, i: x) == 1
