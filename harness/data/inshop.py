"""inshop: DeepFashion In-shop Clothes Retrieval (Liu et al., 2016), 52,712 images of 7,982 items.

Reads `list_eval_partition.txt` from --data-root or its `Eval/` folder: a count line, a header
line `image_name item_id evaluation_status`, then one line per image, e.g.
`img/WOMEN/Dresses/id_00000002/02_1_front.jpg id_00000002 train`, status train, query or
gallery. Image paths are relative to --data-root or its `Img/` folder (where img.zip extracts).
The official protocol: 3,997 items train; the 3,985 test items are split into 14,218 query and
12,612 gallery images, and each query ranks the gallery (not all-vs-all). Fine label: the item
id; coarse label: the clothing category of its folder (e.g. WOMEN/Dresses).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.official import Listing, index_labels, read_rows, require_root

STATUS = {"train": "train", "query": "query", "gallery": "gallery"}


def listing(data_root: Path | None) -> Listing:
    """The official evaluation partition of In-shop under data_root."""
    root = require_root("inshop", data_root, "list_eval_partition.txt and img/")
    path = next(
        (p for p in (root / "list_eval_partition.txt", root / "Eval" / "list_eval_partition.txt")
         if p.is_file()),
        None,
    )  # fmt: skip
    if path is None:
        raise HarnessError(
            f"inshop: no list_eval_partition.txt in {root} or {root / 'Eval'}; put the "
            "In-shop benchmark's Eval/list_eval_partition.txt there"
        )
    rows = list(read_rows(path, 3, skip=2))
    image_base = next((b for b in (root, root / "Img") if (b / "img").is_dir()), root)
    files, items, categories, parts = [], [], [], []
    for n, (name, item, status, *_) in rows:
        if status not in STATUS:
            raise HarnessError(f"{path}:{n}: unknown evaluation_status {status!r}")
        files.append(str(image_base / name))
        items.append(item)
        categories.append("/".join(name.split("/")[1:3]))
        parts.append(STATUS[status])
    labels, class_names = index_labels(items)
    coarse, coarse_names = index_labels(categories)
    return Listing(
        dataset="inshop",
        root=root,
        files=files,
        labels=labels,
        class_names=class_names,
        partition=np.asarray(parts),
        coarse_labels=coarse,
        coarse_names=coarse_names,
    )


@register_dataset("inshop", needs_data_root=True)
def build(data_root: Path | None, cache_dir: Path) -> LabelledImages:
    """In-shop Clothes Retrieval with its train / query / gallery partition."""
    return listing(data_root).to_images()
