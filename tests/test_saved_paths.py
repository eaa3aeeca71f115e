"""Each saved row names its image: `run --save-embeddings` writes paths.txt (one path a line,
relative to the dataset's root) for every dataset read from files, so that what a query
retrieved can be looked up without the harness. A folder dataset's rows name the files of
their labels at the indices of indices.npy; omniglot records each image's path inside its
archive (the same for the zip and its extracted folder); `evaluate DIR` and `show` read the
folder as before, and a paths.txt that does not fit the rows is a one-line error."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from harness.cli import main
from harness.data import LabelledImages, folder, omniglot
from harness.data.lazy import relative_paths
from harness.evaluate import load_embeddings

pytestmark = pytest.mark.xdist_group("saved_paths")
QUICK = ["--device", "cpu", "--workers", "0"]
ARCHIVE = "images_background_small1"
OMNIGLOT_SMALL1 = Path("/work/shared/data/omniglot/images_background_small1.zip")
needs_small1 = pytest.mark.skipif(
    not OMNIGLOT_SMALL1.is_file(), reason=f"real Omniglot archive not present at {OMNIGLOT_SMALL1}"
)


def protocol(tmp: Path, dataset: dict, input_size: int = 16) -> Path:
    """A 2-step conv4 protocol on `dataset`, half the classes trained, half tested."""
    data = {
        "schema": 1, "name": "paths", "version": 1, "dataset": dataset,
        "split": {"train_fraction": 0.5},
        "backbone": {"name": "conv4", "input_size": input_size, "pretrained": "none",
                     "params": {"width": 8}},
        "embedding_dim": 8, "sampler": {"classes_per_batch": 2, "images_per_class": 2},
        "optimizer": {"name": "adam", "lr": 0.001}, "budget": {"steps": 2},
        "evaluation": {"recall_ks": [1]}, "seeds": [0],
    }  # fmt: skip
    path = tmp / f"paths-{dataset['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_saved(tmp: Path, dataset: dict, data_root: Path) -> Path:
    """A 2-step contrastive run with --save-embeddings on `dataset`; its result file."""
    results = tmp / "results"
    assert main(["-q", "run", "--protocol", str(protocol(tmp, dataset)), "--method",
                 "contrastive", "--data-root", str(data_root), "--results-dir", str(results),
                 "--save-embeddings", *QUICK]) == 0  # fmt: skip
    return results / "runs" / "paths" / "contrastive" / "seed0.json"


def class_folders(root: Path, classes: int = 8, per_class: int = 4) -> Path:
    """`root/<class>/<i>.png`, class names that sort otherwise than they were made, each
    image its own pixels (its class and index), in a nested folder for some."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        name = f"{'zyxwvuts'[c]}_class{c}"
        for i in range(per_class):
            where = root / name / ("nested" if i % 2 else "") / f"{i}.png"
            where.parent.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
            pixels[..., 0] = 20 * c
            Image.fromarray(pixels).save(where)
    return root


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory) -> tuple[Path, Path]:
    """(the result, the data root) of a run with --save-embeddings on a folder dataset."""
    tmp = tmp_path_factory.mktemp("folder_run")
    root = class_folders(tmp / "images")
    return run_saved(tmp, {"name": "folder"}, root), root


def test_each_row_names_the_file_of_its_label_at_its_index(folder_run):
    result, root = folder_run
    saved_dir = result.with_suffix(".embeddings")
    lines = (saved_dir / "paths.txt").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""  # one path a line, each line ended
    paths = lines[:-1]
    labels, indices = np.load(saved_dir / "labels.npy"), np.load(saved_dir / "indices.npy")
    assert len(paths) == len(labels) == len(indices) == 16  # the 4 test classes' images
    listing = folder.listing(root)
    for path, label, index in zip(paths, labels, indices, strict=True):
        assert not Path(path).is_absolute() and (root / path).is_file()
        assert Path(path).parts[0] == listing.class_names[label]  # its label's class folder
        assert root / path == Path(listing.files[index])  # the image at its index
    assert len(set(paths)) == len(paths)
    record = json.loads(result.read_text())
    meta = json.loads((saved_dir / "embeddings.json").read_text())
    assert "paths.txt" in meta["files"] and "paths.txt" in record["embeddings"]["files"]
    assert meta["format"] == 2  # optional within format 2: older readers ignore the file
    assert load_embeddings(saved_dir).paths == paths


def test_evaluate_and_show_read_a_folder_with_paths(folder_run, tmp_path: Path, capsys):
    result, root = folder_run
    metrics = json.loads(result.read_text())["metrics"]
    capsys.readouterr()
    assert main(["evaluate", str(result.with_suffix(".embeddings")), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["recall@1"] == pytest.approx(metrics["recall@1"], abs=1e-9)
    assert not any("differ from the files" in w for w in printed["warnings"])
    out = tmp_path / "grid.png"
    assert main(["show", str(result), "--data-root", str(root), "--k", "2", "--worst", "1",
                 "--best", "1", "--random", "0", "--out", str(out)]) == 0  # fmt: skip
    assert out.is_file()


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (lambda f: (f / "paths.txt").write_text("a.png\nb.png\n"), "paths.txt has 2 lines"),
        (lambda f: (f / "paths.txt").unlink(), "has no paths.txt"),
    ],
    ids=["line count", "listed but missing"],
)
def test_a_paths_file_that_does_not_fit_is_one_line(folder_run, tmp_path, capsys, damage,
                                                     fragment):  # fmt: skip
    copy = tmp_path / "seed0.embeddings"
    copy.mkdir()
    for file in folder_run[0].with_suffix(".embeddings").iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    damage(copy)
    capsys.readouterr()
    assert main(["evaluate", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and fragment in err, err


def test_a_folder_saved_before_paths_still_loads(folder_run, tmp_path: Path):
    copy = tmp_path / "seed0.embeddings"
    copy.mkdir()
    for file in folder_run[0].with_suffix(".embeddings").iterdir():
        if file.name != "paths.txt":
            (copy / file.name).write_bytes(file.read_bytes())
    meta = json.loads((copy / "embeddings.json").read_text())
    meta["files"].remove("paths.txt")
    (copy / "embeddings.json").write_text(json.dumps(meta))
    saved = load_embeddings(copy)
    assert saved.paths is None and saved.indices is not None


def test_relative_paths_under_the_root_its_resolved_form_or_outside(tmp_path: Path):
    real = tmp_path / "real"
    (real / "a").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    files = [str(link / "a" / "x.png"), str(real / "a" / "y.png"), str(tmp_path / "z.png")]
    assert relative_paths(files, link) == ("a/x.png", "a/y.png", "../z.png")


def test_subset_keeps_each_items_file():
    data = LabelledImages(
        images=torch.zeros((4, 1, 2, 2), dtype=torch.uint8),
        labels=np.array([0, 1, 0, 1]),
        class_names=["a", "b"],
        files=("a/0.png", "b/1.png", "a/2.png", "b/3.png"),
    )
    assert data.subset(np.array([3, 0])).files == ("b/3.png", "a/0.png")


# ----------------------------------------------------------------------------- omniglot


def _png(seed: int) -> bytes:
    """A 105x105 1-bit PNG like Omniglot's, its strokes placed by `seed`."""
    rng = np.random.default_rng(seed)
    pixels = np.ones((105, 105), bool)
    r, c = rng.integers(10, 90, size=2)
    pixels[r : r + 12, 10:95] = False
    pixels[10:95, c : c + 6] = False
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert("1").save(buffer, format="PNG")
    return buffer.getvalue()


def omniglot_zip(root: Path, alphabets: int = 2, characters: int = 4, drawers: int = 4) -> Path:
    """images_background_small1.zip under root, laid out as the official archive."""
    root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(root / f"{ARCHIVE}.zip", "w") as z:
        for a in range(alphabets):
            for k in range(1, characters + 1):
                for d in range(1, drawers + 1):
                    entry = f"{ARCHIVE}/Alpha{a}/character{k:02d}/{k:04d}_{d:02d}.png"
                    z.writestr(entry, _png(seed=100 * a + 10 * k + d))
    return root


def test_an_omniglot_run_saves_each_rows_path_inside_the_archive(tmp_path: Path):
    root = omniglot_zip(tmp_path / "omniglot")
    result = run_saved(tmp_path, {"name": "omniglot", "params": {"image_size": 16}}, root)
    saved = load_embeddings(result.with_suffix(".embeddings"))
    with zipfile.ZipFile(root / "images_background_small1.zip") as z:
        names = set(z.namelist())
    data = omniglot.build(root, tmp_path / "cache2", image_size=16)
    assert saved.paths is not None and len(saved.paths) == len(saved.labels)
    for path, label, index in zip(saved.paths, saved.labels, saved.indices, strict=True):
        assert path in names and path == data.files[index]
        assert "/".join(path.split("/")[1:3]) == data.class_names[label]


@needs_small1
def test_omniglot_files_are_the_archives_paths_for_the_zip_and_the_folder(tmp_path: Path):
    data = omniglot.build(OMNIGLOT_SMALL1.parent, tmp_path / "cache", image_size=8)
    with zipfile.ZipFile(OMNIGLOT_SMALL1) as z:
        names = z.namelist()
        greek = [n for n in names if n.startswith("images_background_small1/Greek/")]
        z.extractall(tmp_path / "root", members=greek)
    assert data.files is not None and len(data.files) == len(data) == 2720
    assert set(data.files) <= set(names) and len(set(data.files)) == len(data.files)
    assert data.files[0].startswith("images_background_small1/Balinese/character01/")
    for path, label in zip(data.files, data.labels, strict=True):
        assert "/".join(path.split("/")[1:3]) == data.class_names[label]  # Alphabet/characterNN
    extracted = omniglot.build(tmp_path / "root", tmp_path / "cache", image_size=8)
    assert list(extracted.files) == [p for p in data.files if "/Greek/" in p]  # as the zip's
