"""cub100: 5,902 photos of 100 bird species of CUB-200-2011, cropped to the bird, 227 x 227.

Reads `cub100.zip`, any zip of the same files, or the extracted `bird_dataset/` from
--data-root, by default `../shared/data/cub100` beside this clone, then the user data folder
where `python -m harness data fetch cub100` builds it; each file is checked against the
shipped manifest (harness.data.photo_sets). The data is `bird_dataset/` as the public GitHub
repository serizba/vision publishes it (path ex03/task2/bird_dataset): `images/<Species>/<NNNN>.jpg`
and CUB's index files, comma-separated and numbered from 0 (`classes.txt`, `images.txt`,
`image_class_labels.txt`). Its `train_test_split.txt` splits within classes (classification)
and is not used: class names carry CUB's class order as a zero-padded prefix
(`000.Black_footed_Albatross`), so the protocol's sorted split trains on the first 50
species and tests on the other 50, as the seed papers split the full CUB-200-2011.

Coarse label: the kind of bird, the last word of the species' common name ("Warbler",
"Woodpecker", "Grebe": 47 kinds, 29 among the training species), the two nightjars
(Chuck-will's-widow, Whip-poor-will) as "Nightjar". Karaman et al.'s quadruplet selection
needs such a second level, as its car type is for CARS196.

Every photo is decoded once into memory (uint8, 0.9 GB for all of them): all are 227 x 227.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.photo_decode import open_photo
from harness.data.photo_sets import DataFiles, describe
from harness.data.rebuild import open_data

FOLDER = "bird_dataset"
SIZE = 227
NIGHTJARS = ("Chuck_will_Widow", "Whip_poor_Will")  # whose last word names no kind of bird


def _index(archive: DataFiles, name: str) -> dict[int, str]:
    try:
        text = archive.read(f"{FOLDER}/{name}").decode("utf-8")
    except KeyError:
        raise HarnessError(f"cub100: {archive.path} has no {FOLDER}/{name}") from None
    rows = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            key, _, value = line.partition(",")
            try:
                rows[int(key)] = value.strip()
            except ValueError:
                raise HarnessError(f"cub100: {FOLDER}/{name}:{n}: bad line {line!r}") from None
    return rows


def _decode(data: bytes, where: str) -> np.ndarray:
    try:
        pixels = np.asarray(open_photo(data, where))
    except HarnessError as exc:
        raise HarnessError(f"cub100: {exc}") from None
    if pixels.shape != (SIZE, SIZE, 3):
        raise HarnessError(f"cub100: {where} is {pixels.shape[1]}x{pixels.shape[0]}, not {SIZE}")
    return pixels.transpose(2, 0, 1)


def _class_of(label_of: dict[int, str], image_id: int) -> int:
    """The class id of an image (-1 for none or a malformed one: refused below)."""
    try:
        return int(label_of.get(image_id, -1))
    except ValueError:
        return -1


def kind(species: str) -> str:
    """The coarse label of a species: the kind of bird its common name ends with."""
    return "Nightjar" if species in NIGHTJARS else species.split("_")[-1]


@register_dataset("cub100")  # --data-root is optional: harness.data.photo_sets.open_data
def build(data_root: Path | None, cache_dir: Path, classes: int = 100) -> LabelledImages:
    """The 100 species in CUB's class order (see the module docstring), or its first
    `classes` species (a small photo protocol: `harness check --protocol photo_regression`)."""
    if not 4 <= int(classes) <= 100:
        raise HarnessError(f"cub100: dataset.params.classes must be 4..100, got {classes}")
    with open_data("cub100", data_root) as archive:
        path = archive.path
        all_classes, files = _index(archive, "classes.txt"), _index(archive, "images.txt")
        label_of = _index(archive, "image_class_labels.txt")
        classes = {c: all_classes[c] for c in sorted(all_classes)[: int(classes)]}
        ids = sorted(i for i in files if _class_of(label_of, i) in classes)
        images = np.empty((len(ids), 3, SIZE, SIZE), dtype=np.uint8)
        for row, image_id in enumerate(ids):
            member = f"{FOLDER}/images/{files[image_id]}"
            try:
                data = archive.read(member)
            except KeyError:
                raise HarnessError(f"cub100: images.txt names {member}, which {path} "
                                   "does not hold") from None  # fmt: skip
            images[row] = _decode(data, f"{path}:{member}")
    order = {c: n for n, c in enumerate(sorted(classes))}
    try:
        labels = np.array([order[int(label_of[i])] for i in ids], dtype=np.int64)
    except (KeyError, ValueError):
        raise HarnessError("cub100: image_class_labels.txt names a class or image that "
                           "classes.txt or images.txt does not hold") from None  # fmt: skip
    names = [f"{c:03d}.{classes[c]}" for c in sorted(classes)]
    kinds = [kind(classes[c]) for c in sorted(classes)]
    coarse_names = sorted(set(kinds))
    coarse_of = np.array([coarse_names.index(k) for k in kinds], dtype=np.int64)
    return LabelledImages(
        images=torch.from_numpy(images),
        labels=labels,
        class_names=names,
        coarse_labels=coarse_of[labels],
        coarse_names=coarse_names,
        files=tuple(f"{FOLDER}/images/{files[i]}" for i in ids),  # inside the archive
        source=f"cub100 from {path} ({len(names)} species, {len(ids)} photos, cropped, {SIZE} px)"
        + describe(archive),
        provenance=None if archive.provenance.get("exact", True) else archive.provenance,
    )
