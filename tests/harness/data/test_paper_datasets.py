"""The five papers' datasets, read from miniature archives built here in the official layouts:
labels, official splits, crops, lazy decoding, `data verify`, `data download` (network mocked)."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import miniature_archives as mini
import numpy as np
import pytest
import torch

from harness.cli import main
from harness.core import HarnessError, SplitSpec, load_protocol, parse_protocol, reference
from harness.data import DATASETS, LazyImages, cars196, split_classes
from harness.data import fetch as download
from harness.data import verification as verify


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("paper-datasets")
    for name, build in mini.BUILDERS.items():
        build(root / name)
    mini.cars196_devkit(root / "cars196_devkit")
    return root


def load(archives: Path, name: str, **params):
    return DATASETS.get(name)(archives / name, None, **params)


def names_of(data, idx) -> list[str]:
    return sorted({data.class_names[c] for c in np.unique(data.labels[idx])})


# ----------------------------------------------------------------------------- loaders


def test_cub200_labels_official_split_and_fraction_split_agree(archives):
    data = load(archives, "cub200")
    assert isinstance(data.images, LazyImages) and data.images.shape == (27, 3, 256, 256)
    assert data.class_names == [f"{c:03d}.Bird_{c}" for c in mini.CUB_CLASSES]
    assert np.bincount(data.labels).tolist() == [3] * 9
    split = split_classes(data, SplitSpec(official=True))
    assert split.train_classes == [f"{c:03d}.Bird_{c}" for c in (1, 2, 3, 4, 5)]
    assert split.test_classes == [f"{c:03d}.Bird_{c}" for c in (101, 102, 103, 104)]
    assert len(split.query) == len(split.gallery) == 0
    # ids <= 100 train: the partition follows the class id, not the position in the list
    assert set(data.partition[data.labels == 5]) == {"test"}
    # the papers' "first half of the sorted classes" gives the same split on the full dataset;
    # here 5 of 9 classes train, so a fraction of 5/9 reproduces it
    by_fraction = split_classes(data, SplitSpec(train_fraction=5 / 9))
    assert by_fraction.train_classes == split.train_classes


def test_official_split_carves_validation_from_the_last_training_classes(archives):
    data = load(archives, "cub200")
    split = split_classes(data, SplitSpec(official=True, validation_fraction=0.4))
    assert split.validation_classes == ["004.Bird_4", "005.Bird_5"]  # round(5 * 0.4), the last
    assert split.train_classes == [f"{c:03d}.Bird_{c}" for c in (1, 2, 3)]
    assert len(split.train) == 9 and len(split.validation) == 6 and len(split.test) == 12
    with pytest.raises(HarnessError, match="each part needs at least 2 classes"):
        split_classes(data, SplitSpec(official=True, validation_fraction=0.2))  # 1 class


def test_bounding_box_crop(archives):
    """The object (red) fills the crop; the whole image is mostly blue background."""
    for name in ("cub200", "cars196"):
        cropped = load(archives, name, bounding_boxes=True).images.resized(28)[0:3].to("cpu")
        whole = load(archives, name).images.resized(28)[0:3].to("cpu")
        assert cropped.shape == (3, 3, 28, 28) and cropped.dtype == torch.uint8
        assert cropped[:, 0].min() >= 240 and cropped[:, 2].max() <= 15, name  # all red
        assert whole[:, 0, 0, 0].max() <= 15 and whole[:, 2, 0, 0].min() >= 240, name  # blue


def test_cars196_both_layouts_labels_and_body_types(archives):
    annos = load(archives, "cars196")
    devkit = cars196.build(archives / "cars196_devkit", None)
    for data in (annos, devkit):
        assert data.class_names[0] == "001 AM General Hummer SUV 2000"
        assert data.class_names[-1] == "102 Chevrolet Express Cargo Van 2007"
        split = split_classes(data, SplitSpec(official=True))
        assert [n[:3] for n in split.train_classes] == ["001", "002", "003", "004", "005"]
        assert [n[:3] for n in split.test_classes] == ["099", "100", "101", "102"]
        kinds = {data.class_names[c]: data.coarse_names[k]
                 for c, k in zip(data.labels, data.coarse_labels, strict=True)}  # fmt: skip
        assert kinds["004 Acura TL Type-S 2008"] == "other"
        assert kinds["101 Ram C/V Cargo Van Minivan 2012"] == "minivan"
    assert np.array_equal(np.bincount(annos.labels), np.bincount(devkit.labels))


@pytest.mark.parametrize(
    "name, kind",
    [("AM General Hummer SUV 2000", "suv"), ("Acura RL Sedan 2012", "sedan"),
     ("Rolls-Royce Phantom Drophead Coupe Convertible 2012", "convertible"),
     ("Ford E-Series Wagon Van 2012", "van"), ("Ram C/V Cargo Van Minivan 2012", "minivan"),
     ("Ford Ranger SuperCab 2011", "pickup"), ("Dodge Dakota Crew Cab 2010", "pickup"),
     ("Infiniti G Coupe IPL 2012", "coupe"), ("Audi 100 Wagon 1994", "wagon"),
     ("Chevrolet Corvette ZR1 2012", "other")],
)  # fmt: skip
def test_body_type_rules(name, kind):
    assert cars196.body_type(name) == kind


def test_sop_official_lists_and_super_classes(archives):
    data = load(archives, "sop")
    split = split_classes(data, SplitSpec(official=True))
    assert split.train_classes == ["1", "2", "3", "4", "5"]
    assert split.test_classes == ["6", "7", "8", "9"]
    assert data.coarse_names == ["01 bicycle", "02 cabinet"]
    for cid, sid in {**mini.SOP_TRAIN, **mini.SOP_TEST}.items():
        coarse = data.coarse_labels[data.labels == data.class_names.index(str(cid))]
        assert set(coarse.tolist()) == {sid - 1}


def test_inshop_query_gallery_split(archives):
    data = load(archives, "inshop")
    split = split_classes(data, SplitSpec(official=True))
    assert split.train_classes == sorted(mini.INSHOP_TRAIN)
    assert split.test_classes == sorted(mini.INSHOP_TEST)
    assert len(split.query) == 4 and len(split.gallery) == 8  # 1 query + 2 gallery per item
    assert sorted(np.concatenate([split.query, split.gallery]).tolist()) == split.test.tolist()
    assert names_of(data, split.query) == names_of(data, split.gallery) == split.test_classes
    assert split.summary()["query_images"] == 4 and split.summary()["gallery_images"] == 8
    assert data.coarse_names == ["MEN/Denim", "WOMEN/Dresses"]


@pytest.mark.parametrize("test_set, size", [("small", 800), ("medium", 1600), ("large", 2400)])
def test_vehicleid_test_sets(archives, test_set, size):
    data = load(archives, "vehicleid", test_set=test_set)
    split = split_classes(data, SplitSpec(official=True))
    assert split.test_classes == [f"{v:06d}" for v in mini.VEHICLE_TEST[size]]
    assert split.train_classes == [f"{v:06d}" for v in mini.VEHICLE_TRAIN]


def test_official_split_errors(archives):
    from harness.data import glyphs

    small = glyphs.build(None, archives / "glyph-cache", num_classes=8, images_per_class=2,
                         image_size=8)  # fmt: skip
    with pytest.raises(HarnessError, match="no official split"):
        split_classes(small, SplitSpec(official=True))
    text = (Path("protocols") / "smoke.yaml").read_text()
    import yaml

    data = yaml.safe_load(text)
    data["split"] = {"official": True, "train_fraction": 0.5}
    with pytest.raises(HarnessError, match="train_fraction does not go with official"):
        parse_protocol(data, "x.yaml")
    with pytest.raises(HarnessError, match="test_set must be one of"):
        load(archives, "vehicleid", test_set="huge")


# ----------------------------------------------------------------------------- lazy images


def test_lazy_images_index_like_a_tensor_and_decode_only_on_to(archives, monkeypatch):
    images = load(archives, "sop").images.resized(16)
    calls = []
    real = LazyImages.load
    monkeypatch.setattr(LazyImages, "load", lambda self: calls.append(len(self)) or real(self))
    view = images[np.array([4, 2, 0])][torch.tensor([0, 2])]  # views of views: no decoding
    assert isinstance(view, LazyImages) and view.shape == (2, 3, 16, 16) and calls == []
    assert [Path(view.path(i)).name for i in range(2)] == ["201_1.JPG", "100_0.JPG"]
    batch = view.to("cpu")
    assert calls == [2] and batch.dtype == torch.uint8 and batch.shape == (2, 3, 16, 16)
    assert torch.equal(images[10:12].to("cpu"), images[np.array([10, 11])].to("cpu"))
    assert torch.equal(images[3], images[[3]].to("cpu")[0])


def test_corrupt_or_missing_image_is_named_in_the_error(archives, tmp_path):
    root = tmp_path / "cub200"
    shutil.copytree(archives / "cub200", root)
    bad = root / "CUB_200_2011" / "images" / "002.Bird_2" / "Bird_2_1.jpg"
    mini.truncate(bad)
    images = load(tmp_path, "cub200").images
    with pytest.raises(HarnessError, match=f"cannot decode image {bad}.*corrupt or truncated"):
        images[0:9].to("cpu")
    bad.unlink()
    with pytest.raises(HarnessError, match=f"image {bad} is missing"):
        images[[4]].to("cpu")


# ----------------------------------------------------------------------------- verify


def test_verify_reports_wrong_counts_missing_and_corrupt_files(archives, tmp_path, capsys):
    root = tmp_path / "sop"
    shutil.copytree(archives / "sop", root)
    # the miniature against the published counts: every count is wrong, exit 1
    assert main(["data", "verify", "--dataset", "sop", "--data-root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "FAIL train_classes" in out and "(published 11318)" in out
    base = root / "Stanford_Online_Products"
    missing, corrupt = base / "bicycle_final" / "100_0.JPG", base / "cabinet_final" / "801_1.JPG"
    missing.unlink()
    mini.truncate(corrupt)
    ok, report = verify.verify("sop", root)
    assert not ok
    assert f"missing {missing}" in report
    assert f"unreadable: cannot decode image {corrupt}" in report
    ok, report = verify.verify("sop", root, decode=False)  # --quick: existence only
    assert f"missing {missing}" in report and "unreadable" not in report


def test_verify_passes_when_counts_match_and_names_a_missing_list(archives, tmp_path, monkeypatch):
    counts = {"cub200": {"classes": 9, "images": 27, "train_classes": 5, "train_images": 15,
                         "test_classes": 4, "test_images": 12}}  # fmt: skip
    monkeypatch.setattr(verify, "dataset_counts", lambda name: counts[name])
    ok, report = verify.verify("cub200", archives / "cub200")
    assert ok and report.endswith("OK") and "27 listed, 0 missing, 0 unreadable" in report
    root = tmp_path / "cub"
    shutil.copytree(archives / "cub200", root)
    (root / "CUB_200_2011" / "bounding_boxes.txt").unlink()
    ok, report = verify.verify("cub200", root)
    assert not ok and "bounding_boxes.txt is missing" in report


def test_published_counts_are_the_papers(archives):
    assert reference.dataset_counts("cub200")["train_images"] == 5864
    assert reference.dataset_counts("inshop")["query_images"] == 14218
    assert reference.dataset_counts("vehicleid")["large"]["test_images"] == 20038


# ----------------------------------------------------------------------------- download


def test_download_cub_with_the_network_mocked(archives, tmp_path, monkeypatch):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(archives / "cub200" / "CUB_200_2011", arcname="CUB_200_2011")
    urls = []

    def fake_fetch(url: str, target: Path) -> None:
        urls.append(url)
        target.write_bytes(buffer.getvalue())

    monkeypatch.setattr(download, "fetch", fake_fetch)
    assert main(["data", "download", "--dataset", "cub200", "--data-root", str(tmp_path)]) == 1
    assert urls == [download.DOWNLOADS["cub200"][0]]  # fetched, extracted, counts differ: 1
    from harness.data import cub200

    assert cub200.listing(tmp_path).class_names == load(archives, "cub200").class_names
    with pytest.raises(HarnessError, match="vehicleid has no stable public download"):
        download.download("vehicleid", tmp_path)


def test_every_shipped_protocol_validates():
    assert main(["validate"]) == 0
    for name in ("pddm_cub200", "hdc_inshop", "fair_sop", "quadruplet_cars196"):
        assert load_protocol(name).split.official


@pytest.mark.parametrize(
    ("dataset", "marker"),
    [("cub200", "CUB_200_2011/images.txt"), ("sop", "Stanford_Online_Products/Ebay_train.txt"),
     ("vehicleid", "VehicleID_V1.0/train_test_split/train_list.txt")],
)  # fmt: skip
def test_a_data_root_without_the_dataset_is_one_clear_error(dataset, marker, tmp_path):
    with pytest.raises(HarnessError) as err:
        DATASETS.get(dataset)(tmp_path, tmp_path / "cache")
    message = str(err.value)
    assert f"no {marker} under {tmp_path}" in message and "extract" in message
    assert "\n" not in message
