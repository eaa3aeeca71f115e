"""glyphs: the embedded default dataset, Unicode characters rendered from matplotlib's own fonts.

A class is one Unicode code point; its images are that character drawn by different font files,
each with a seeded random augmentation. The coarse label is the character's Unicode block.
Nothing is downloaded: the pixels come only from the TrueType files inside the installed
matplotlib wheel (`matplotlib/mpl-data/fonts/ttf/`), rasterised by matplotlib's own FreeType
binding (`matplotlib.ft2font`, which bundles its own FreeType), then transformed with Pillow
and numpy. The same versions give the same pixels on any machine, independent of system fonts.

Fonts kept (16 text faces, all with a correct Unicode charmap: every glyph named uniXXXX sits at
code point XXXX, the others carry the standard Adobe glyph name of their code point):
    DejaVuSans, DejaVuSans-Bold, DejaVuSans-Oblique, DejaVuSans-BoldOblique,
    DejaVuSansMono (4 styles), DejaVuSerif (4 styles),
    STIXGeneral, STIXGeneralBol, STIXGeneralItalic, STIXGeneralBolIta.
Fonts excluded, and why:
    cm*.ttf (cmr10, cmb10, cmss10, cmti10, cmtt10, cmmi10, cmsy10, cmex10): TeX encodings behind
        a fake Unicode charmap. cmr10 puts Gamma at U+00A1 and a right double quote at U+0022,
        cmmi10 puts omega at U+0021 ("!"), cmsy10 and cmex10 remap nearly every code point to
        arrows, delimiters and big operators: their labels would be wrong.
    LastResortHE-Regular.ttf: maps all 1,114,112 code points to 372 placeholder glyphs, one per
        block ("A" and "z" both draw the generic Latin box): the label would not be the glyph.
    STIXNonUni*.ttf: unencoded alternates, all in the Private Use Area (only space and
        no-break space elsewhere): no Unicode character to label them with.
    STIXSiz*Sym*.ttf and DejaVu{Sans,Serif}Display.ttf: display-size variants of delimiters,
        radicals and big operators (and extensible pieces) that matplotlib's mathtext picks by
        size; not typefaces of their own, and they would only duplicate a few dozen classes.

Eligible code points: drawn with a non-empty bitmap by at least `min_fonts` kept fonts, not in a
Z* (separator), C* (control, format, private use, unassigned) or M* (combining mark, drawn off
centre) category. Then exact homoglyphs are merged: two code points whose centred renders are
pixel-identical in at least half of the fonts they share (Latin "o" and Cyrillic "о", "A" and
Greek Alpha, Braille patterns that differ only in where the same dots sit) would be classes no
model could tell apart, so only the lowest code point of each such group is kept. With
min_fonts=8 that leaves about 3,000 code points (3,204 before the merge).

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

import hashlib
import json
import logging
import math
import os
import tempfile
import time
import unicodedata
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from harness.core import HarnessError
from harness.data.base import LabelledImages, register_dataset
from harness.data.unicode_blocks import block_of, block_start

log = logging.getLogger(__name__)

# Bump when anything that changes the pixels, the eligible set or the class choice changes.
GLYPHS_VERSION = 2

FONT_FILES: tuple[str, ...] = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
)

EXCLUDED_CATEGORIES = ("Z", "C", "M")  # first letter of unicodedata.category

SUPERSAMPLE = 2  # render and transform at this multiple of image_size, then box-reduce
EM_FRACTION = 0.80  # em size relative to the canvas
FIT_FRACTION = 0.75  # largest ink extent relative to the canvas before the glyph is shrunk
ANALYSIS_CANVAS = 64  # canvas (pixels) for the eligibility scan, independent of image_size

MAX_ROTATION_DEG = 12.0
SCALE_RANGE = (0.75, 1.05)
MAX_SHIFT_FRACTION = 0.07  # of the output image size
P_DILATE = 0.2
P_ERODE = 0.2

# Domain tags for the seed sequences, so class choice and augmentation draw unrelated streams.
_SELECT_TAG = 1
_AUGMENT_TAG = 2


# ----------------------------------------------------------------------------- fonts


def font_dir() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def font_paths() -> list[Path]:
    """The kept font files, in FONT_FILES order; a HarnessError if the wheel lacks one."""
    directory = font_dir()
    missing = [name for name in FONT_FILES if not (directory / name).is_file()]
    if missing:
        import matplotlib

        raise HarnessError(
            f"glyphs: matplotlib {matplotlib.__version__} lacks font files {', '.join(missing)} "
            f"in {directory}; reinstall the pinned matplotlib wheel"
        )
    return [directory / name for name in FONT_FILES]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _open_fonts(paths: list[Path]) -> list:
    from matplotlib.ft2font import FT2Font

    return [FT2Font(str(p)) for p in paths]


def _load_flags():
    try:
        from matplotlib.ft2font import LoadFlags
    except ImportError:  # matplotlib < 3.10 takes the plain FreeType constant
        return 0x2  # FT_LOAD_NO_HINTING
    return LoadFlags.NO_HINTING


def render_crop(font, code_point: int, canvas: int) -> np.ndarray:
    """Rasterise one glyph for a `canvas`-pixel square: the tight uint8 crop of its ink.

    The em size is EM_FRACTION * canvas, reduced so the larger ink side is at most
    FIT_FRACTION * canvas. Returns an empty (0, 0) array when the glyph has no ink.
    """
    flags = _load_flags()
    em = EM_FRACTION * canvas
    font.set_size(em, 72)  # 72 dpi: one point is one pixel
    glyph = font.load_char(code_point, flags=flags)
    extent = max(glyph.width, glyph.height) / 64.0  # 26.6 fixed point
    limit = FIT_FRACTION * canvas
    if extent > limit:
        font.set_size(em * limit / extent, 72)
        glyph = font.load_char(code_point, flags=flags)
    if glyph.width <= 0 or glyph.height <= 0:
        return np.zeros((0, 0), np.uint8)
    xmin, _, xmax, _ = glyph.bbox
    left = math.ceil(-min(0, xmin) / 64.0)
    height = math.ceil(glyph.height / 64.0) + 4
    width = math.ceil((max(xmax, 0) - min(xmin, 0)) / 64.0) + 6
    buf = np.zeros((height, width), np.uint8)
    # y is the top of the ink, x the pen origin (ink starts at x + floor(xmin)).
    font.draw_glyph_to_bitmap(buf, 2 + left, 1, glyph, antialiased=True)
    rows = np.flatnonzero(buf.any(axis=1))
    cols = np.flatnonzero(buf.any(axis=0))
    if rows.size == 0:
        return np.zeros((0, 0), np.uint8)
    return buf[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].copy()


# ----------------------------------------------------------------------------- eligible set


def _excluded(code_point: int) -> bool:
    return unicodedata.category(chr(code_point))[0] in EXCLUDED_CATEGORIES


def _merge_homoglyphs(renders: dict[tuple[int, int], bytes], cover: dict[int, list[int]]):
    """Union code points whose renders are identical in >= half of the fonts both have.

    Returns the kept code points (lowest of each group) and the number merged away.
    """
    same: dict[tuple[int, int], int] = defaultdict(int)
    by_font: dict[int, dict[bytes, list[int]]] = defaultdict(lambda: defaultdict(list))
    for (fi, cp), digest in renders.items():
        by_font[fi][digest].append(cp)
    for groups in by_font.values():
        for cps in groups.values():
            cps.sort()
            for i, a in enumerate(cps):
                for b in cps[i + 1 :]:
                    same[(a, b)] += 1
    parent = {cp: cp for cp in cover}

    def find(cp: int) -> int:
        while parent[cp] != cp:
            parent[cp] = parent[parent[cp]]
            cp = parent[cp]
        return cp

    for (a, b), n_same in sorted(same.items()):
        shared = len(set(cover[a]) & set(cover[b]))
        if 2 * n_same >= shared:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    kept = sorted(cp for cp in cover if find(cp) == cp)
    return kept, len(cover) - len(kept)


def _scan_eligible(paths: list[Path], min_fonts: int) -> dict[int, list[int]]:
    """Code point -> indices (into FONT_FILES) of the kept fonts that draw it, for eligible ones."""
    fonts = _open_fonts(paths)
    flags = _load_flags()
    cover: dict[int, list[int]] = defaultdict(list)
    for fi, font in enumerate(fonts):
        font.set_size(EM_FRACTION * ANALYSIS_CANVAS, 72)
        for cp in sorted(font.get_charmap()):
            if _excluded(cp):
                continue
            glyph = font.load_char(cp, flags=flags)
            if glyph.width > 0 and glyph.height > 0:
                cover[cp].append(fi)
    candidates = {cp: fis for cp, fis in cover.items() if len(fis) >= min_fonts}
    # Rasterise every candidate (font, code point) pair: drop empty bitmaps, hash the rest.
    renders: dict[tuple[int, int], bytes] = {}
    drawn: dict[int, list[int]] = defaultdict(list)
    for cp in sorted(candidates):
        for fi in candidates[cp]:
            crop = render_crop(fonts[fi], cp, ANALYSIS_CANVAS)
            if crop.size == 0:
                continue
            drawn[cp].append(fi)
            h = hashlib.blake2b(crop.tobytes(), digest_size=16)
            h.update(np.asarray(crop.shape, np.int64).tobytes())
            renders[(fi, cp)] = h.digest()
    drawn = {cp: fis for cp, fis in drawn.items() if len(fis) >= min_fonts}
    renders = {key: d for key, d in renders.items() if key[1] in drawn}
    kept, merged = _merge_homoglyphs(renders, drawn)
    log.info(
        "glyphs: %d code points drawn by >= %d fonts, %d merged as homoglyphs, %d eligible",
        len(drawn),
        min_fonts,
        merged,
        len(kept),
    )
    return {cp: drawn[cp] for cp in kept}


def _versions() -> dict[str, str]:
    import matplotlib
    import PIL

    return {
        "glyphs": str(GLYPHS_VERSION),
        "matplotlib": matplotlib.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "unicode": unicodedata.unidata_version,
    }


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _atomic_write(path: Path, write) -> None:
    """Write via a temporary file in the same directory, then os.replace (no torn files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def eligible_code_points(min_fonts: int = 8, cache_dir: Path | None = None) -> dict[int, list[int]]:
    """Eligible code point -> indices into FONT_FILES of the fonts drawing it (cached as JSON)."""
    paths = font_paths()
    key = _digest(
        {
            "min_fonts": min_fonts,
            "fonts": {p.name: _sha256(p) for p in paths},
            **_versions(),
        }
    )
    path = None if cache_dir is None else Path(cache_dir) / f"glyphs-eligible-{key}.json"
    if path is not None and path.is_file():
        try:
            raw = json.loads(path.read_text())
            return {int(cp): list(fis) for cp, fis in raw["eligible"]}
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("glyphs: ignoring unreadable cache %s (%s)", path, e)
    start = time.perf_counter()
    log.info("glyphs: scanning %d fonts for eligible code points", len(paths))
    eligible = _scan_eligible(paths, min_fonts)
    log.info("glyphs: scan took %.1f s", time.perf_counter() - start)
    if path is not None:
        text = json.dumps({"eligible": sorted(eligible.items())})
        _atomic_write(path, lambda f: f.write(text.encode()))
    return eligible


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
    fonts = _open_fonts(font_paths())
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
    _atomic_write(path, lambda f: np.savez_compressed(f, **arrays))
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
    key = _digest({**params, "fonts": {p.name: _sha256(p) for p in paths}, **_versions()})
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
