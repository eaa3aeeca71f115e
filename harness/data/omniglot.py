"""omniglot: handwritten characters from the official Omniglot archives (Lake et al., 2015).

Reads `images_background.zip`, `images_evaluation.zip`, `images_background_small1.zip` and
`images_background_small2.zip` from `data_root`, either as the zip files or as the folders of the
same names they extract to (`data_root/images_background_small1/...`); a zip wins when both exist.
Inside, images are `<archive>/<Alphabet>/<characterNN>/<imageid>_<drawer>.png`, 105x105 1-bit.

Fine label: "Alphabet/characterNN" (class_names sorted); coarse label: the alphabet. Strokes are
inverted to 255 on black (like glyphs) and resized to image_size with a box (area) filter.
images_background_small1/2 are subsets of images_background, so listing both kinds is an error.

With download=True a missing archive is fetched from the official repository
(OMNIGLOT_URL) into data_root, or into `cache_dir/omniglot` when no data_root is given.
The decoded, resized arrays are cached as `cache_dir/omniglot-<hash>.npz`, keyed by the archive
names, their files' sizes and modification times, and image_size. Each image's `files` entry is
its path inside the archive (`images_background_small1/Greek/character01/0394_01.png`; for an
extracted folder, the same path under it), what `run --save-embeddings` writes to paths.txt.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from harness.core import HarnessError, closest
from harness.data.base import LabelledImages, register_dataset

log = logging.getLogger(__name__)

OMNIGLOT_VERSION = 2  # 2: the cache holds each image's in-archive path
ARCHIVES = (
    "images_background",
    "images_evaluation",
    "images_background_small1",
    "images_background_small2",
)
OMNIGLOT_URL = "https://raw.githubusercontent.com/brendenlake/omniglot/master/python/{name}.zip"
DOWNLOAD_TIMEOUT_S = 60

_CHARACTER = re.compile(r"character\d+")


def _archive_names(archives) -> list[str]:
    if isinstance(archives, str):
        archives = [archives]
    if not isinstance(archives, (list, tuple)) or not archives:
        raise HarnessError(
            f"omniglot: archives must be a non-empty list of names from {', '.join(ARCHIVES)}"
        )
    names = []
    for raw in archives:
        name = str(raw).removesuffix(".zip")
        if name not in ARCHIVES:
            raise HarnessError(
                f"omniglot: unknown archive {raw!r}{closest(name, list(ARCHIVES))}; "
                f"known: {', '.join(ARCHIVES)}"
            )
        if name in names:
            raise HarnessError(f"omniglot: archive {name!r} is listed twice in archives")
        names.append(name)
    return names


def _find_archive(root: Path, name: str) -> Path | None:
    """The zip or extracted folder holding archive `name` under `root`, or None."""
    if (root / f"{name}.zip").is_file():
        return root / f"{name}.zip"
    if (root / name).is_dir():
        return root / name
    if root.name == name and root.is_dir():  # data_root is the extracted folder itself
        return root
    return None


def download_archive(root: Path, name: str) -> Path:
    """Fetch `name`.zip from the official repository into `root` (temp file, then rename)."""
    url = OMNIGLOT_URL.format(name=name)
    target = root / f"{name}.zip"
    root.mkdir(parents=True, exist_ok=True)
    log.info("omniglot: downloading %s to %s", url, target)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
        if not zipfile.is_zipfile(tmp):
            raise HarnessError(
                f"omniglot: {url} did not return a zip file; download it by hand into {root}"
            )
        os.replace(tmp, target)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        reason = getattr(e, "reason", None) or e
        raise HarnessError(
            f"omniglot: could not download {url} ({reason}); check the network, or download "
            f"{name}.zip by hand into {root}"
        ) from e
    finally:
        Path(tmp).unlink(missing_ok=True)
    log.info("omniglot: saved %s (%d bytes)", target, target.stat().st_size)
    return target


def _parse(rel: str) -> tuple[str, str] | None:
    """(alphabet, character) for an image path ending Alphabet/characterNN/file.png, else None."""
    parts = rel.split("/")
    if len(parts) < 3 or not parts[-1].lower().endswith(".png"):
        return None
    if parts[0] == "__MACOSX" or parts[-1].startswith("."):
        return None
    alphabet, character = parts[-3], parts[-2]
    if not _CHARACTER.fullmatch(character):
        return None
    return alphabet, character


def _entries(source: Path) -> Iterator[tuple[str, str, str, str, Callable[[], bytes]]]:
    """(alphabet, character, path shown in errors, path inside the archive, reader) for every
    image in a zip or folder (a folder is named as its archive: its paths are the zip's)."""
    if source.is_dir():
        for path in sorted(source.rglob("*.png")):
            rel = path.relative_to(source).as_posix()
            parsed = _parse(rel)
            if parsed:
                yield *parsed, str(path), f"{source.name}/{rel}", path.read_bytes
        return
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError) as e:
        raise HarnessError(
            f"omniglot: {source} is not a readable zip file ({e}); download it again"
        ) from e
    with archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            parsed = _parse(info.filename)
            if parsed:
                where = f"{source}:{info.filename}"
                yield *parsed, where, info.filename, lambda i=info: archive.read(i)


def _decode(data: bytes, where: str, image_size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            gray = np.asarray(im.convert("L"), dtype=np.uint8)
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, zlib.error, ...
        raise HarnessError(
            f"omniglot: cannot decode {where} ({type(e).__name__}: {e}); the archive is "
            "corrupt or truncated, download it again"
        ) from e
    inverted = Image.fromarray(255 - gray)  # strokes high on black
    return np.asarray(inverted.resize((image_size, image_size), Image.Resampling.BOX))


def _read_archive(source: Path, name: str, image_size: int):
    items = []
    for alphabet, character, where, file, read in _entries(source):
        try:
            data = read()
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise HarnessError(
                f"omniglot: cannot read {where} ({e}); the archive is corrupt, download it again"
            ) from e
        items.append((f"{alphabet}/{character}", where, _decode(data, where, image_size), file))
    if not items:
        raise HarnessError(
            f"omniglot: {source} holds no images laid out as {name}/<Alphabet>/<characterNN>/"
            "*.png; is it the official Omniglot archive?"
        )
    log.info("omniglot: read %d images from %s", len(items), source)
    return items


def _fingerprint(source: Path) -> list:
    """Sizes and modification times: the zip's, or every file's in an extracted folder."""
    if source.is_file():
        st = source.stat()
        return [str(source.resolve()), st.st_size, st.st_mtime_ns]
    files = []
    for path in sorted(source.rglob("*.png")):
        st = path.stat()
        files.append([path.relative_to(source).as_posix(), st.st_size, st.st_mtime_ns])
    return [str(source.resolve()), files]


def _atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@register_dataset("omniglot", needs_data_root=lambda params: not params.get("download", False))
def build(
    data_root: Path | None,
    cache_dir: Path,
    *,
    archives: tuple[str, ...] | list[str] = ("images_background_small1",),
    image_size: int = 32,
    download: bool = False,
) -> LabelledImages:
    """Omniglot from the official archives under data_root; see the module docstring."""
    names = _archive_names(archives)
    _check_options(image_size, download)
    cache_dir = Path(cache_dir)
    sources = _find_sources(data_root, cache_dir, names, download)

    key_payload = {
        "version": OMNIGLOT_VERSION,
        "image_size": image_size,
        "archives": {name: _fingerprint(src) for name, src in sources.items()},
    }
    key = hashlib.sha256(json.dumps(key_payload, sort_keys=True).encode()).hexdigest()[:16]
    cache_path = cache_dir / f"omniglot-{key}.npz"
    arrays = None
    if cache_path.is_file():
        try:
            with np.load(cache_path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            log.info("omniglot: loaded %s", cache_path)
        except (OSError, ValueError, EOFError) as e:
            log.warning("omniglot: ignoring unreadable cache %s (%s)", cache_path, e)
    if arrays is None:
        arrays = _build_arrays(sources, image_size)
        _atomic_savez(cache_path, arrays)

    class_names = [str(s) for s in arrays["class_names"]]
    coarse_names = [str(s) for s in arrays["coarse_names"]]
    labels = arrays["labels"].astype(np.int64)
    return LabelledImages(
        images=torch.from_numpy(np.ascontiguousarray(arrays["images"])),
        labels=labels,
        class_names=class_names,
        coarse_labels=arrays["class_coarse"].astype(np.int64)[labels],
        coarse_names=coarse_names,
        files=tuple(str(f) for f in arrays["files"]),
        source=(
            f"omniglot {', '.join(str(s) for s in sources.values())}: {len(class_names)} "
            f"characters, {len(coarse_names)} alphabets, {len(labels)} images at "
            f"{image_size}px, cache {cache_path}"
        ),
    )


def _check_options(image_size: object, download: object) -> None:
    if (
        isinstance(image_size, bool)
        or not isinstance(image_size, int)
        or not 8 <= image_size <= 512
    ):
        raise HarnessError(
            f"omniglot: image_size must be an integer from 8 to 512, got {image_size!r}"
        )
    if not isinstance(download, bool):
        raise HarnessError(f"omniglot: download must be true or false, got {download!r}")


def _find_sources(
    data_root: Path | None, cache_dir: Path, names: list[str], download: bool
) -> dict[str, Path]:
    """Each archive's zip or folder under data_root (downloaded into the cache when allowed)."""
    if data_root is None:
        if not download:
            raise HarnessError(
                f"omniglot needs --data-root DIR holding {names[0]}.zip (or set download: true "
                "to fetch it from the official repository)"
            )
        root = cache_dir / "omniglot"
    else:
        root = Path(data_root)
        if not root.is_dir():
            raise HarnessError(
                f"omniglot: --data-root {root} is not a directory; point it at the folder "
                f"holding {names[0]}.zip"
            )
    sources = {}
    for name in names:
        source = _find_archive(root, name)
        if source is None:
            if not download:
                raise HarnessError(
                    f"omniglot: {name}.zip not found in {root} (no {name}.zip and no {name}/ "
                    "folder); put the official archive there or set download: true"
                )
            source = download_archive(root, name)
        sources[name] = source
    return sources


def _build_arrays(sources: dict[str, Path], image_size: int) -> dict[str, np.ndarray]:
    start = time.perf_counter()
    items = []
    alphabet_home: dict[str, str] = {}
    for name, source in sources.items():
        archive_items = _read_archive(source, name, image_size)
        for cls, *_ in archive_items:
            alphabet = cls.split("/")[0]
            other = alphabet_home.setdefault(alphabet, name)
            if other != name:
                raise HarnessError(
                    f"omniglot: archives {other} and {name} both hold alphabet {alphabet} "
                    "(the small archives are subsets of images_background); list only one"
                )
        items.extend(archive_items)
    items.sort(key=lambda item: (item[0], item[1]))
    class_names = sorted({cls for cls, *_ in items})
    coarse_names = sorted({cls.split("/")[0] for cls in class_names})
    index = {cls: i for i, cls in enumerate(class_names)}
    alphabet_index = {a: i for i, a in enumerate(coarse_names)}
    images = np.stack([img for _, _, img, _ in items])[:, None]
    log.info(
        "omniglot: decoded %d images of %d characters in %.1f s",
        len(items),
        len(class_names),
        time.perf_counter() - start,
    )
    return {
        "images": images,
        "labels": np.asarray([index[cls] for cls, *_ in items], np.int64),
        "files": np.asarray([file for *_, file in items], dtype=str),
        "class_names": np.asarray(class_names),
        "coarse_names": np.asarray(coarse_names),
        "class_coarse": np.asarray(
            [alphabet_index[cls.split("/")[0]] for cls in class_names], np.int64
        ),
    }
