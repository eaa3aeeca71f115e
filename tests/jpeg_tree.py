"""A generated CUB-200-2011 tree of realistic JPEGs, for the data pipeline's tests and its
benchmark: 500 x 375 photos-like images (smooth colour fields with texture, quality 90,
about the size of CUB's own files) in the official layout. Never committed: made in a
temporary folder by whoever needs it."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image


def cub_jpegs(root: Path, train_classes: int = 12, test_classes: int = 4, per_class: int = 25,
              size: tuple[int, int] = (500, 375), seed: int = 0,
              processes: int = 1) -> Path:  # fmt: skip
    """Write CUB_200_2011/ under root (classes 1.. train, 101.. test); returns root.

    processes > 1 draws the classes in that many processes, each class from its own random
    stream: the same layout and kind of image as processes=1, other pixels."""
    base = root / "CUB_200_2011"
    classes = [f"{c} {c:03d}.Bird_{c}" for c in range(1, 201)]
    ids = [*range(1, train_classes + 1), *range(101, 101 + test_classes)]
    rels = [[f"{c:03d}.Bird_{c}/Bird_{c}_{k}.jpg" for k in range(per_class)] for c in ids]
    if processes > 1:
        rngs = [np.random.default_rng([seed, c]) for c in ids]
        with ProcessPoolExecutor(processes) as pool:
            list(pool.map(_write_class, [base] * len(ids), rels, [size] * len(ids), rngs))
    else:
        rng = np.random.default_rng(seed)
        for r in rels:
            _write_class(base, r, size, rng)
    images, labels, boxes = [], [], []
    for c, r in zip(ids, rels, strict=True):
        for rel in r:
            n = len(images) + 1
            images.append(f"{n} {rel}")
            labels.append(f"{n} {c}")
            boxes.append(f"{n} 50.0 40.0 300.0 250.0")
    for name, lines in (("images", images), ("image_class_labels", labels),
                        ("classes", classes), ("bounding_boxes", boxes)):  # fmt: skip
        (base / f"{name}.txt").write_text("\n".join(lines) + "\n")
    (base / "train_test_split.txt").write_text(
        "".join(f"{i} 1\n" for i in range(1, len(images) + 1))
    )
    return root


def _write_class(base: Path, rels: list[str], size: tuple[int, int], rng) -> None:
    for rel in rels:
        coarse = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC))
        texture = rng.normal(0, 14, field.shape)
        pixels = np.clip(field + texture, 0, 255).astype(np.uint8)
        (base / "images" / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(base / "images" / rel, quality=90)
