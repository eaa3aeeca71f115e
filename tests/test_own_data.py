"""Datasets you bring without code: `folder` (one directory per class) and `csv` (an
open-metric-learning table), their checks in `data verify` and before any run, and the
walk-through of docs/own-data.md run exactly as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from PIL import Image, ImageDraw

from harness.cli import main
from harness.core import HarnessError
from harness.data import folder, table
from tests.walkthrough import REPO, run_page

SHAPES = 8  # classes


def draw(path: Path, cls: int, i: int) -> None:
    """A small PNG of class `cls`: an ellipse whose place says the class, noise says the image."""
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.new("RGB", (20, 20), (10 * i, 0, 0))
    ImageDraw.Draw(im).ellipse((cls, i % 3, 8 + cls, 12), fill=(255, 20 * cls, 100))
    im.save(path)


def image_folder(
    root: Path, classes: int = SHAPES, per_class: int = 4, fixed: bool = False
) -> Path:
    for c in range(classes):
        part = ("train/" if c < classes // 2 else "test/") if fixed else ""
        for i in range(per_class):
            draw(root / f"{part}class{c}" / f"{i}.png", c, i)
    return root


def oml_table(root: Path, rows: list[dict], name: str = "dataset.csv") -> Path:
    """An OML-format table; each row's image is drawn unless its path leads elsewhere."""
    root.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    lines = [",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in rows]
    (root / name).write_text("\n".join(lines) + "\n")
    for r in rows:
        if "path" in r and not str(r["path"]).startswith(("..", "/")):
            draw(root / r["path"], int(r.get("label", 0)) % 10, hash(r["path"]) % 7)
    return root


def oml_rows(query_gallery: bool = True) -> list[dict]:
    """4 train and 4 validation labels, 4 images each, with OML's columns (and its boxes)."""
    rows = []
    for label in range(8):
        for i in range(4):
            row = {"label": label, "path": f"images/{label}_{i}.png", "category": label % 2,
                   "split": "train" if label < 4 else "validation", "x_1": 0, "y_1": 0}  # fmt: skip
            if label >= 4:
                query = i < 2 if query_gallery else True
                row["is_query"], row["is_gallery"] = query, (not query) if query_gallery else True
            rows.append(row)
    return rows


def protocol(tmp: Path, dataset: str, official: bool = False, k: int = 2, **params) -> str:
    data = {
        "schema": 1, "name": "own", "version": 1,
        "dataset": {"name": dataset, **({"params": params} if params else {})},
        "split": {"official": True} if official else {"train_fraction": 0.5},
        "backbone": {"name": "conv4", "input_size": 16, "pretrained": "none",
                     "params": {"width": 8}},
        "embedding_dim": 8, "sampler": {"classes_per_batch": 2, "images_per_class": k},
        "optimizer": {"name": "adam", "lr": 0.001}, "budget": {"steps": 2},
        "evaluation": {"recall_ks": [1]}, "seeds": [0],
    }  # fmt: skip
    path = tmp / f"own-{dataset}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def run(tmp: Path, proto: str, root: Path | None, results: Path) -> int:
    args = ["-q", "run", "--protocol", proto, "--method", "contrastive", "--max-steps", "2",
            "--workers", "0", "--results-dir", str(results)]  # fmt: skip
    return main(args + (["--data-root", str(root)] if root else []))


def result(results: Path) -> dict:
    return json.loads((results / "runs" / "own" / "contrastive" / "seed0.json").read_text())


def listing(folder_: Path) -> list[str]:
    return sorted(str(p.relative_to(folder_)) for p in folder_.rglob("*"))


def test_the_walkthrough_runs_as_written(tmp_path):
    image_folder(tmp_path / "my-images", per_class=6)
    done = run_page(REPO / "docs" / "own-data.md", tmp_path)
    assert [d.returncode for d in done] == [0] * 8, [d.stderr[-2000:] for d in done]
    verify = done[0].stdout.splitlines()
    assert verify[-1] == "OK" and "8 classes, 48 images" in verify[1]
    for method in ("contrastive", "triplet"):
        record = json.loads((tmp_path / "my-results" / "runs" / "my-protocol" / method /
                             "seed0.json").read_text())  # fmt: skip
        assert record["status"] == "ok" and 0 <= record["metrics"]["recall@1"] <= 1
        assert "my-images" in record["dataset"]["source"]
        assert record["split"]["train_classes"] == 4 and record["split"]["test_classes"] == 4
    assert (tmp_path / "my-results" / "LEADERBOARD.md").is_file()
    # section 6: the winner kept, exported, a catalogue of the photos, and a search in it
    kept = json.loads((tmp_path / "my-results" / "runs" / "my-protocol" / "contrastive" /
                       "seed0.json").read_text())["model"]  # fmt: skip
    assert kept["file"] == "seed0.model.pt" and len(kept["weights_sha256"]) == 64
    assert (tmp_path / "my-model.onnx").stat().st_size > 0
    header = json.loads((tmp_path / "my-index" / "catalogue.json").read_text())
    assert header["count"] == 48 and header["model"]["weights_sha256"] == kept["weights_sha256"]
    hits = done[5].stdout.splitlines()
    assert hits[0] == "my-images/class0/0.png:" and len(hits) == 6
    assert hits[1].split()[1:] == ["0.0000", "class0/0.png"]  # a catalogue photo finds itself
    assert (tmp_path / "my-search.html").read_text().count("<img ") == 6
    # then a model trained on all 8 classes, indexed: no benchmark run of it is written
    everything = json.loads((tmp_path / "my-index-all" / "catalogue.json").read_text())
    assert everything["count"] == 48
    assert everything["model"]["weights_sha256"] != kept["weights_sha256"]
    assert (tmp_path / "my-results" / "models" / "my-protocol" / "contrastive" /
            "seed0.model.pt").is_file()  # fmt: skip


def test_folder_fixed_split_runs_under_official_and_is_refused_without(tmp_path, capsys):
    root = image_folder(tmp_path / "imgs", fixed=True)
    results = tmp_path / "results"
    assert run(tmp_path, protocol(tmp_path, "folder", official=True), root, results) == 0
    split = result(results)["split"]
    assert (split["train_classes"], split["test_classes"]) == (4, 4)
    capsys.readouterr()
    assert run(tmp_path, protocol(tmp_path, "folder"), root, tmp_path / "other") == 2
    assert "write split: {official: true} in the protocol" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_a_class_in_both_train_and_test_is_named(tmp_path):
    root = image_folder(tmp_path / "imgs", fixed=True)
    draw(root / "test" / "class1" / "0.png", 1, 0)
    with pytest.raises(HarnessError, match="class 'class1' is in both the train and the test"):
        folder.listing(root)


def test_csv_runs_queries_against_the_gallery_its_flags_name(tmp_path):
    root = oml_table(tmp_path / "oml", oml_rows(query_gallery=True))
    results = tmp_path / "results"
    assert run(tmp_path, protocol(tmp_path, "csv", official=True), root, results) == 0
    record = result(results)
    assert record["split"]["query_images"] == 8 and record["split"]["gallery_images"] == 8
    assert record["split"]["train_classes"] == 4 and record["split"]["test_images"] == 16


def test_oml_columns_map_to_parts_labels_and_categories(tmp_path):
    root = oml_table(tmp_path / "oml", oml_rows(query_gallery=False))
    found = table.listing(root)
    assert found.class_names == [str(n) for n in range(8)]
    assert sorted(set(found.partition.tolist())) == ["test", "train"]  # all both: all-vs-all
    assert found.coarse_names == ["0", "1"] and found.coarse_labels.tolist()[:5] == [0] * 4 + [1]
    data = found.to_images()
    assert data.fixed_split and "fixed split train 16, test 16" in data.source
    mixed = oml_rows(query_gallery=True)
    mixed[-1]["is_query"] = True  # both, while the others are one of them
    with pytest.raises(
        HarnessError, match="others only one; the harness evaluates either all-vs-all"
    ):
        table.listing(oml_table(tmp_path / "mixed", mixed))


def test_csv_and_folder_follow_the_same_symlinked_images(tmp_path):
    """Images kept elsewhere, listed through links inside the root (a linked image, a linked
    folder): the path is judged as written, so both datasets list them and the csv runs."""
    store = oml_table(tmp_path / "store", oml_rows())  # the real images live here
    root = tmp_path / "oml"
    root.mkdir()
    (root / "img").symlink_to(store / "images")  # a linked folder
    rows = oml_rows()
    for r in rows:
        r["path"] = r["path"].replace("images/", "img/")
    rows[0]["path"] = "own.png"
    (root / "own.png").symlink_to(store / "images" / "0_0.png")  # a linked image
    oml_table(root, rows)
    found = table.listing(root)
    assert found.files[:2] == [str(root.resolve() / "own.png"), str(root.resolve() / "img/0_1.png")]
    assert found.to_images().files[:2] == ("own.png", "img/0_1.png")
    classes = tmp_path / "classes"
    for c in range(4):
        (classes / f"class{c}").mkdir(parents=True)
        for i in range(4):
            (classes / f"class{c}" / f"{i}.png").symlink_to(store / "images" / f"{c}_{i}.png")
    assert len(folder.listing(classes).files) == 16
    results = tmp_path / "results"
    assert run(tmp_path, protocol(tmp_path, "csv", official=True), root, results) == 0
    assert result(results)["status"] == "ok"


def _one_class(tmp: Path) -> list[str]:
    return ["folder", str(image_folder(tmp / "d", classes=1))]


def _empty_class(tmp: Path) -> list[str]:
    root = image_folder(tmp / "d")
    (root / "zzz").mkdir()
    return ["folder", str(root)]


def _no_column(tmp: Path) -> list[str]:
    rows = [{k: v for k, v in r.items() if k != "split"} for r in oml_rows()]
    return ["csv", str(oml_table(tmp / "d", rows))]


def _path_outside(path: str):
    def make(tmp: Path) -> list[str]:
        rows = oml_rows()
        rows[3]["path"] = path.format(tmp=tmp)
        draw(tmp / "x.png", 0, 0)
        return ["csv", str(oml_table(tmp / "d", rows))]

    return make


def _missing_file(tmp: Path) -> list[str]:
    root = oml_table(tmp / "d", oml_rows())
    (root / "images" / "2_1.png").unlink()
    return ["csv", str(root)]


def _small_class(tmp: Path) -> list[str]:
    root = image_folder(tmp / "d", per_class=4)
    (root / "class0" / "3.png").unlink()
    return ["folder", str(root), "4"]


BAD = {
    "one class": (_one_class, "holds 1 class folder (class0)"),
    "empty class folder": (_empty_class, "zzz holds no images"),
    "csv without split": (_no_column, "has no column 'split'"),
    "csv path ../": (_path_outside("../x.png"), "'../x.png' has a '..' component"),
    "csv path a/../../": (_path_outside("images/../../x.png"), "has a '..' component and leads"),
    "csv absolute path": (_path_outside("{tmp}/x.png"), "x.png' is absolute; paths are relative"),
    "listed file missing": (_missing_file, "2_1.png is missing"),
    "class under K": (_small_class, "fewer than images_per_class=4 images: class0 (3)"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_one_line_before_training_and_leaves_results_alone(case, tmp_path, capsys):
    make, expected = BAD[case]
    dataset, root, *k = make(tmp_path)
    results = tmp_path / "results"
    (results / "runs" / "other").mkdir(parents=True)
    (results / "runs" / "other" / "seed0.json").write_text("{}")
    before = listing(results)
    proto = protocol(tmp_path, dataset, official=dataset == "csv", k=int(k[0]) if k else 2)
    assert run(tmp_path, proto, Path(root), results) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and expected in err, err
    assert listing(results) == before


def test_a_missing_data_root_is_refused_before_any_folder_exists(tmp_path, capsys):
    results = tmp_path / "results"
    assert run(tmp_path, protocol(tmp_path, "folder"), None, results) == 2
    assert "pass --data-root DIR" in capsys.readouterr().err
    assert not results.exists()


@pytest.mark.parametrize("command", [
    ["tune", "--protocol", "fair_cub200", "--method", "contrastive", "--trials", "2"],
    ["cost", "--protocol", "omniglot", "--methods", "contrastive"],
])  # fmt: skip
def test_tune_and_cost_refuse_a_missing_data_root_before_any_work(command, tmp_path, capsys):
    results = tmp_path / "results"
    assert main([*command, "--results-dir", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reads dataset" in err and "pass --data-root DIR" in err
    assert not results.exists()


def verify(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(["data", "verify", *args])
    return code, capsys.readouterr().out.splitlines()


def test_verify_reports_each_problem_on_one_line(tmp_path, capsys):
    root = oml_table(tmp_path / "oml", [r for r in oml_rows() if r["path"] != "images/1_3.png"])
    (root / "images" / "1_2.png").unlink()
    (root / "images" / "5_0.png").write_bytes(b"not a png")
    proto = protocol(tmp_path, "csv", official=True, k=4)
    code, out = verify(capsys, "--dataset", "csv", "--data-root", str(root), "--protocol", proto)
    assert code == 1 and out[-1].startswith("FAIL")
    assert [line for line in out if line.startswith("missing")] == [
        f"missing {(root / 'images' / '1_2.png').resolve()}"]  # fmt: skip
    bad = [line for line in out if line.startswith("unreadable: cannot decode image")]
    assert len(bad) == 1 and "5_0.png" in bad[0]
    assert bad[0].endswith("fix or remove the file in your folder (docs/own-data.md)")
    assert "class 1 (3 images): fewer than K=4 training images" in out
    fixed = image_folder(tmp_path / "imgs", fixed=True)
    draw(fixed / "test" / "class2" / "0.png", 2, 0)
    code, out = verify(capsys, "--dataset", "folder", "--data-root", str(fixed))
    assert code == 1 and out[-1].startswith("FAIL folder: class 'class2' is in both")
    code, out = verify(
        capsys, "--dataset", "folder", "--data-root", str(image_folder(tmp_path / "ok"))
    )
    assert code == 0 and out[-1] == "OK"


@pytest.mark.parametrize("decoder", ["pil", "torch"])
def test_a_broken_photo_of_ones_own_folder_is_to_be_fixed_or_removed(decoder, tmp_path):
    """Not "replace it from the official archive": a folder of one's own has none."""
    root = image_folder(tmp_path / "imgs")
    (root / "class3" / "1.png").write_bytes(b"not a png")
    (root / "class4" / "2.png").write_bytes(b"")
    images = folder.listing(root).to_images().images.decoded_by(decoder)
    files = [str(p) for p in images.paths]
    for name in ("class3/1.png", "class4/2.png"):
        with pytest.raises(HarnessError) as err:
            images[files.index(str(root / name))]
        assert str(err.value).endswith("fix or remove the file in your folder (docs/own-data.md)")
        assert "official archive" not in str(err.value)


def test_a_model_trained_on_every_class_indexes_and_searches_and_is_no_benchmark(tmp_path, capsys):
    root = image_folder(tmp_path / "imgs")
    proto = protocol(tmp_path, "folder")
    results = tmp_path / "results"
    args = ["-q", "run", "--protocol", proto, "--method", "contrastive", "--all-classes",
            "--workers", "0", "--results-dir", str(results), "--data-root", str(root)]  # fmt: skip
    assert main(args) == 0
    model = results / "models" / "own" / "contrastive" / "seed0.model.pt"
    assert model.is_file() and not (results / "runs").exists()  # no result, no leaderboard
    import torch

    meta = torch.load(model, map_location="cpu", weights_only=True)["meta"]
    assert meta["provenance"]["test_metric"] is None
    assert meta["provenance"]["all_classes"]["classes"] == SHAPES  # all 8, not the 4 to train
    assert meta["provenance"]["all_classes"]["images"] == SHAPES * 4
    assert "exists (pass --force" in (main(args), capsys.readouterr().out)[1]  # kept, not redone
    index = tmp_path / "index"
    assert main(["-q", "index", str(model), "--images", str(root), "--out", str(index)]) == 0
    query = root / "class6" / "1.png"  # a class a benchmark run would only have tested on
    capsys.readouterr()
    assert main(["search", str(index), str(query), "--k", "2", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["queries"][0]["results"]
    assert found[0]["path"].endswith("class6/1.png") and found[0]["distance"] < 1e-3
    for command in (
        ["tune", "--protocol", proto, "--method", "contrastive", "--trials", "2", "--all-classes"],
        ["leaderboard", "--all-classes"],
    ):
        with pytest.raises(SystemExit) as stopped:  # refused while the line is parsed
            main(command)
        assert stopped.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--all-classes belongs to `run`" in err[0], err
    assert main([*args, "--max-steps", "2"]) == 2
    assert "drop --max-steps" in capsys.readouterr().err
