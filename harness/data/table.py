"""csv: a table of images in open-metric-learning's (OML's) format, so an OML dataset runs here
unchanged.

The table is `<data-root>/<table>` (default `dataset.csv`), one row per image, columns:
`label` (the fine class), `path` (relative to the data root and judged as written: an
absolute path or one with a `..` component is an error; symbolic links on the way are followed
wherever they point, as the folder dataset follows them), `split` (`train` or `validation`:
OML's validation rows are the harness's test part), `is_query` and `is_gallery` (on validation
rows; absent: every validation row is both), optional `category` (the coarse label). Other
columns (OML's `x_1, y_1, x_2, y_2` boxes, `sequence`, ...) are ignored. The split is the
table's: the protocol must say `split: {official: true}`. Validation rows that are all both
query and gallery are searched all-vs-all (part `test`); rows that are each query or gallery,
not both, rank the queries against the gallery (In-shop's `query` / `gallery`); a mix of the
two is an error, since one evaluation cannot be both.
"""

from __future__ import annotations

import csv
from pathlib import Path, PurePath

import numpy as np

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.own import OwnListing, check_disjoint, index_labels, refuse_missing, require_root

REQUIRED = ("label", "path", "split")
SPLITS = {"train": "train", "validation": "test"}
TRUE, FALSE = {"true", "1", "yes", "1.0"}, {"false", "0", "no", "0.0"}


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The table's column names and rows; a missing file or column is a one-line error."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = [c.strip() for c in reader.fieldnames or []]
    except FileNotFoundError:
        raise HarnessError(f"csv: no table {path}; put it there or set dataset.params.table "
                           "to its name under --data-root") from None  # fmt: skip
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise HarnessError(f"csv: cannot read {path} ({exc})") from None
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise HarnessError(f"csv: {path} has no column {missing[0]!r} (it has: "
                           f"{', '.join(columns) or 'none'}); required: {', '.join(REQUIRED)}")  # fmt: skip
    if not rows:
        raise HarnessError(f"csv: {path} has no rows")
    return columns, [{k.strip(): (v or "").strip() for k, v in r.items() if k} for r in rows]


def _flag(value: str, column: str, where: str) -> bool:
    low = value.lower()
    if low in TRUE or low in FALSE:
        return low in TRUE
    raise HarnessError(f"csv: {where}: {column} is {value!r}; write True or False")


def _file(root: Path, value: str, where: str) -> str:
    """The row's image path under the data root, judged by what is written, as the folder
    dataset judges its files: relative, with no `..` component. A symbolic link on the way
    (a linked image, a linked folder) is followed wherever it points, so a table can list
    images kept elsewhere through links inside the root, as a folder dataset can."""
    if not value:
        raise HarnessError(f"csv: {where}: the path is empty")
    written = PurePath(value)
    if written.is_absolute():
        raise HarnessError(
            f"csv: {where}: path {value!r} is absolute; paths are relative to the folder "
            "holding the table: write it relative to the data root (a link inside the root "
            "may point elsewhere)"
        )
    if ".." in written.parts:
        raise HarnessError(
            f"csv: {where}: path {value!r} has a '..' component and leads outside the data "
            f"root {root}; move the image inside it, or link to it from inside it"
        )
    return str(root.resolve() / written)


def _evaluation_parts(flags: list[tuple[bool, bool]], table: Path) -> list[str]:
    """Each validation row's part: all both query and gallery -> "test" (all-vs-all); each
    one of them -> "query" / "gallery"; anything else cannot be one evaluation."""
    if all(q and g for q, g in flags):
        return ["test"] * len(flags)
    if all(q != g for q, g in flags):
        return ["query" if q else "gallery" for q, _ in flags]
    if any(not q and not g for q, g in flags):
        n = sum(not q and not g for q, g in flags)
        raise HarnessError(f"csv: {table}: {n} validation rows are neither query nor gallery; "
                           "mark each is_query or is_gallery (or drop the rows)")  # fmt: skip
    raise HarnessError(
        f"csv: {table}: some validation rows are both query and gallery and others only one; "
        "the harness evaluates either all-vs-all (every row both) or queries against a separate "
        "gallery (every row exactly one): fix is_query / is_gallery"
    )


def listing(data_root: Path | None, table: str = "dataset.csv") -> OwnListing:
    """The table's images, labels, fixed split and coarse categories (nothing decoded)."""
    root = require_root("csv", data_root)
    path = root / table
    columns, rows = _read(path)
    files, names, parts, categories, flags = [], [], [], [], []
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        where = f"{path.name} line {number}"
        split = row["split"].lower()
        if split not in SPLITS:
            raise HarnessError(f"csv: {where}: split is {row['split']!r}; write train or "
                               "validation")  # fmt: skip
        if not row["label"]:
            raise HarnessError(f"csv: {where}: the label is empty")
        files.append(_file(root, row["path"], where))
        names.append(row["label"])
        parts.append(SPLITS[split])
        categories.append(row.get("category", ""))
        if split == "validation":
            flags.append(tuple(_flag(row[c], c, where) if c in columns else True
                               for c in ("is_query", "is_gallery")))  # fmt: skip
    evaluation = iter(_evaluation_parts(flags, path)) if flags else iter(())
    parts = [p if p == "train" else next(evaluation) for p in parts]
    labels, class_names = index_labels(names)
    partition = np.asarray(parts)
    check_disjoint("csv", labels, class_names, partition, f"of {path}")
    coarse, coarse_names = index_labels(categories) if "category" in columns else (None, None)
    return OwnListing("csv", f"table {path}", files, labels, class_names, partition,
                      coarse, coarse_names, root)  # fmt: skip


@register_dataset("csv", needs_data_root=True)
def build(data_root: Path | None, cache_dir: Path, *, table: str = "dataset.csv") -> LabelledImages:
    """The images an OML-format table lists (see the module docstring); a run never starts
    when a listed file is missing."""
    found = listing(data_root, table)
    refuse_missing(found)
    return found.to_images()
