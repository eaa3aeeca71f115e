"""Real-photo miniatures shipped as one zip of class folders: `cars196_mini` (2,940 Stanford
Cars crops, 196 models, 15 each) and `grocery_store_mini` (3,232 grocery photos, 81 products;
Klasson et al., WACV 2019, MIT licence).

Each reads `<name>.zip` from --data-root, by default `../shared/data/<name>` beside this
clone, checks its sha256, and decodes every photo once into memory at SIZE x SIZE (PIL
bilinear, antialiased; the aspect ratio is not kept, like the seed papers' 256 x 256 resize
and the harness's own image decoder). The archive holds `<name>/images/<class>/<file>.jpg`
and `<name>/manifest.csv`. The protocol's sorted split trains on the first half of the sorted
class names and tests on the second: for cars196_mini exactly the standard Cars196 split
(official ids 1-98 train, 99-196 test).

Coarse labels, for Karaman et al.'s quadruplet selection: the car's body type from its class
name (harness.data.cars196.body_type, as `quadruplet_cars196` uses), and the grocery
manifest's coarse class (Apple, Milk, Juice, ...).
"""

from __future__ import annotations

import csv
import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from harness.core import HarnessError, file_sha256
from harness.core.paths import PROTOCOL_DIR
from harness.data.base import LabelledImages, register_dataset
from harness.data.cars196 import body_type

SIZE = 227  # the birds' size: a 224 crop with a little room


@dataclass(frozen=True)
class PhotoZip:
    """One miniature: its archive's name and sha256, and how its coarse labels are read."""

    name: str
    sha256: str
    how_to_get: str
    coarse: Callable[[str, dict[str, str]], str]  # (class name, its manifest row) -> coarse

    @property
    def archive(self) -> str:
        return f"{self.name}.zip"

    @property
    def default_root(self) -> Path:
        # the clone's sibling shared/data/<name> (PROTOCOL_DIR is <clone>/protocols)
        return PROTOCOL_DIR.parent.parent / "shared" / "data" / self.name


def _how(name: str, source: str) -> str:
    return (f"{name}.zip is built from {source} as ../shared/data/{name}/README.md describes "
            f"(layout {name}/images/<class>/<file>.jpg and {name}/manifest.csv); pass "
            "--data-root with the folder holding it")  # fmt: skip


CARS = PhotoZip(
    "cars196_mini", "2999500f41527c86a780bf9622013e0fbbdfb530e1d2c299cd4819dbe7782c0b",
    _how("cars196_mini", "the Stanford Cars training split (15 crops per model)"),
    lambda cls, _row: body_type(cls),
)  # fmt: skip
GROCERIES = PhotoZip(
    "grocery_store_mini", "679f15ca4daa8b2bbd7733bedd5290e8982fab3b6c80a9261f4842b279adba75",
    _how("grocery_store_mini", "the Grocery Store Dataset (GitHub marcusklasson/"
         "GroceryStoreDataset, up to 40 photos per product)"),
    lambda _cls, row: row.get("coarse_class", "").strip(),
)  # fmt: skip


def find_archive(spec: PhotoZip, data_root: Path | None) -> Path:
    """The archive under data_root (default: the spec's), or a one-line error saying how to
    get it; a truncated or altered archive is refused by its sha256."""
    root = Path(data_root) if data_root is not None else spec.default_root
    where = "--data-root" if data_root is not None else "the default data root"
    path = root / spec.archive
    if not path.is_file():
        raise HarnessError(f"{spec.name}: no {spec.archive} in {where} {root}; {spec.how_to_get}")
    found = file_sha256(path)
    if found != spec.sha256:
        raise HarnessError(f"{spec.name}: {path} has sha256 {found[:16]}..., not the published "
                           f"{spec.sha256[:16]}... (truncated, or another file); "
                           f"{spec.how_to_get}")  # fmt: skip
    return path


def _decode(data: bytes, where: str, size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, ...
        raise HarnessError(f"cannot decode {where} ({exc}); get the archive again") from None
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def _manifest(archive: zipfile.ZipFile, spec: PhotoZip, path: Path) -> dict[str, dict[str, str]]:
    """The manifest's first row per class (the class's coarse class is the same on each)."""
    member = f"{spec.name}/manifest.csv"
    try:
        text = archive.read(member).decode("utf-8")
    except KeyError:
        raise HarnessError(f"{spec.name}: {path} holds no {member}; {spec.how_to_get}") from None
    rows: dict[str, dict[str, str]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        rows.setdefault(row.get("class", ""), row)
    return rows


def read(spec: PhotoZip, data_root: Path | None, size: int = SIZE) -> LabelledImages:
    """Every photo of the archive, labelled by its class folder (see the module docstring)."""
    path = find_archive(spec, data_root)
    prefix = f"{spec.name}/images/"
    with zipfile.ZipFile(path) as archive:
        members = sorted(m for m in archive.namelist()
                         if m.startswith(prefix) and not m.endswith("/"))  # fmt: skip
        manifest = _manifest(archive, spec, path)
        class_names = sorted({m[len(prefix) :].split("/", 1)[0] for m in members})
        images = np.empty((len(members), 3, size, size), dtype=np.uint8)
        for row, member in enumerate(members):
            images[row] = _decode(archive.read(member), f"{path}:{member}", size)
    order = {c: n for n, c in enumerate(class_names)}
    labels = np.array([order[m[len(prefix) :].split("/", 1)[0]] for m in members], np.int64)
    kinds = [spec.coarse(c, manifest.get(c, {})) for c in class_names]
    if not all(kinds):
        missing = [c for c, k in zip(class_names, kinds, strict=False) if not k][:3]
        raise HarnessError(f"{spec.name}: the manifest gives no coarse class for {missing}; "
                           f"{spec.how_to_get}")  # fmt: skip
    coarse_names = sorted(set(kinds))
    coarse_of = np.array([coarse_names.index(k) for k in kinds], dtype=np.int64)
    return LabelledImages(
        images=torch.from_numpy(images),
        labels=labels,
        class_names=class_names,
        coarse_labels=coarse_of[labels],
        coarse_names=coarse_names,
        files=tuple(members),  # inside the archive
        source=f"{spec.name} from {path} ({len(class_names)} classes, {len(members)} photos, "
        f"{size} px)",
    )


@register_dataset("cars196_mini")  # --data-root is optional: ../shared/data/cars196_mini
def build_cars(data_root: Path | None, cache_dir: Path) -> LabelledImages:
    """2,940 Stanford Cars crops of all 196 models (see the module docstring)."""
    return read(CARS, data_root)


@register_dataset("grocery_store_mini")  # --data-root is optional
def build_groceries(data_root: Path | None, cache_dir: Path) -> LabelledImages:
    """3,232 grocery photos of 81 products (see the module docstring)."""
    return read(GROCERIES, data_root)
