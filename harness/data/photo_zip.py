"""Real-photo miniatures shipped as one zip of class folders: `cars196_mini` (2,940 Stanford
Cars crops, 196 models, 15 each) and `grocery_store_mini` (3,232 grocery photos, 81 products;
Klasson et al., WACV 2019, MIT licence).

Each reads `<name>.zip`, any zip of the same files, or the extracted `<name>/` folder from
--data-root, by default `../shared/data/<name>` beside this clone, then the user data folder
where `python -m harness data fetch <name>` builds it; every file is checked against the
shipped manifest (harness.data.photo_sets). Every photo is decoded once into memory at SIZE x SIZE (PIL
bilinear, antialiased; the aspect ratio is not kept, like the seed papers' 256 x 256 resize
and the harness's own image decoder). The archive holds `<name>/images/<class>/<file>.jpg`
(and its builder's labels table, which is not read). The protocol's sorted split trains on the first half of the sorted
class names and tests on the second: for cars196_mini exactly the standard Cars196 split
(official ids 1-98 train, 99-196 test).

Coarse labels, for Karaman et al.'s quadruplet selection: the car's body type from its class
name (harness.data.cars196.body_type, as `quadruplet_cars196` uses), and the grocery
product's coarse class (Apple, Milk, Juice, ...), the folder above its class folder in the
source (the shipped manifest's `source_path`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.cars196 import body_type
from harness.data.photo_decode import open_photo
from harness.data.photo_sets import describe, manifest
from harness.data.rebuild import open_data

SIZE = 227  # the birds' size: a 224 crop with a little room


@dataclass(frozen=True)
class PhotoZip:
    """One miniature: its name (harness.data.photo_sets.SETS) and how its coarse labels are
    read."""

    name: str
    coarse: Callable[[str], str] | None  # class name -> its coarse class; None: no second level


@cache
def _grocery_coarse() -> dict[str, str]:
    """Each grocery product's coarse class, from its source paths
    (`dataset/<split>/<kind>/<coarse>/<class>/<photo>`); a product the source keeps directly
    under its kind (`dataset/<split>/<kind>/<class>/<photo>` in every split) is its own."""
    out: dict[str, str] = {}
    for row in manifest("grocery_store_mini").rows:
        parts = row.source_path.split("/")
        if row.file.endswith(".jpg"):
            cls = row.file.split("/")[-2]
            out[cls] = parts[3] if len(parts) == 6 else out.get(cls, cls)
    return out


CARS = PhotoZip("cars196_mini", body_type)
GROCERIES = PhotoZip("grocery_store_mini", lambda cls: _grocery_coarse().get(cls, ""))
# the plankton's coarse class: the first word of its class name (`chaetognath`, `copepod`,
# `hydromedusae`, `siphonophore`, ...: the taxonomic group the Data Science Bowl named first)
PLANKTON = PhotoZip("plankton", lambda cls: cls.split("_", 1)[0])
# the pollen's coarse class: its genus, the first word of its type (`mimosa`, `myrcia`, ...)
POLLEN = PhotoZip("pollen", lambda cls: cls.replace(" ", "_").split("_", 1)[0].lower())
# Caltech-101 and Flowers-102 name no second level: no coarse labels, so a method that needs
# them (quadruplet selection) is recorded as not applicable at once, as on any such dataset
CALTECH = PhotoZip("caltech101", None)
FLOWERS = PhotoZip("flowers", None)


def _decode(data: bytes, where: str, size: int) -> np.ndarray:
    from PIL import Image

    rgb = open_photo(data, where).resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def _coarse(
    spec: PhotoZip, class_names: list[str], labels: np.ndarray
) -> tuple[np.ndarray | None, list[str] | None]:
    """Each photo's coarse id and the coarse names (None, None for a set with no second level)."""
    if spec.coarse is None:
        return None, None
    kinds = [spec.coarse(c) for c in class_names]
    if not all(kinds):
        missing = [c for c, k in zip(class_names, kinds, strict=False) if not k][:3]
        raise HarnessError(f"{spec.name}: no coarse class for {missing}")
    coarse_names = sorted(set(kinds))
    coarse_of = np.array([coarse_names.index(k) for k in kinds], dtype=np.int64)
    return coarse_of[labels], coarse_names


def read(spec: PhotoZip, data_root: Path | None, size: int = SIZE) -> LabelledImages:
    """Every photo of the archive, labelled by its class folder (see the module docstring)."""
    prefix = f"{spec.name}/images/"
    with open_data(spec.name, data_root) as archive:
        path = archive.path
        members = sorted(m for m in archive.names()
                         if m.startswith(prefix) and not m.endswith("/"))  # fmt: skip
        class_names = sorted({m[len(prefix) :].split("/", 1)[0] for m in members})
        images = np.empty((len(members), 3, size, size), dtype=np.uint8)
        for row, member in enumerate(members):
            images[row] = _decode(archive.read(member), f"{path}:{member}", size)
    order = {c: n for n, c in enumerate(class_names)}
    labels = np.array([order[m[len(prefix) :].split("/", 1)[0]] for m in members], np.int64)
    coarse_labels, coarse_names = _coarse(spec, class_names, labels)
    return LabelledImages(
        images=torch.from_numpy(images),
        labels=labels,
        class_names=class_names,
        coarse_labels=coarse_labels,
        coarse_names=coarse_names,
        files=tuple(members),  # inside the archive
        source=f"{spec.name} from {path} ({len(class_names)} classes, {len(members)} photos, "
        f"{size} px)" + describe(archive),
        provenance=None if archive.provenance.get("exact", True) else archive.provenance,
    )


@register_dataset("cars196_mini")  # --data-root is optional: photo_sets.open_data
def build_cars(data_root: Path | None, cache_dir: Path) -> LabelledImages:
    """2,940 Stanford Cars crops of all 196 models (see the module docstring)."""
    return read(CARS, data_root)


@register_dataset("grocery_store_mini")  # --data-root is optional
def build_groceries(data_root: Path | None, cache_dir: Path) -> LabelledImages:
    """3,232 grocery photos of 81 products (see the module docstring)."""
    return read(GROCERIES, data_root)


def _builder(spec: PhotoZip, about: str):
    """A registered builder that reads `spec`; `about` is its docstring (`harness ls`)."""

    def build(data_root: Path | None, cache_dir: Path) -> LabelledImages:
        return read(spec, data_root)

    build.__doc__ = about
    return build


# the sets made from class folders (harness.data.sources); --data-root is optional
for _spec, _about in (
    (PLANKTON, "4,197 greyscale plankton images of 109 classes (NOAA PlanktonSet 1.0)."),
    (POLLEN, "2,513 pollen-grain microscope images of 72 types (POLLEN73S)."),
    (CALTECH, "3,929 photos of 100 Caltech-101 categories, at most 40 a category."),
    (FLOWERS, "4,080 Oxford Flowers-102 photos at 64 x 64 px, 40 of each of 102 species."),
):
    register_dataset(_spec.name)(_builder(_spec, _about))
