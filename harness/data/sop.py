"""sop: Stanford Online Products (Song et al., 2016), 120,053 images of 22,634 products.

Reads `Stanford_Online_Products/` (or --data-root itself when it is that folder):
`Ebay_train.txt` and `Ebay_test.txt`, each a header line `image_id class_id super_class_id
path` then one line per image, paths relative to the folder (`bicycle_final/111085122871_0.JPG`).
The official split is the two files: 11,318 training products, 11,316 test products. Fine
label: the product (class name: the zero-padded class id, so names sort by id); coarse label:
the super-class, one of the 12 product categories (named after its image folder).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.official import Listing, as_int, find_dir, read_rows, require_root

FOLDER = "Stanford_Online_Products"


def listing(data_root: Path | None) -> Listing:
    """The official train and test lists of SOP under data_root."""
    root = require_root("sop", data_root, f"{FOLDER}/ (Ebay_train.txt, Ebay_test.txt)")
    base = find_dir("sop", root, FOLDER, "Ebay_train.txt",
                    "extract Stanford_Online_Products.zip there")  # fmt: skip
    files, classes, supers, parts = [], [], [], []
    super_names: dict[int, str] = {}
    for part in ("train", "test"):
        path = base / f"Ebay_{part}.txt"
        for n, f in read_rows(path, 4, skip=1):
            cid, sid = as_int(f[1], path, n), as_int(f[2], path, n)
            files.append(str(base / f[3]))
            classes.append(cid)
            supers.append(sid)
            parts.append(part)
            folder = f[3].split("/")[0].removesuffix("_final")
            if super_names.setdefault(sid, folder) != folder:
                raise HarnessError(f"{path}:{n}: super-class {sid} is also {super_names[sid]!r}")
    width = len(str(max(classes, default=0)))
    used = sorted(set(classes))
    label_of = {c: k for k, c in enumerate(used)}
    super_ids = sorted(super_names)
    return Listing(
        dataset="sop",
        root=base,
        files=files,
        labels=np.asarray([label_of[c] for c in classes], dtype=np.int64),
        class_names=[f"{c:0{width}d}" for c in used],
        partition=np.asarray(parts),
        coarse_labels=np.asarray([super_ids.index(s) for s in supers], dtype=np.int64),
        coarse_names=[f"{s:02d} {super_names[s]}" for s in super_ids],
    )


@register_dataset("sop", needs_data_root=True)
def build(data_root: Path | None, cache_dir: Path) -> LabelledImages:
    """Stanford Online Products with its official split; see the module docstring."""
    return listing(data_root).to_images()
