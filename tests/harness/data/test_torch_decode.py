"""The torch decoder (`run --decoder torch`): the same pixels as PIL's on the CPU, bounding
boxes cropped at the same edges, other formats through the fallback, a corrupt file named,
and the data workers handing over only the files' bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from jpeg_tree import cub_jpegs
from PIL import Image

from harness.core import SINGLE, HarnessError, OpSpec
from harness.data import Feeder, LazyImages, TrainPipeline, load_batch
from harness.data.pipeline import prepare
from harness.data.torch_decode import Encoded


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> list[str]:
    root = cub_jpegs(tmp_path_factory.mktemp("cub"), train_classes=2, test_classes=1, per_class=3)
    return sorted(str(p) for p in (root / "CUB_200_2011" / "images").rglob("*.jpg"))


def test_decoded_pixels_and_box_crops_equal_pils(jpegs):
    boxes = np.array([[50.0, 40.0, 300.0, 250.0], [np.nan] * 4] * 3 + [[-5, -5, 9e3, 9e3]] * 3)
    pil = LazyImages(jpegs, 0, boxes)
    torch_ = pil.decoded_by("torch", "cpu")
    for a, b in zip(pil.load(), torch_.load(), strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    assert pil.load()[0].shape == (3, 210, 250)  # the box's 250 x 210 pixels
    small_pil, small_torch = pil.resized(32).load(), torch_.resized(32).load()
    assert small_torch.shape == small_pil.shape == (9, 3, 32, 32)
    # the resize: torch's antialiased bilinear against PIL's, equal up to rounding
    diff = (small_torch.int() - small_pil.int()).abs()
    assert diff.max() <= 3 and diff.float().mean() < 0.5


def test_other_formats_decode_through_the_fallback_and_bad_files_are_named(tmp_path, jpegs):
    pixels = np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    images = LazyImages([jpegs[0], str(tmp_path / "a.png")], 0).decoded_by("torch")
    assert torch.equal(images.load()[1], torch.from_numpy(pixels).permute(2, 0, 1))
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8" + b"\x00" * 100)
    bad = LazyImages([jpegs[0], str(tmp_path / "bad.jpg")], 16).decoded_by("torch")
    with pytest.raises(HarnessError, match=r"cannot decode image .*bad\.jpg"):
        bad.load()
    with pytest.raises(HarnessError, match=r"image .*gone\.jpg is missing"):
        LazyImages([str(tmp_path / "gone.jpg")], 16).decoded_by("torch").load()
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(HarnessError, match=r"image .*empty\.jpg is empty"):
        LazyImages([str(tmp_path / "empty.jpg")], 16).decoded_by("torch").load()


def test_16_bit_pngs_keep_their_high_byte_with_both_decoders(tmp_path):
    levels = np.random.default_rng(1).integers(0, 65536, (12, 10), dtype=np.uint16)
    Image.fromarray(levels).save(tmp_path / "deep.png")  # 16-bit grayscale
    pil = LazyImages([str(tmp_path / "deep.png")], 0).load()[0]
    decoded = LazyImages([str(tmp_path / "deep.png")], 0).decoded_by("torch").load()[0]
    expected = torch.from_numpy((levels >> 8).astype(np.uint8)).expand(3, 12, 10)
    assert torch.equal(pil, expected) and torch.equal(decoded, expected)


def test_a_jpeg_the_device_decoder_refuses_is_decoded_on_the_cpu(jpegs, monkeypatch):
    """nvJPEG refuses some valid JPEGs (CMYK ones): one such file must not stop the batch."""
    import torchvision.io

    real = torchvision.io.decode_jpeg
    refused = open(jpegs[1], "rb").read()

    def picky(data, **kwargs):
        one = data if isinstance(data, torch.Tensor) else None
        if one is None and any(bytes(d.numpy()) == refused for d in data):
            raise RuntimeError("nvjpegDecodeBatched failed")
        if one is not None and bytes(one.numpy()) == refused:
            raise RuntimeError("unsupported JPEG")
        return real(data, **kwargs)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", picky)
    images = LazyImages(jpegs[:3], 0)
    for a, b in zip(images.load(), images.decoded_by("torch").load(), strict=True):
        assert torch.equal(a, b)


def test_workers_read_the_files_and_the_training_process_decodes_and_augments(jpegs):
    images = LazyImages(jpegs, 0).decoded_by("torch")
    augment = TrainPipeline([OpSpec("random_resized_crop", size=24), OpSpec("horizontal_flip")], 3)
    idx = np.array([4, 0, 7, 2])
    handed = prepare(images, augment, 5, idx, SINGLE)
    assert isinstance(handed, Encoded) and len(handed.data) == 4  # bytes, not pixels
    assert all(isinstance(b, bytes) for b in handed.data)  # not tensors: no shared memory
    expected = TrainPipeline(augment.ops, 3)(LazyImages(jpegs, 0)[idx].load(), 5, range(4))
    assert torch.equal(load_batch(images, augment, 5, idx, SINGLE), expected)
    feeder = Feeder(images, augment, workers=0)
    [(step, got_idx, batch)] = list(feeder.batches([(5, idx)]))
    assert step == 5 and torch.equal(batch, expected) and feeder.wait > 0


def test_a_run_decoded_by_torch_equals_one_decoded_by_pil_on_the_cpu(tmp_path, capsys):
    """The standard torchvision pipeline end to end on CUB's layout (load: original: random
    resized crops from the original image; the shorter side resized and the center crop at
    test). The torch decoder's pixels are PIL's, so the whole run has the same metrics; each
    result records its decoder. In-memory data has no files to decode: a one-line error. On the
    CPU whatever the machine has: two CUDA runs of one seed need not train alike."""
    import json

    import yaml

    from harness.cli import main

    root = cub_jpegs(tmp_path / "data", train_classes=4, test_classes=3, per_class=8)
    data = {
        "schema": 1, "name": "cub_decode", "version": 1, "description": "decoders",
        "dataset": {"name": "cub200"}, "split": {"official": True},
        "backbone": {"name": "conv4", "input_size": 32, "pretrained": "none",
                     "params": {"width": 8}},
        "embedding_dim": 8, "sampler": {"classes_per_batch": 4, "images_per_class": 4},
        "budget": {"epochs": 1}, "seeds": [0],
        "augmentation": {
            "load": "original",
            "train": [{"op": "random_resized_crop", "size": 32}, {"op": "horizontal_flip"}],
            "test": [{"op": "resize_shorter", "size": 36}, {"op": "center_crop", "size": 32}],
        },
    }  # fmt: skip
    path = tmp_path / "cub_decode.yaml"
    path.write_text(yaml.safe_dump(data))
    results = {}
    for decoder in ("pil", "torch"):
        out = tmp_path / decoder
        assert main(["-q", "run", "--protocol", str(path), "--method", "contrastive",
                     "--workers", "0", "--decoder", decoder, "--data-root", str(root),
                     "--device", "cpu", "--results-dir", str(out)]) == 0  # fmt: skip
        results[decoder] = json.loads((out / "runs/cub_decode/contrastive/seed0.json").read_text())
        assert results[decoder]["timings"]["decoder"] == decoder
        assert results[decoder]["protocol"]["content"]["augmentation"]["load"] == "original"
    assert results["pil"]["metrics"] == results["torch"]["metrics"]
    assert main(["run", "--protocol", "smoke", "--method", "contrastive", "--decoder", "torch",
                 "--results-dir", str(tmp_path / "smoke")]) == 2  # fmt: skip
    assert "glyphs is held in memory: drop --decoder" in capsys.readouterr().err
