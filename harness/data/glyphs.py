"""glyphs: the embedded default dataset, Unicode characters rendered from matplotlib's own fonts.

A class is one Unicode code point; its images are that character drawn by different font files,
each with a seeded random augmentation. The coarse label is the character's Unicode block.
Nothing is downloaded: the pixels come only from the TrueType files inside the installed
matplotlib wheel (`matplotlib/mpl-data/fonts/ttf/`), rasterised by matplotlib's own FreeType
binding (`matplotlib.ft2font`, which bundles its own FreeType), then transformed with Pillow
and numpy. The same versions give the same pixels on any machine, independent of system fonts.

The fonts kept and the code points eligible as classes: harness.data.glyph_fonts.

Each image: the glyph is rasterised at a fixed em size (80% of the canvas; shrunk only when its
ink would not fit 75% of the canvas, so a full stop stays smaller than a capital), centred by its
ink bounding box on a canvas twice the output size, then a seeded affine (rotation +-12 degrees,
scale 0.75-1.05, shift up to 7% of the canvas, never pushing ink off the canvas), with probability
0.2 each a 3x3 dilation or erosion (thicker or thinner strokes; an erosion that would remove
more than half the ink is skipped), then a 2x2 box reduction to the
output size. uint8, white glyph (255) on black, shape [N, 1, S, S]. The augmentation generator is
seeded from (seed, code point, image index), so no image depends on the order of processing.

Results are cached as `cache_dir/glyphs-<hash>.npz` (hash of every parameter, the matplotlib,
numpy and Pillow versions, Python's Unicode version, the font files' sha256 and GLYPHS_VERSION),
and the eligible list as `cache_dir/glyphs-eligible-<hash>.json`; `data_root` is ignored.
"""

from __future__ import annotations

import logging
import math
import time
import unicodedata
from pathlib import Path

import numpy as np
import torch

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.glyph_fonts import (
    FONT_FILES,
    atomic_write,
    digest,
    eligible_code_points,
    font_paths,
    font_sha256,
    open_fonts,
    render_crop,
    versions,
)
from harness.data.unicode_blocks import block_of, block_start

log = logging.getLogger(__name__)

SUPERSAMPLE = 2  # render and transform at this multiple of image_size, then box-reduce

MAX_ROTATION_DEG = 12.0
SCALE_RANGE = (0.75, 1.05)
MAX_SHIFT_FRACTION = 0.07  # of the output image size
P_DILATE = 0.2
P_ERODE = 0.2

# Domain tags for the seed sequences, so class choice and augmentation draw unrelated streams.
_SELECT_TAG = 1
_AUGMENT_TAG = 2


# ----------------------------------------------------------------------------- rendering


def choose_classes(eligible: list[int], num_classes: int, seed: int) -> list[int]:
    """A seeded, machine-independent choice of `num_classes` code points, sorted."""
    rng = np.random.default_rng([seed, _SELECT_TAG])
    order = rng.permutation(len(eligible))[:num_classes]
    return sorted(eligible[i] for i in order)


def augment(crop: np.ndarray, image_size: int, rng: np.random.Generator) -> np.ndarray:
    """Centre `crop` on a supersampled canvas, apply a random affine and stroke change, reduce."""
    from PIL import Image, ImageFilter

    canvas = image_size * SUPERSAMPLE
    # Draw every random number up front, in a fixed order.
    angle = math.radians(rng.uniform(-MAX_ROTATION_DEG, MAX_ROTATION_DEG))
    scale = rng.uniform(*SCALE_RANGE)
    shift = rng.uniform(-1.0, 1.0, size=2) * MAX_SHIFT_FRACTION * canvas
    stroke = rng.random()

    h, w = crop.shape
    cos, sin = math.cos(angle), math.sin(angle)
    half_w = abs(cos) * w / 2 + abs(sin) * h / 2  # half extents of the rotated ink box
    half_h = abs(sin) * w / 2 + abs(cos) * h / 2
    limit = canvas / 2 - SUPERSAMPLE  # keep one output pixel of margin
    scale = min(scale, limit / max(half_w, half_h))
    dx = float(
        np.clip(shift[0], -max(0.0, limit - scale * half_w), max(0.0, limit - scale * half_w))
    )
    dy = float(
        np.clip(shift[1], -max(0.0, limit - scale * half_h), max(0.0, limit - scale * half_h))
    )
    # Inverse map, output (x, y) -> input: in = c_in + R(-angle) (out - c_out) / scale.
    cx, cy = canvas / 2 + dx, canvas / 2 + dy
    a, b = cos / scale, sin / scale
    d, e = -sin / scale, cos / scale
    coeffs = (a, b, w / 2 - a * cx - b * cy, d, e, h / 2 - d * cx - e * cy)
    img = Image.fromarray(crop).transform(
        (canvas, canvas),
        Image.Transform.AFFINE,
        coeffs,
        resample=Image.Resampling.BILINEAR,
        fillcolor=0,
    )
    if stroke < P_DILATE:
        img = img.filter(ImageFilter.MaxFilter(3))
    elif stroke < P_DILATE + P_ERODE:
        thinner = img.filter(ImageFilter.MinFilter(3))
        # Thin only strokes that survive it: keep at least half the ink (hairlines would vanish).
        ink = np.asarray(img, dtype=np.int64).sum()
        if np.asarray(thinner, dtype=np.int64).sum() * 2 >= ink:
            img = thinner
    return np.asarray(img.reduce(SUPERSAMPLE), dtype=np.uint8)


def class_name(code_point: int) -> str:
    name = unicodedata.name(chr(code_point), "") or chr(code_point)
    return f"U+{code_point:05X} {name}"


def render_classes(
    classes: list[int],
    fonts_of: dict[int, list[int]],
    images_per_class: int,
    image_size: int,
    seed: int,
) -> np.ndarray:
    """uint8 [len(classes) * images_per_class, 1, S, S]; image i of a class uses font i mod n."""
    fonts = open_fonts(font_paths())
    canvas = image_size * SUPERSAMPLE
    out = np.zeros((len(classes) * images_per_class, 1, image_size, image_size), np.uint8)
    crops: dict[int, np.ndarray] = {}
    step = max(1, len(classes) // 10)
    for k, cp in enumerate(classes):
        crops.clear()
        fis = fonts_of[cp]
        for i in range(images_per_class):
            fi = fis[i % len(fis)]
            if fi not in crops:
                crops[fi] = render_crop(fonts[fi], cp, canvas)
            crop = crops[fi]
            if crop.size == 0:  # cannot happen for an eligible code point
                raise RuntimeError(f"glyphs: {class_name(cp)} is empty in {FONT_FILES[fi]}")
            rng = np.random.default_rng([seed, _AUGMENT_TAG, cp, i])
            out[k * images_per_class + i, 0] = augment(crop, image_size, rng)
        if (k + 1) % step == 0 or k + 1 == len(classes):
            log.info("glyphs: rendered %d/%d classes", k + 1, len(classes))
    return out


# ----------------------------------------------------------------------------- builder


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise HarnessError(f"glyphs: {name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise HarnessError(f"glyphs: {name} must be {bound}, got {value}")
    return int(value)


def _load_cache(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, EOFError) as e:
        log.warning("glyphs: ignoring unreadable cache %s (%s); rebuilding", path, e)
        return None


def _render_arrays(
    path: Path,
    cache_dir: Path,
    num_classes: int,
    images_per_class: int,
    image_size: int,
    min_fonts: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """Render the chosen classes and write them to the cache file `path`."""
    start = time.perf_counter()
    fonts_of = eligible_code_points(min_fonts, cache_dir)
    if num_classes > len(fonts_of):
        raise HarnessError(
            f"glyphs: num_classes={num_classes} but only {len(fonts_of)} code points are "
            f"drawn by >= {min_fonts} fonts; lower num_classes (or min_fonts)"
        )
    classes = choose_classes(sorted(fonts_of), num_classes, seed)
    log.info(
        "glyphs: rendering %d classes x %d images at %d px",
        num_classes,
        images_per_class,
        image_size,
    )
    images = render_classes(classes, fonts_of, images_per_class, image_size, seed)
    blocks = [block_of(cp) for cp in classes]
    if None in blocks:
        missing = [class_name(cp) for cp, b in zip(classes, blocks, strict=True) if b is None]
        raise RuntimeError(f"glyphs: no Unicode block for {missing[:3]}; extend BLOCKS")
    coarse_names = sorted(set(blocks), key=block_start)
    arrays = {
        "images": images,
        "code_points": np.asarray(classes, np.int64),
        "class_names": np.asarray([class_name(cp) for cp in classes]),
        "coarse_names": np.asarray(coarse_names),
        "class_coarse": np.asarray([coarse_names.index(b) for b in blocks], np.int64),
    }
    atomic_write(path, lambda f: np.savez_compressed(f, **arrays))
    log.info("glyphs: built %s in %.1f s", path, time.perf_counter() - start)
    return arrays


@register_dataset("glyphs")
def build(
    data_root: Path | None,
    cache_dir: Path,
    *,
    num_classes: int = 300,
    images_per_class: int = 16,
    image_size: int = 32,
    min_fonts: int = 8,
    seed: int = 0,
) -> LabelledImages:
    """Unicode characters from matplotlib's fonts; see the module docstring. data_root is unused."""
    del data_root  # generated, nothing to read
    num_classes = _check_int("num_classes", num_classes, 2)
    images_per_class = _check_int("images_per_class", images_per_class, 1)
    image_size = _check_int("image_size", image_size, 8, 512)
    min_fonts = _check_int("min_fonts", min_fonts, 1, len(FONT_FILES))
    seed = _check_int("seed", seed, 0)
    import matplotlib

    paths = font_paths()
    cache_dir = Path(cache_dir)
    params = {
        "num_classes": num_classes,
        "images_per_class": images_per_class,
        "image_size": image_size,
        "min_fonts": min_fonts,
        "seed": seed,
    }
    key = digest({**params, "fonts": {p.name: font_sha256(p) for p in paths}, **versions()})
    path = cache_dir / f"glyphs-{key}.npz"
    arrays = _load_cache(path) if path.is_file() else None
    if arrays is not None:
        log.info("glyphs: loaded %s", path)
    else:
        arrays = _render_arrays(path, cache_dir, num_classes, images_per_class, image_size,
                                min_fonts, seed)  # fmt: skip

    images = arrays["images"]
    n_classes = len(arrays["code_points"])
    per_class = images.shape[0] // n_classes
    labels = np.repeat(np.arange(n_classes, dtype=np.int64), per_class)
    class_names = [str(s) for s in arrays["class_names"]]
    return LabelledImages(
        images=torch.from_numpy(np.ascontiguousarray(images)),
        labels=labels,
        class_names=class_names,
        coarse_labels=arrays["class_coarse"][labels],
        coarse_names=[str(s) for s in arrays["coarse_names"]],
        source=(
            f"matplotlib {matplotlib.__version__} fonts: {', '.join(FONT_FILES)}, "
            f"{n_classes} classes, cache {path}"
        ),
    )
