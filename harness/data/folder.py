"""folder: your own images, one directory per class (torchvision's ImageFolder layout).

`<data-root>/<class>/<image>`: the fine label is the class folder's name, and the protocol's
class-disjoint split applies (`split: {train_fraction: ...}`). With exactly two folders
`<data-root>/train/<class>/...` and `<data-root>/test/<class>/...` the split is yours instead:
the protocol must say `split: {official: true}` (anything else is a one-line error saying so),
a class in both parts is an error naming it, and `validation_fraction` still carves the last
sorted training classes. Images are found by extension (case-insensitive; nested folders
inside a class folder count too) and decoded from disk batch by batch, at the protocol's load
size, like the paper datasets. Hidden files and folders (starting with ".") are skipped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.own import OwnListing, check_disjoint, index_labels, require_root

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
FIXED = ("train", "test")


def _extensions(extensions: object) -> tuple[str, ...]:
    if isinstance(extensions, str):
        extensions = [extensions]
    if not isinstance(extensions, (list, tuple)) or not extensions:
        raise HarnessError("folder: extensions must be a non-empty list such as [.jpg, .png]")
    return tuple("." + str(e).lower().lstrip(".") for e in extensions)


def _subfolders(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _class_images(folder: Path, extensions: tuple[str, ...]) -> dict[str, list[str]]:
    """Each class folder under `folder` with its image files (sorted); an empty one is an error."""
    out = {}
    for cls in _subfolders(folder):
        files = sorted(str(p) for p in cls.rglob("*") if p.suffix.lower() in extensions
                       and p.is_file() and not p.name.startswith("."))  # fmt: skip
        if not files:
            raise HarnessError(
                f"folder: class folder {cls} holds no images ({', '.join(extensions)}); add "
                "images or remove the folder"
            )
        out[cls.name] = files
    return out


def listing(data_root: Path | None, extensions: object = EXTENSIONS) -> OwnListing:
    """The images under data_root, by class folder, with the fixed split when there is one."""
    root = require_root("folder", data_root)
    exts = _extensions(extensions)
    top = [p.name for p in _subfolders(root)]
    fixed = set(FIXED) <= set(top)
    if fixed and len(top) > 2:
        raise HarnessError(f"folder: {root} holds train/ and test/ beside other folders; put every "
                           "class folder inside train/ or test/, or drop train/ and test/")  # fmt: skip
    parts = {part: _class_images(root / part, exts) for part in FIXED} if fixed else {
        "": _class_images(root, exts)}  # fmt: skip
    files, names, partition = [], [], []
    for part, classes in parts.items():
        for name, paths in classes.items():
            files += paths
            names += [name] * len(paths)
            partition += [part] * len(paths)
    n_classes = len(set(names))
    if n_classes < 4:
        raise HarnessError(
            f"folder: {root} holds {n_classes} class folder{'s' if n_classes != 1 else ''}"
            f"{' (' + ', '.join(sorted(set(names))) + ')' if names else ''}; metric learning "
            "needs at least 4 (2 to train, 2 to test): one folder of images per class"
        )
    labels, class_names = index_labels(names, pad_numbers=False)  # names as on disk
    part_array = np.asarray(partition) if fixed else None
    if part_array is not None:
        check_disjoint("folder", labels, class_names, part_array, f"under {root}")
    return OwnListing("folder", f"from {root}", files, labels, class_names, part_array,
                      root=root)  # fmt: skip


@register_dataset("folder", needs_data_root=True)
def build(
    data_root: Path | None, cache_dir: Path, *, extensions: list[str] | tuple[str, ...] = EXTENSIONS
) -> LabelledImages:
    """Your images, one folder per class under data_root (see the module docstring)."""
    return listing(data_root, extensions).to_images()
