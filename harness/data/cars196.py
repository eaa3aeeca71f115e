"""cars196: Stanford Cars (Krause et al., 2013), 16,185 images of 196 car models.

Two official layouts under --data-root, whichever is there:
- `cars_annos.mat` with `car_ims/` (the all-in-one release): `annotations` holds
  relative_im_path, bbox_x1, bbox_y1, bbox_x2, bbox_y2, class (1-196) and test (the
  classification split, not used here); `class_names` the 196 names.
- the devkit: `devkit/cars_meta.mat` (class_names), `devkit/cars_train_annos.mat` and
  `cars_test_annos_withlabels.mat` (in the root or in devkit/; fname, the box and class) with
  the images in `cars_train/` and `cars_test/`.
The deep-metric-learning split of the seed papers: classes 1-98 train, 99-196 test. Class
names are "NNN <official name>" (zero-padded id first: the official names sort differently
from the ids). With bounding_boxes: true each image is cropped to its box (1-based inclusive
pixel corners in the .mat files).

Coarse labels (for the hierarchical methods of the quadruplet paper, which derived them from
the car type): CARS196 has none officially; we derive a body type from the words of the
official class name by the first rule that matches (BODY_TYPES, in order): Minivan -> minivan;
Van -> van; Cab or SuperCab -> pickup; SUV -> suv; Convertible -> convertible; Coupe -> coupe;
Sedan -> sedan; Hatchback -> hatchback; Wagon -> wagon; no such word (e.g. "Chevrolet Corvette
ZR1 2012") -> other. The paper does not publish its table, so ours may differ from it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.official import Listing, require_root

TRAIN_CLASSES = 98  # classes 1..98 train, the rest test
# (words in the class name, body type): the first rule whose word appears wins
BODY_TYPES = (
    (("Minivan",), "minivan"),
    (("Van",), "van"),
    (("Cab", "SuperCab"), "pickup"),
    (("SUV",), "suv"),
    (("Convertible",), "convertible"),
    (("Coupe",), "coupe"),
    (("Sedan",), "sedan"),
    (("Hatchback",), "hatchback"),
    (("Wagon",), "wagon"),
)


def body_type(class_name: str) -> str:
    """The car body type named in an official class name, or "other"; see BODY_TYPES."""
    words = set(class_name.split())
    for keys, kind in BODY_TYPES:
        if words.intersection(keys):
            return kind
    return "other"


def _loadmat(path: Path) -> dict:
    from scipy.io import loadmat

    if not path.is_file():
        raise HarnessError(f"cars196: {path} is missing; it is part of the official dataset")
    try:
        return loadmat(str(path), squeeze_me=True)
    except Exception as exc:  # scipy raises ValueError, TypeError, MatReadError, OSError
        raise HarnessError(f"cars196: cannot read {path} ({exc}); get it again") from None


def _field(struct: np.ndarray, name: str, path: Path) -> list:
    records = np.atleast_1d(struct)
    if records.dtype.names is None or name not in records.dtype.names:
        raise HarnessError(f"cars196: {path} has no annotations field {name!r}")
    return [np.asarray(v).item() if np.ndim(v) == 0 else v for v in records[name]]


def _names(mat: dict, path: Path) -> list[str]:
    if "class_names" not in mat:
        raise HarnessError(f"cars196: {path} has no class_names")
    return [str(np.asarray(v).item()).strip() for v in np.atleast_1d(mat["class_names"])]


def _annotations(path: Path, image_dir: Path | None, path_field: str):
    """(files, class ids, boxes) of one annotations .mat file."""
    mat = _loadmat(path)
    if "annotations" not in mat:
        raise HarnessError(f"cars196: {path} has no annotations")
    ann = mat["annotations"]
    rel = [str(v) for v in _field(ann, path_field, path)]
    classes = [int(v) for v in _field(ann, "class", path)]
    corners = [
        [float(v) for v in _field(ann, key, path)]
        for key in ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2")
    ]
    # 1-based inclusive corners -> pixel edges (left, top, right, bottom)
    boxes = np.stack([np.asarray(corners[0]) - 1, np.asarray(corners[1]) - 1, corners[2],
                      corners[3]], axis=1)  # fmt: skip
    files = [str((image_dir or path.parent) / r) for r in rel]
    return files, classes, boxes, mat


def listing(data_root: Path | None) -> Listing:
    """The official annotations of Stanford Cars under data_root (either layout)."""
    root = require_root("cars196", data_root, "cars_annos.mat and car_ims/ (or the devkit)")
    if (root / "cars_annos.mat").is_file():
        files, classes, boxes, mat = _annotations(root / "cars_annos.mat", root, "relative_im_path")
        names = _names(mat, root / "cars_annos.mat")
        layout = "cars_annos.mat"
    elif (root / "devkit" / "cars_meta.mat").is_file():
        names = _names(_loadmat(root / "devkit" / "cars_meta.mat"), root / "devkit/cars_meta.mat")
        test_annos = next(
            (p for p in (root / "cars_test_annos_withlabels.mat",
                         root / "devkit" / "cars_test_annos_withlabels.mat") if p.is_file()),
            root / "cars_test_annos_withlabels.mat",
        )  # fmt: skip
        f1, c1, b1, _ = _annotations(
            root / "devkit" / "cars_train_annos.mat", root / "cars_train", "fname"
        )
        f2, c2, b2, _ = _annotations(test_annos, root / "cars_test", "fname")
        files, classes, boxes = f1 + f2, c1 + c2, np.concatenate([b1, b2])
        layout = "devkit"
    else:
        raise HarnessError(
            f"cars196: neither {root / 'cars_annos.mat'} nor {root / 'devkit/cars_meta.mat'} "
            "exists; put the Stanford Cars files there (see docs/datasets.md)"
        )
    bad = sorted({c for c in classes if not 1 <= c <= len(names)})
    if bad:
        raise HarnessError(f"cars196: class ids {bad[:5]} are outside 1..{len(names)}")
    used = sorted(set(classes))
    label_of = {c: k for k, c in enumerate(used)}
    class_names = [f"{c:03d} {names[c - 1]}" for c in used]
    types = sorted({body_type(names[c - 1]) for c in used})
    type_of = {c: types.index(body_type(names[c - 1])) for c in used}
    order = np.argsort(files, kind="stable")  # a stable item order whatever the layout
    return Listing(
        dataset="cars196",
        root=root,
        files=[files[i] for i in order],
        labels=np.asarray([label_of[classes[i]] for i in order], dtype=np.int64),
        class_names=class_names,
        partition=np.asarray(["train" if classes[i] <= TRAIN_CLASSES else "test" for i in order]),
        boxes=boxes[order],
        coarse_labels=np.asarray([type_of[classes[i]] for i in order], dtype=np.int64),
        coarse_names=types,
        note=f"; layout {layout}; coarse labels: body type from the class name",
    )


@register_dataset("cars196", needs_data_root=True)
def build(
    data_root: Path | None, cache_dir: Path, *, bounding_boxes: bool = False
) -> LabelledImages:
    """Stanford Cars from either official layout; see the module docstring."""
    if not isinstance(bounding_boxes, bool):
        raise HarnessError(f"cars196: bounding_boxes must be true or false, got {bounding_boxes!r}")
    return listing(data_root).to_images(bounding_boxes)
