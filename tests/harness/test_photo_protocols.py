"""The real-photo protocols beside the birds: the cars196_mini and grocery_store_mini datasets
(archives, class-disjoint splits, coarse labels, bad archives), a wholly frozen trunk (only the
head trains on the cached pooled features), the cache's room check, and the calibration that
chooses a protocol's settings on validation classes without reading the test classes."""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import harness.methods  # noqa: F401  (registers the methods)
import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from test_birds import cached, tiny_protocol

from harness.backbones import BACKBONES, FrozenTrunkTail, trunk_outputs
from harness.cli import main
from harness.core import METHODS, HarnessError, load_protocol
from harness.data import DATASETS, register_dataset, split_classes
from harness.data import photo_zip as pz
from harness.train import features
from harness.tune import calibrate as cal

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
needs = {spec.name: pytest.mark.skipif(not (SHARED / spec.name / f"{spec.name}.zip").is_file(),
                                       reason=f"{spec.name}.zip not present in {SHARED}")
         for spec in (pz.CARS, pz.GROCERIES)}  # fmt: skip


@pytest.fixture(scope="module")
def cars():
    return DATASETS.get("cars196_mini")(None, None)


@pytest.fixture(scope="module")
def groceries():
    return DATASETS.get("grocery_store_mini")(None, None)


@needs["cars196_mini"]
@pytest.mark.slow
def test_cars196_mini_is_the_standard_cars196_split_with_body_types(cars):
    protocol = load_protocol("cars")
    split = split_classes(cars, protocol.split)
    assert cars.images.shape == (2940, 3, 227, 227) and len(cars.class_names) == 196
    assert np.bincount(cars.labels).tolist() == [15] * 196
    # the standard split: official ids 1-98 train (AM General Hummer .. Eagle Talon), 99-196 test
    assert split.train_classes[0] == "AM General Hummer SUV 2000"
    assert split.train_classes[-1] == "Eagle Talon Hatchback 1998"
    assert split.test_classes[0] == "FIAT 500 Abarth 2012" and len(split.test_classes) == 98
    assert not set(split.train_classes) & set(split.test_classes)
    coarse = {cars.class_names[c]: cars.coarse_names[k]
              for c, k in zip(cars.labels, cars.coarse_labels, strict=False)}  # fmt: skip
    assert coarse["AM General Hummer SUV 2000"] == "suv"
    assert coarse["Acura Integra Type R 2001"] == "other"  # no body word in the name
    assert coarse["Ram C-V Cargo Van Minivan 2012"] == "minivan"  # Minivan before Van
    assert coarse["Chevrolet Silverado 1500 Extended Cab 2012"] == "pickup"
    assert cars.files[0].startswith("cars196_mini/images/AM General Hummer SUV 2000/")


@needs["grocery_store_mini"]
@pytest.mark.slow
def test_grocery_store_mini_is_40_products_to_train_41_to_test_with_manifest_kinds(groceries):
    split = split_classes(groceries, load_protocol("groceries").split)
    assert len(groceries) == 3232 and len(groceries.class_names) == 81
    assert len(split.train_classes) == 40 and split.test_classes[0] == "Green-Bell-Pepper"
    assert not set(split.train_classes) & set(split.test_classes)
    kind = {groceries.class_names[c]: groceries.coarse_names[k]
            for c, k in zip(groceries.labels, groceries.coarse_labels, strict=False)}  # fmt: skip
    assert kind["Granny-Smith"] == "Apple" and kind["Alpro-Blueberry-Soyghurt"] == "Soyghurt"
    assert kind["Arla-Ecological-Medium-Fat-Milk"] == "Milk"
    assert len(groceries.coarse_names) == 43


@pytest.mark.parametrize("spec", [pz.CARS, pz.GROCERIES], ids=lambda s: s.name)
def test_a_missing_truncated_or_altered_archive_is_refused(spec, tmp_path):
    fetch = f"data fetch {spec.name} --data-root {tmp_path}"
    with pytest.raises(HarnessError, match=f"{spec.name} is not in --data-root .*{fetch}"):
        DATASETS.get(spec.name)(tmp_path, None)
    with zipfile.ZipFile(tmp_path / f"{spec.name}.zip", "w") as z:  # one photo, and altered
        z.writestr(f"{spec.name}/images/A/1.jpg", b"not a photo")
    with pytest.raises(HarnessError, match=f"is not the dataset: [0-9]+ missing .*1 extra "
                       f"\\({spec.name}/images/A/1.jpg\\)"):  # fmt: skip
        DATASETS.get(spec.name)(tmp_path, None)


@needs["cars196_mini"]
def test_a_bad_archive_is_one_line_exit_2_and_nothing_is_written(tmp_path, capsys):
    short = tmp_path / "short"
    short.mkdir()
    with open(SHARED / "cars196_mini" / "cars196_mini.zip", "rb") as f:
        (short / "cars196_mini.zip").write_bytes(f.read(1 << 20))
    results = tmp_path / "results"
    for root, message in ((tmp_path, "cars196_mini is not in"), (short, "is not a readable zip")):
        code = main(["run", "--protocol", "cars", "--method", "contrastive", "--seeds", "0",
                     "--data-root", str(root), "--results-dir", str(results), "--quiet"])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], err
        assert not results.exists()


# --- a wholly frozen trunk ---------------------------------------------------------------------


def test_a_wholly_frozen_trunk_caches_pooled_features_and_the_tail_returns_them(tmp_path,
                                                                                 monkeypatch):  # fmt: skip
    ctx, prepared, data = cached(tmp_path, tiny_protocol(tmp_path, frozen=8), monkeypatch)
    full = BACKBONES.get("efficientnet_lite0")(pretrained="imagenet", in_channels=3).eval()
    assert data.images.test.shape[1] == sum(full.stage_dims)  # 1,872 values, not 7 x 7 x 1,280
    tail = FrozenTrunkTail(full, 8).eval()
    assert not list(tail.parameters())  # nothing of the backbone trains: only the head will
    images = prepared.data.images[:3].load()[:, :, 4:68, 4:68]
    with torch.no_grad():
        expected = full(full.prepare(images))
        got = tail(tail.prepare(data.images[:3].to("cpu")))
        assert torch.equal(trunk_outputs(full, full.prepare(images), 8),
                           torch.cat(expected, dim=1))  # fmt: skip
    for g, e in zip(got, expected, strict=True):  # the cache holds float16
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)


def test_frozen_stages_past_the_network_is_refused_by_validate_before_any_work(tmp_path, capsys):
    protocol_file = tiny_protocol(tmp_path, frozen=9)
    assert main(["validate", str(protocol_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "frozen_stages must be 1..8" in err[0] and "got 9" in err[0]
    results = tmp_path / "results"
    code = main(["run", "--protocol", str(protocol_file), "--method", "contrastive",
                 "--data-root", str(tmp_path / "data"), "--results-dir", str(results), "-q"])  # fmt: skip
    assert code == 2 and not results.exists()
    assert not (tmp_path / "cache").exists()


def test_a_cache_larger_than_the_machine_is_refused_before_the_trunk_runs(tmp_path, monkeypatch,
                                                                          capsys):  # fmt: skip
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(features, "available_memory", lambda: 100_000)
    ran = []
    monkeypatch.setattr(features, "trunk_outputs", lambda *a: ran.append(1) or torch.zeros(1, 999))
    results = tmp_path / "results"
    code = main(["run", "--protocol", str(tiny_protocol(tmp_path, frozen=6)), "--method",
                 "contrastive", "--data-root", str(tmp_path / "data"), "--results-dir",
                 str(results), "-q"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    # 12 training images x 2 views + 24 images = 48 rows of 999 values, 2 bytes each
    assert "48 rows of 999 values" in err[0] and "0.0 GB of memory available" in err[0]
    assert ran == [1] and not results.exists()  # only the one-image probe ran


# --- calibration -------------------------------------------------------------------------------


def calibration_file(tmp_path: Path, protocol_file: Path, name: str = "calibration",
                     **changes) -> Path:  # fmt: skip
    spec = {"protocol": str(protocol_file), "validation_fraction": 0.4, "seed": 0,
            "methods": ["contrastive", "multi_similarity"], "zero_shot": "untrained",
            "sweep_budget_minutes": 90,
            "grid": {"budget.steps": [1, 3], "optimizer.lr": [0.001]}, **changes}  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("changes, message", [
    ({"validation_fraction": 0}, "validation_fraction must be in \\(0, 1\\)"),
    ({"grid": {"split.validation_fraction": [0.5]}}, "may not change the split"),
    ({"grid": {"evaluation.metrics": [["map@r"]]}}, "may not change the split, dataset, seeds or evaluation"),
    ({"grid": {"budget.epoch": [1]}, "colour": 1}, "unknown key 'colour'"),
    ({"grid": {"optimiser.lr": [1]}}, "unknown setting 'optimiser.lr'.*optimizer"),
    ({"methods": ["contrastiv"]}, "unknown method 'contrastiv'.*contrastive"),
    ({"grid": {"budget.steps": []}}, "non-empty list"),
    ({"limits": {"budget.epochs": "x"}}, "limits names 'budget.epochs', which the grid does not set"),
    ({"search": "neighbors"}, "search 'neighbors' is not one of grid, neighbours.*neighbours"),
])  # fmt: skip
def test_a_calibration_that_would_read_test_classes_or_is_malformed_is_one_line(
    tmp_path, capsys, changes, message
):
    path = calibration_file(tmp_path, tiny_protocol(tmp_path), **changes)
    assert main(["calibrate", str(path), "--results-dir", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "results").exists()


def poisoned_folder(name: str) -> None:
    """A `folder` dataset whose test classes (the last 5 of 10 sorted classes) hold one
    image over and over, their labels shuffled: what a calibration must never look at."""

    @register_dataset(name)
    def build(data_root, cache_dir):
        data = DATASETS.get("folder")(data_root, cache_dir)
        test = np.flatnonzero(data.labels >= 5)
        rows = np.arange(len(data))
        rows[test] = 0
        labels = data.labels.copy()
        labels[test] = np.random.default_rng(1).permutation(labels[test][::-1])
        return replace(data, images=data.images[rows], labels=labels)


def test_calibration_reads_only_validation_classes_and_chooses_the_best_within_budget(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    protocol_file = tiny_protocol(tmp_path)
    rng = np.random.default_rng(1)
    for c in range(6, 10):  # 10 classes: 3 to train, 2 to validate, 5 to test
        (tmp_path / "data" / f"class{c}").mkdir()
        for i in range(4):
            pixels = (rng.random((72, 72, 3)) * 60 + c * 20).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / f"class{c}" / f"{i}.png")
    # a budget no timing can exceed: both grid candidates run however loaded the machine is
    # (a 6-step probe's time per step is noisy under load, and the budget rule is tested on
    # hand-made records below), so the two records differ only if the test classes count
    calibration = calibration_file(tmp_path, protocol_file, sweep_budget_minutes=10**6)
    clean = cal.calibrate(str(calibration), tmp_path / "clean", str(tmp_path / "data"), "cpu")
    poisoned_folder("poisoned_folder_for_calibration")
    poisoned = tmp_path / "poisoned.yaml"
    poisoned.write_text(protocol_file.read_text().replace(
        "{name: folder, params: {}}", "{name: poisoned_folder_for_calibration, params: {}}"))  # fmt: skip
    other = calibration_file(
        tmp_path, poisoned, name="calibration_poisoned", sweep_budget_minutes=10**6
    )
    dirty = cal.calibrate(str(other), tmp_path / "dirty", str(tmp_path / "data"), "cpu")

    def scores(record):
        return {c: {m: r["map@r"] for m, r in runs.items()} for c, runs in record["runs"].items()}

    assert scores(dirty) == scores(clean)  # no number depends on the test classes
    assert dirty["choice"]["chosen"] == clean["choice"]["chosen"]
    assert set(scores(clean)) == {"budget.steps=1, optimizer.lr=0.001",
                                  "budget.steps=3, optimizer.lr=0.001"}  # fmt: skip
    assert all(set(r) == {"untrained", "contrastive", "multi_similarity"}
               for r in scores(clean).values())  # fmt: skip
    # the record and its table are written, and a rerun resumes: nothing trains again
    stored = json.loads((tmp_path / "clean/calibration/calibration.json").read_text())
    # every registered method was timed once (budget and learning rate share one probe)
    assert list(stored["probes"]) == ["-"] and set(stored["probes"]["-"]) == set(METHODS.names())
    assert stored["probes"]["-"]["quadruplet_method1"] == {"not_applicable": "needs coarse labels"}
    assert stored["probes"]["-"]["contrastive"]["step_seconds"] > 0
    assert stored["choice"] == json.loads(json.dumps(clean["choice"]))
    assert "| candidate |" in (tmp_path / "clean/calibration/calibration.md").read_text()
    monkeypatch.setattr("harness.train.train_model", lambda *a, **k: pytest.fail("trained again"))
    again = cal.calibrate(str(calibration), tmp_path / "clean", str(tmp_path / "data"), "cpu")
    assert scores(again) == scores(clean)
    # a grid widened with other values keeps its finished candidates: only the new ones train
    wider = calibration_file(
        tmp_path,
        protocol_file,
        sweep_budget_minutes=10**6,
        grid={"budget.steps": [1, 3], "optimizer.lr": [0.001, 0.01]},
    )
    trained = []
    monkeypatch.setattr("harness.train.train_model",
                        lambda ctx, *a, **k: trained.append(ctx.protocol.optimizer.lr) or
                        pytest.fail("stop after the first new run"))  # fmt: skip
    with pytest.raises(pytest.fail.Exception):
        cal.calibrate(str(wider), tmp_path / "clean", str(tmp_path / "data"), "cpu")
    assert trained == [0.01]  # the first candidate not in the old grid, not an old one
    kept = json.loads((tmp_path / "clean/calibration/calibration.json").read_text())
    assert {c: {m: r["map@r"] for m, r in runs.items()} for c, runs in kept["runs"].items()
            if "0.001" in c} == scores(clean)  # fmt: skip


def test_the_choice_is_the_best_mean_among_candidates_whose_sweep_fits():
    spec = cal.Calibration("c", "p", 0.3, 0, ["a", "b"], {"budget.epochs": [10, 30, 100]},
                           sweep_budget_minutes=60, zero_shot="untrained")  # fmt: skip
    runs = {"budget.epochs=10": {"untrained": {"map@r": 0.30, "seconds": 0},
                                 "a": {"map@r": 0.30, "seconds": 1}, "b": {"map@r": 0.34, "seconds": 1}},
            "budget.epochs=30": {"untrained": {"map@r": 0.30, "seconds": 0},
                                 "a": {"map@r": 0.36, "seconds": 3}, "b": {"map@r": 0.36, "seconds": 3}},
            "budget.epochs=100": {"untrained": {"map@r": 0.30, "seconds": 0},
                                  "a": {"map@r": 0.40, "seconds": 10}, "b": {"map@r": 0.40, "seconds": 10}}}  # fmt: skip
    sizes = {"train": 200, "images": 400, "calibration_train": 100, "calibration_images": 200,
             "seeds": 5, "methods": 29}  # fmt: skip
    choice = cal.choose({"runs": runs, "caches": {"-": 120.0}}, spec, sizes)
    minutes = {r["candidate"]: r["sweep_minutes"] for r in choice["candidates"]}
    # 10 s a run, doubled for twice the training images, x 29 methods x 5 seeds, + the cache
    # scaled from 200 to 400 rows: (20 x 145 + 240) / 60 = 52.3 minutes
    assert minutes["budget.epochs=100"] == pytest.approx(52.3, abs=0.05)
    assert choice["chosen"] == "budget.epochs=100" and choice["learns"]
    tight = replace(spec, sweep_budget_minutes=30)
    choice = cal.choose({"runs": runs, "caches": {"-": 120.0}}, tight, sizes)
    assert choice["chosen"] == "budget.epochs=30"  # 100 epochs would not fit 30 minutes
    assert choice["chosen_settings"] == {"budget.epochs": 30}


def test_the_record_says_whether_each_choice_is_inside_its_grid_or_at_a_named_limit():
    spec = cal.Calibration("c", "p", 0.3, 0, ["a"], {"budget.epochs": [10, 30, 100],
                           "optimizer.lr": [0.001, 0.0001], "embedding_dim": [512]},
                           sweep_budget_minutes=60, zero_shot="untrained")  # fmt: skip
    sizes = {"train": 100, "images": 200, "calibration_train": 100, "calibration_images": 200,
             "seeds": 1, "methods": 1}  # fmt: skip

    def run(score, seconds):
        return {
            "untrained": {"map@r": 0.3, "seconds": 0},
            "a": {"map@r": score, "seconds": seconds},
        }

    def ids(epochs, lr):
        return f"budget.epochs={epochs}, optimizer.lr={lr}, embedding_dim=512"

    runs = {ids(10, 0.0001): run(0.40, 60), ids(30, 0.0001): run(0.50, 180),
            ids(100, 0.0001): run(0.45, 600), ids(30, 0.001): run(0.42, 180)}  # fmt: skip
    choice = cal.choose({"runs": runs, "caches": {}}, spec, sizes)
    where = choice["positions"]
    assert choice["chosen"] == ids(30, 0.0001)
    assert where["budget.epochs"] == {"value": 30, "position": "interior", "tried_below": 10,
                                      "tried_above": 100, "limit": None}  # fmt: skip
    # the smaller learning rate is the grid's edge, and nothing names a limit there
    assert where["optimizer.lr"]["position"] == "edge" and where["optimizer.lr"]["limit"] is None
    assert where["optimizer.lr"]["tried_above"] == 0.001
    assert where["embedding_dim"]["position"] == "fixed"
    # the longest budget chosen, and twice it would be over the budget: the budget is named
    shorter = replace(spec, grid={**spec.grid, "budget.epochs": [10, 30]},
                      limits={"optimizer.lr": "the smallest rate the budget trains to the end"})  # fmt: skip
    slow = {ids(10, 0.0001): run(0.40, 60), ids(30, 0.0001): run(0.50, 2000),
            ids(30, 0.001): run(0.38, 60)}  # fmt: skip
    record = {"runs": slow, "caches": {}, "skipped": {}}
    choice = cal.choose(record, shorter, sizes)
    where = choice["positions"]
    assert choice["chosen"] == ids(30, 0.0001)  # 2000 s a run: a sweep of 33 minutes
    assert where["budget.epochs"]["position"] == "edge" and where["budget.epochs"]["value"] == 30
    assert where["budget.epochs"]["limit"] == ("the sweep budget: twice 30 would take about 67 "
                                               "minutes, over 60")  # fmt: skip
    assert where["optimizer.lr"]["limit"] == "the smallest rate the budget trains to the end"
    assert "| budget.epochs | 30 | edge | 10 | - | the sweep budget" in cal.markdown(
        {**record, "choice": choice}, shorter
    )
    # a neighbour run and found over the budget counts as tried: 30 is then interior
    over = {**slow, ids(100, 0.0001): run(0.55, 6000)}
    where = cal.choose({"runs": over, "caches": {}}, spec, sizes)["positions"]
    assert where["budget.epochs"]["position"] == "interior"
    assert where["budget.epochs"]["tried_above"] == 100


def test_the_neighbour_search_walks_from_the_best_until_every_neighbour_is_tried():
    spec = cal.Calibration("c", "p", 0.3, 0, ["a"], {"optimizer.lr": [0.0001, 0.001, 0.01],
                           "embedding_dim": [128, 256, 512, 1024]}, 600,
                           zero_shot="untrained", search="neighbours")  # fmt: skip
    sizes = {"train": 100, "images": 200, "calibration_train": 100, "calibration_images": 200,
             "seeds": 1, "methods": 1}  # fmt: skip
    score = {(0.0001, 128): 0.1, (0.001, 128): 0.2, (0.01, 128): 0.15, (0.0001, 256): 0.3,
             (0.001, 256): 0.5, (0.01, 256): 0.2, (0.0001, 512): 0.4, (0.001, 512): 0.6,
             (0.01, 512): 0.3, (0.0001, 1024): 0.1, (0.001, 1024): 0.55, (0.01, 1024): 0.2}  # fmt: skip
    record = {"runs": {}, "caches": {}, "skipped": {}}
    walked = []
    while todo := cal.next_neighbours(record, spec, sizes):
        for c in todo:
            walked.append((c["optimizer.lr"], c["embedding_dim"]))
            value = score[walked[-1]]
            record["runs"][cal.candidate_id(c)] = {"untrained": {"map@r": 0.0, "seconds": 0},
                                                   "a": {"map@r": value, "seconds": 1}}  # fmt: skip
    # the grid's middle first, then its four neighbours; the best moves to 512, whose new
    # neighbours (1e-4 and 1e-2 at 512, and 1024) are tried; then nothing is left around it
    assert walked == [(0.001, 256), (0.0001, 256), (0.01, 256), (0.001, 128), (0.001, 512),
                      (0.0001, 512), (0.01, 512), (0.001, 1024)]  # fmt: skip
    choice = cal.choose(record, spec, sizes)
    assert choice["chosen_settings"] == {"optimizer.lr": 0.001, "embedding_dim": 512}
    assert {k: p["position"] for k, p in choice["positions"].items()} == {
        "optimizer.lr": "interior",
        "embedding_dim": "interior",
    }
    assert len(record["runs"]) == 8  # of the grid's 12


def test_a_widened_grid_is_recognised_after_its_record_is_stored_with_sorted_keys():
    spec = cal.Calibration("c", "p", 0.3, 0, ["a"], {"optimizer.lr": [0.001],
                           "budget.epochs": [10]}, 90, zero_shot="untrained")  # fmt: skip
    stored = json.loads(json.dumps(cal.described(spec), sort_keys=True))
    wider = replace(spec, grid={"optimizer.lr": [0.001, 0.01], "budget.epochs": [10]},
                    search="neighbours")  # fmt: skip
    assert cal._widened(stored, cal.described(wider))
    assert not cal._widened(stored, cal.described(replace(wider, seed=1)))


def test_a_candidate_is_projected_from_a_finished_one_on_the_same_trunk():
    spec = cal.Calibration("c", "p", 0.3, 0, ["a"],
                           {"features.frozen_stages": [8, 7], "budget.epochs": [10, 30]}, 90,
                           zero_shot="untrained")  # fmt: skip
    done = {"untrained": {"map@r": 0.3, "seconds": 0}, "a": {"map@r": 0.4, "seconds": 12}}
    record = {"runs": {"features.frozen_stages=7, budget.epochs=10": done},
              "caches": {"features.frozen_stages=7": 60.0}}  # fmt: skip
    sizes = {"train": 100, "images": 200, "calibration_train": 100, "calibration_images": 200,
             "seeds": 5, "methods": 29}  # fmt: skip
    later = {"features.frozen_stages": 7, "budget.epochs": 30}
    minutes, source = cal.projected_minutes(record, spec, later, sizes)
    # 3 x 12 s a run x 29 methods x 5 seeds + 60 s of cache = 88 minutes
    assert minutes == pytest.approx(88.0) and source == "features.frozen_stages=7, budget.epochs=10"
    # another trunk has nothing finished to project from
    assert cal.projected_minutes(record, spec, {"features.frozen_stages": 8, "budget.epochs": 30},
                                 sizes) is None  # fmt: skip


def test_the_neighbour_search_walks_on_from_a_middle_that_is_over_the_budget():
    """The middle candidate runs and its sweep is over the budget: the walk goes on from it
    (the quickest finished) to its neighbours, instead of stopping with no choice."""
    spec = cal.Calibration("c", "p", 0.3, 0, ["a"], {"budget.epochs": [3, 10, 30],
                           "embedding_dim": [256, 512, 1024]}, 60,
                           zero_shot="untrained", search="neighbours")  # fmt: skip
    sizes = {"train": 100, "images": 200, "calibration_train": 100, "calibration_images": 200,
             "seeds": 1, "methods": 1}  # fmt: skip
    record = {"runs": {}, "caches": {}, "skipped": {}}
    [middle] = cal.next_neighbours(record, spec, sizes)
    assert middle == {"budget.epochs": 10, "embedding_dim": 512}
    record["runs"][cal.candidate_id(middle)] = {"untrained": {"map@r": 0.3, "seconds": 0},
                                                "a": {"map@r": 0.5, "seconds": 7200}}  # fmt: skip
    assert cal.choose(record, spec, sizes)["chosen"] is None  # 120 minutes: over 60
    assert cal.next_neighbours(record, spec, sizes) == [
        {"budget.epochs": 3, "embedding_dim": 512},
        {"budget.epochs": 30, "embedding_dim": 512},
        {"budget.epochs": 10, "embedding_dim": 256},
        {"budget.epochs": 10, "embedding_dim": 1024},
    ]


# name, the calibration it holds, and the protocol and version that calibration ran on (a
# recalibration of version k gives version k + 1: cars_v2 ran on cars v1)
@pytest.mark.parametrize(
    "name, calibration, base, version",
    [("cars", "cars_v2", "cars", 1), ("groceries", "groceries_v2", "groceries", 1),
     ("birds", "birds_v3", "birds", 2), ("photos", "cars_v2", "cars", 1),
     ("plankton", "plankton", "plankton", 1), ("pollen", "pollen", "pollen", 1),
     ("objects", "objects", "objects", 1), ("flowers", "flowers", "flowers", 1)],
)  # fmt: skip
def test_each_committed_protocol_holds_its_calibrations_choice(name, calibration, base, version):
    record = json.loads(
        (REPO / "results/reference/calibration" / f"{calibration}.json").read_text()
    )
    protocol = load_protocol(name).content()
    chosen = record["choice"]["chosen_settings"]
    assert chosen, f"{name}: the calibration chose nothing"
    for dotted, value in chosen.items():
        node = protocol
        for part in dotted.split("."):
            node = node[part]
        assert node == value, f"{name}: {dotted} is {node}, the calibration chose {value}"
    assert record["calibration"]["protocol"] == base
    assert record["protocol_version"] == version
    # the committed record is the committed calibration file's
    assert record["calibration"] == json.loads(
        json.dumps(cal.described(cal.load_calibration(calibration)))
    )


# --- your own photos -----------------------------------------------------------------------


def photo_folder(root: Path, classes: int = 32, per_class: int = 4, short: int | None = None):
    """Class folders of small photos (32: 16 to train fill the protocol's 16 x 4 batch);
    class `short` (if any) holds 3."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"kind{c:02d}").mkdir(parents=True, exist_ok=True)
        for i in range(3 if c == short else per_class):
            pixels = (rng.random((40, 56, 3)) * 80 + c * 5).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"kind{c:02d}" / f"{i}.jpg")
    return root


def test_the_photos_protocol_runs_on_anyones_class_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    data = photo_folder(tmp_path / "mine")
    results = tmp_path / "results"
    code = main(["run", "--protocol", "photos", "--method", "untrained,contrastive", "--seeds",
                 "0", "--max-steps", "2", "--data-root", str(data), "--results-dir",
                 str(results), "-q"])  # fmt: skip
    assert code == 0
    zero = json.loads((results / "runs/photos/untrained/seed0.json").read_text())
    trained = json.loads((results / "runs/photos/contrastive/seed0.json").read_text())
    assert zero["training"]["steps"] == 0 and trained["training"]["steps"] == 2
    assert trained["protocol"]["content"]["features"]["frozen_stages"] == 8
    board = (results / "LEADERBOARD.md").read_text()
    assert "untrained (zero-shot)" in board and "vs zero-shot" in board
    assert len(list((tmp_path / "cache" / "features").glob("*.pt"))) == 1


def test_a_training_class_with_fewer_than_k_photos_is_one_line_before_any_work(tmp_path,
                                                                              monkeypatch, capsys):  # fmt: skip
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    data = photo_folder(tmp_path / "mine", short=1)  # kind01 trains, with 3 photos
    results = tmp_path / "results"
    code = main(["run", "--protocol", "photos", "--all", "--data-root", str(data),
                 "--results-dir", str(results), "-q"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "kind01" in err[0] and "3" in err[0], err
    assert not results.exists() and not (tmp_path / "cache" / "features").exists()


# --- the committed real-photo verdict ------------------------------------------------------


def test_the_claims_across_real_photo_protocols_are_each_protocols_own_verdicts():
    from harness.records import load_results, pretrained, protocol_groups
    from harness.report.claims import claim_rows, claims_across

    groups = protocol_groups(load_results(REPO / "results" / "reference"))
    photo = [name for name, group in sorted(groups.items()) if pretrained(group)]
    assert {"cars", "groceries"} <= set(photo)
    rows = claims_across(groups)
    for name in photo:
        own = claim_rows(groups[name])
        assert [r[name] for r in rows] == [o["verdict"] for o in own]
        assert [r[f"{name}: Δ recall@1"] for r in rows] == [o["ours: Δ recall@1"] for o in own]
    board = (REPO / "results" / "reference" / "LEADERBOARD.md").read_text()
    assert "## The seed papers' claims on every real-photo protocol" in board
