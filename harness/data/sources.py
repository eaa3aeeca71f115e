"""How a photo set's manifest is made from its public source: one folder per class, capped.

A maintainer's step, run once per dataset on a snapshot of the pinned source repository (a
checkout, or its extracted archive); users never run it, they fetch the files the manifest
lists (harness.data.rebuild). The selection is decided from the file list alone, before any
number is seen, and is recorded here so that anyone can remake the same manifest:

- every class folder under the source's `prefix`, except those `exclude` names;
- the files whose names end in one of `extensions`, sorted by name;
- a class keeps its first `cap` files; a class with fewer than `floor` is left out
  (retrieval needs a class to hold enough photos to rank, and no class may dominate);
- each kept file becomes `<name>/images/<class>/<file>` by the dataset's `rule`
  (harness.data.rebuild.derive), its extension changed to `.jpg` when the rule re-encodes.

`python -m harness.data.sources NAME SOURCE_FOLDER OUT.csv.gz [LABELS_FOLDER]` writes the
manifest (LABELS_FOLDER: a set whose source has no class folders takes each image's class
from a second pinned repository, `labels_repo`).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.core import HarnessError


@dataclass(frozen=True)
class ClassFolders:
    """A source holding one folder per class, and the rule that selects and derives a set."""

    name: str  # the dataset (harness.data.photo_sets.SETS)
    prefix: str  # the source folder holding the class folders, with its trailing slash
    extensions: tuple[str, ...] = (".jpg",)
    rule: str = "copy"
    cap: int = 40  # at most this many files a class
    floor: int = 20  # classes with fewer files are left out
    exclude: tuple[str, ...] = ()  # class folders that are not classes of the set
    # where the class folders come from when the image source has none: a second pinned
    # repository whose paths `<labels_prefix><split>/<class>/<file>` name each image's class
    labels_repo: str = ""
    labels_prefix: str = ""


SOURCES = {
    s.name: s
    for s in (
        # NOAA PlanktonSet 1.0 as the National Data Science Bowl's `train/` (121 classes,
        # 9 to 1,979 images each): 109 classes keep 20 to 40 images, 4,197 in all.
        ClassFolders("plankton", "train/"),
        # POLLEN73S (73 types, 10 to 35 microscope images each, JPEG and LZW TIFF up to
        # 1219 x 1175 px): 72 types keep 29 to 35 images, resized as the groceries are.
        ClassFolders(
            "pollen",
            "Dataset/POLLEN73S/",
            extensions=(".jpg", ".tif"),
            rule="short_side_256_bicubic_q90",
        ),
        # Caltech-101 (101 categories, 31 to 800 photos each): `BACKGROUND_Google` is no
        # category and `Faces` is `Faces_easy` cropped otherwise (Faces_easy is kept).
        ClassFolders("caltech101", "101_ObjectCategories/", exclude=("BACKGROUND_Google", "Faces")),
        # Oxford Flowers-102 as 64 x 64 px copies (`flowers/`, `testimages/`: all 8,189
        # images, no labels); each image's class from the file list of a second repository
        # (`flowers/{train,valid,test}/<class 1-102>/image_NNNNN.jpg`, the original
        # imagelabels.mat's classes), named `NNN` (zero-padded, so that the sorted split
        # trains on classes 1-51). 40 to 258 images a class: every class keeps 40.
        ClassFolders(
            "flowers",
            "",
            labels_repo="PepeTapia/UdacityAWS_Nanodegree@24d3f798ea15d47665b24fab2b7cff96e69dba24",
            labels_prefix="flowers/",
        ),
    )
}


@dataclass(frozen=True)
class Chosen:
    """One source file kept for the set, and its path in the set."""

    source_path: str
    file: str


def labels_of(spec: ClassFolders, label_paths: list[str]) -> dict[str, str]:
    """Image file name -> class, from the labels repository's paths (`<labels_prefix><split>/
    <class>/<file>`); the class number zero-padded to three digits."""
    out: dict[str, str] = {}
    for path in label_paths:
        parts = path[len(spec.labels_prefix) :].split("/")
        if path.startswith(spec.labels_prefix) and len(parts) == 3 and parts[1].isdigit():
            cls = f"{int(parts[1]):03d}"
            if out.setdefault(parts[2], cls) != cls:
                raise HarnessError(f"{spec.name}: {parts[2]} is labelled both {out[parts[2]]} "
                                   f"and {cls} in {spec.labels_repo}")  # fmt: skip
    return out


def _class_and_file(spec: ClassFolders, path: str, labels: dict[str, str] | None):
    """(class, file name) of a source path, or None when it is no image of a class."""
    if not path.startswith(spec.prefix):
        return None
    parts = path[len(spec.prefix) :].split("/")
    if labels is not None:
        cls = labels.get(parts[-1])
        return (cls, parts[-1]) if cls is not None and len(parts) == 2 else None
    if len(parts) != 2 or parts[0] in spec.exclude:
        return None
    return parts[0], parts[1]


def choose(spec: ClassFolders, paths: list[str],
           labels: dict[str, str] | None = None) -> list[Chosen]:  # fmt: skip
    """The kept files of `paths` (source paths, `/`-separated), by the rule in the module
    docstring, sorted by their path in the set; `labels` (file name -> class) where the
    source has no class folders."""
    by_class: dict[str, list[str]] = {}
    for path in paths:
        found = _class_and_file(spec, path, labels)
        if found and found[1].lower().endswith(spec.extensions) and found[1][0] != ".":
            by_class.setdefault(found[0], []).append(path)
    chosen = []
    for cls, files in sorted(by_class.items()):
        if len(files) < spec.floor:
            continue
        for path in sorted(files)[: spec.cap]:
            stem = path.rsplit("/", 1)[-1]
            if spec.rule != "copy":
                stem = stem.rsplit(".", 1)[0] + ".jpg"
            chosen.append(Chosen(path, f"{spec.name}/images/{cls}/{stem}"))
    if len({c.file for c in chosen}) != len(chosen):
        raise HarnessError(f"{spec.name}: two source files would make the same file of the set")
    if not chosen:
        raise HarnessError(f"{spec.name}: no class under {spec.prefix} holds {spec.floor} "
                           f"files ending in {', '.join(spec.extensions)}: is it the source "
                           "snapshot?")  # fmt: skip
    return sorted(chosen, key=lambda c: c.file)


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def make_manifest(spec: ClassFolders, source: Path, labels: Path | None = None) -> str:
    """The manifest's CSV text for the set `spec` from the source folder `source` (and the
    labels repository's folder `labels`, for a set whose source has no class folders)."""
    from harness.data.rebuild import derive

    if bool(spec.labels_repo) != (labels is not None):
        raise HarnessError(f"{spec.name}: " + ("give the labels repository's folder "
                           f"({spec.labels_repo})" if spec.labels_repo else
                           "takes no labels folder"))  # fmt: skip
    paths = _files(source)
    by_file = labels_of(spec, _files(labels)) if labels is not None else None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["file", "file_sha256", "rule", "source_path", "source_sha256"])
    for c in choose(spec, paths, by_file):
        data = (source / c.source_path).read_bytes()
        made = derive(spec.rule, data)
        writer.writerow([c.file, hashlib.sha256(made).hexdigest(), spec.rule, c.source_path,
                         hashlib.sha256(data).hexdigest()])  # fmt: skip
    return out.getvalue()


def main(argv: list[str]) -> int:
    """`NAME SOURCE_FOLDER OUT.csv.gz [LABELS_FOLDER]`: write dataset NAME's manifest from
    its source (and its labels repository, for flowers)."""
    if len(argv) not in (3, 4) or argv[0] not in SOURCES:
        print(f"usage: python -m harness.data.sources {{{','.join(SOURCES)}}} SOURCE_FOLDER "
              "OUT.csv.gz [LABELS_FOLDER]", file=sys.stderr)  # fmt: skip
        return 2
    labels = Path(argv[3]) if len(argv) == 4 else None
    try:
        text = make_manifest(SOURCES[argv[0]], Path(argv[1]), labels)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with gzip.GzipFile(argv[2], "wb", mtime=0) as f:
        f.write(text.encode())
    print(f"{argv[2]}: {text.count(chr(10)) - 1} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
