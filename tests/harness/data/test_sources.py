"""The photo sets made from class folders (harness.data.sources): the selection rule worked
by hand, and the shipped manifests remade from the shared samples of their pinned sources."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from harness.core import HarnessError
from harness.data import rebuild
from harness.data.photo_sets import SETS, manifest
from harness.data.sources import SOURCES, ClassFolders, choose, main, make_manifest

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data"


def _listing(counts: dict[str, int], prefix: str = "train/") -> list[str]:
    return [f"{prefix}{c}/{n:03d}.jpg" for c, k in counts.items() for n in range(k)]


def test_a_class_keeps_its_first_files_up_to_the_cap_and_small_classes_are_left_out():
    spec = ClassFolders("toy", "train/", cap=3, floor=2)
    paths = _listing({"b": 5, "a": 2, "c": 1}) + ["train/.DS_Store", "train/a/.hidden.jpg",
                                                  "train/a/notes.txt", "other/a/000.jpg",
                                                  "train/a/deeper/000.jpg"]  # fmt: skip
    chosen = choose(spec, paths)
    assert [c.file for c in chosen] == ["toy/images/a/000.jpg", "toy/images/a/001.jpg",
                                        "toy/images/b/000.jpg", "toy/images/b/001.jpg",
                                        "toy/images/b/002.jpg"]  # fmt: skip
    assert chosen[2].source_path == "train/b/000.jpg"


def test_excluded_folders_are_no_class_and_a_reencoding_rule_names_the_file_jpg():
    spec = ClassFolders("toy", "src/", extensions=(".tif", ".jpg"), rule="tiff_to_jpeg_q90",
                        cap=2, floor=1, exclude=("BACKGROUND",))  # fmt: skip
    chosen = choose(spec, ["src/BACKGROUND/x.jpg", "src/k/B.TIF", "src/k/a.jpg"])
    assert [(c.source_path, c.file) for c in chosen] == [("src/k/B.TIF", "toy/images/k/B.jpg"),
                                                         ("src/k/a.jpg", "toy/images/k/a.jpg")]  # fmt: skip


def test_a_listing_without_any_class_is_one_line():
    with pytest.raises(HarnessError, match="no class under train/ holds 20 files"):
        choose(SOURCES["plankton"], _listing({"a": 19}))


def test_every_source_is_a_shipped_photo_set():
    assert set(SOURCES) <= set(SETS)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_shipped_manifest_is_remade_from_the_sample_of_its_source(name, tmp_path, capsys):
    """The shared sample holds two classes of the source at the pinned commit, in its own
    paths: the selection keeps exactly the manifest's rows of those classes, byte for byte,
    and the build derives the manifest's files."""
    sample = SHARED / f"sources-{name}" / "sources-sample.zip"
    if not sample.is_file():
        pytest.skip(f"{sample} not present")
    with zipfile.ZipFile(sample) as z:
        z.extractall(tmp_path / "src")
        sources = {n for n in z.namelist() if not n.endswith("/")}
    labels = [str(tmp_path / "labels")] if SOURCES[name].labels_repo else []
    if labels:
        with zipfile.ZipFile(sample.with_name("labels-sample.zip")) as z:
            z.extractall(labels[0])
    out = tmp_path / "m.csv.gz"
    assert main([name, str(tmp_path / "src"), str(out), *labels]) == 0
    # a sample may hold only the first files of a class (floor 1 here; the full source's
    # floor decides which classes the manifest keeps)
    spec = replace(SOURCES[name], floor=1)
    made = make_manifest(spec, tmp_path / "src", *[Path(p) for p in labels]).splitlines()[1:]
    kept = manifest(name).expected
    made = [line for line in made if line.split(",", 1)[0] in kept]
    rows = [r for r in manifest(name).rows if r.source_path in sources]
    assert rows, "the sample holds none of the manifest's files"
    assert made == [f"{r.file},{r.file_sha256},{r.rule},{r.source_path},{r.source_sha256}"
                    for r in rows]  # fmt: skip
    assert rebuild.build(name, rows, sample, tmp_path / "built") == {"exact": True}
    for row in rows:
        built = (tmp_path / "built" / row.file).read_bytes()
        assert hashlib.sha256(built).hexdigest() == row.file_sha256


def test_the_plankton_selection_is_the_recorded_one():
    """109 of PlanktonSet's 121 classes, 20 to 40 images each (the sample's amphipods: 49
    in the source, its first 40 kept; appendicularian_fritillaridae: 16, left out)."""
    rows = manifest("plankton").rows
    per_class: dict[str, int] = {}
    for r in rows:
        per_class[r.file.split("/")[2]] = per_class.get(r.file.split("/")[2], 0) + 1
    assert len(rows) == 4197 and len(per_class) == 109
    assert min(per_class.values()) >= 20 and max(per_class.values()) == 40
    assert per_class["amphipods"] == 40 and "appendicularian_fritillaridae" not in per_class
    assert {r.rule for r in rows} == {"copy"}
