"""cub200: CUB-200-2011 (Wah et al., 2011), 11,788 images of 200 bird species.

Reads the official layout under --data-root (the folder holding `CUB_200_2011/`, or that folder
itself): `images.txt` (image id, relative path), `image_class_labels.txt` (image id, class id),
`classes.txt` (class id, name like `001.Black_footed_Albatross`), `bounding_boxes.txt`
(image id, x, y, width, height) and `images/`. The deep-metric-learning split of the seed
papers: classes 1-100 train, 101-200 test (the archive's own train_test_split.txt is an
image-level classification split, not used). Class names keep the zero-padded id first, so
sorting them sorts by id. With bounding_boxes: true every image is cropped to its box (the
PDDM paper's setting; HDC reports both).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.core import HarnessError, program_name
from harness.data.base import LabelledImages, register_dataset
from harness.data.official import Listing, as_int, find_dir, read_rows, require_root

FOLDER = "CUB_200_2011"
TRAIN_CLASSES = 100  # classes 1..100 train, the rest test
URL = "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz"


def listing(data_root: Path | None) -> Listing:
    """The official lists of CUB-200-2011 under data_root."""
    root = require_root("cub200", data_root, f"{FOLDER}/ (images.txt, images/, ...)")
    base = find_dir("cub200", root, FOLDER, "images.txt", "extract CUB_200_2011.tgz there "
                    f"(or run `{program_name()} data download --dataset cub200`)")  # fmt: skip
    listed = base / "images.txt"
    paths = {as_int(f[0], listed, n): f[1] for n, f in read_rows(listed, 2)}
    names = {}
    for n, f in read_rows(base / "classes.txt", 2):
        cid = as_int(f[0], base / "classes.txt", n)
        name = " ".join(f[1:])
        names[cid] = name if name.startswith(f"{cid:03d}") else f"{cid:03d}.{name}"
    class_of = {}
    for n, f in read_rows(base / "image_class_labels.txt", 2):
        class_of[as_int(f[0], base / "image_class_labels.txt", n)] = as_int(
            f[1], base / "image_class_labels.txt", n
        )
    boxes_of = {}
    for n, f in read_rows(base / "bounding_boxes.txt", 5):
        try:
            x, y, w, h = (float(v) for v in f[1:5])
        except ValueError:
            raise HarnessError(f"{base / 'bounding_boxes.txt'}:{n}: bad box {f[1:5]}") from None
        boxes_of[as_int(f[0], base / "bounding_boxes.txt", n)] = (x, y, x + w, y + h)
    ids = sorted(paths)
    for image_id in ids:
        if image_id not in class_of:
            raise HarnessError(f"cub200: image {image_id} has no line in image_class_labels.txt")
        if class_of[image_id] not in names:
            raise HarnessError(f"cub200: class {class_of[image_id]} is not in classes.txt")
    used = sorted({class_of[i] for i in ids})
    class_names = [names[c] for c in used]
    if class_names != sorted(class_names):
        raise HarnessError("cub200: classes.txt names do not sort by class id")
    label_of = {c: k for k, c in enumerate(used)}
    return Listing(
        dataset="cub200",
        root=base,
        files=[str(base / "images" / paths[i]) for i in ids],
        labels=np.asarray([label_of[class_of[i]] for i in ids], dtype=np.int64),
        class_names=class_names,
        partition=np.asarray(["train" if class_of[i] <= TRAIN_CLASSES else "test" for i in ids]),
        boxes=np.asarray([boxes_of.get(i, (np.nan,) * 4) for i in ids], dtype=np.float64),
    )


@register_dataset("cub200", needs_data_root=True)
def build(
    data_root: Path | None, cache_dir: Path, *, bounding_boxes: bool = False
) -> LabelledImages:
    """CUB-200-2011 from the official layout; see the module docstring."""
    if not isinstance(bounding_boxes, bool):
        raise HarnessError(f"cub200: bounding_boxes must be true or false, got {bounding_boxes!r}")
    return listing(data_root).to_images(bounding_boxes)
