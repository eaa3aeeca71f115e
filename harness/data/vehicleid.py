"""vehicleid: PKU VehicleID (Liu et al., 2016), 221,763 images of 26,267 vehicles.

Reads `VehicleID_V1.0/` (or --data-root itself when it is that folder):
`train_test_split/train_list.txt` and the test lists `test_list_800.txt` (small),
`test_list_1600.txt` (medium), `test_list_2400.txt` (large), each line `<image> <vehicle id>`,
images in `image/<image>.jpg`. The protocol's dataset param test_set picks the test list. As in
the HDC paper, the test set is searched all-vs-all and MAP is the mean over all queries of the
average precision over the whole ranking (the harness's `map` metric).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.official import Listing, find_dir, index_labels, read_rows, require_root

FOLDER = "VehicleID_V1.0"
TEST_SETS = {"small": 800, "medium": 1600, "large": 2400}


def listing(data_root: Path | None, test_set: str = "small") -> Listing:
    """The training list and one official test list of VehicleID under data_root."""
    if test_set not in TEST_SETS:
        raise HarnessError(
            f"vehicleid: test_set must be one of {', '.join(TEST_SETS)}, got {test_set!r}"
        )
    root = require_root("vehicleid", data_root, f"{FOLDER}/ (train_test_split/, image/)")
    base = find_dir("vehicleid", root, FOLDER, "train_test_split/train_list.txt",
                    "extract the VehicleID release there")  # fmt: skip
    split_dir = base / "train_test_split"
    files, vehicles, parts = [], [], []
    for part, name in (
        ("train", "train_list.txt"),
        ("test", f"test_list_{TEST_SETS[test_set]}.txt"),
    ):
        for _, (image, vehicle, *_) in read_rows(split_dir / name, 2):
            files.append(str(base / "image" / f"{image}.jpg"))
            vehicles.append(vehicle)
            parts.append(part)
    labels, class_names = index_labels(vehicles)
    return Listing(
        dataset="vehicleid",
        root=base,
        files=files,
        labels=labels,
        class_names=class_names,
        partition=np.asarray(parts),
        note=f"; test set {test_set} (test_list_{TEST_SETS[test_set]}.txt)",
    )


@register_dataset("vehicleid", needs_data_root=True)
def build(data_root: Path | None, cache_dir: Path, *, test_set: str = "small") -> LabelledImages:
    """VehicleID: the training list and the small, medium or large test list."""
    return listing(data_root, test_set).to_images()
