"""The fonts the glyphs dataset (harness.data.glyphs) draws from, and which code points they
draw: the TrueType files inside the installed matplotlib wheel, rasterised by matplotlib's own
FreeType binding, so that the same versions give the same pixels on any machine.

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

The eligible set is cached as `cache_dir/glyphs-eligible-<hash>.json`.
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
from typing import Any

import numpy as np

from harness.core import HarnessError

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

EM_FRACTION = 0.80  # em size relative to the canvas
FIT_FRACTION = 0.75  # largest ink extent relative to the canvas before the glyph is shrunk
ANALYSIS_CANVAS = 64  # canvas (pixels) for the eligibility scan, independent of image_size


def font_dir() -> Path:
    """The TrueType folder inside the installed matplotlib wheel."""
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


def font_sha256(path: Path) -> str:
    """A font file's sha256: part of every cache key."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def open_fonts(paths: list[Path]) -> list:
    """The font files as matplotlib FT2Font objects."""
    from matplotlib.ft2font import FT2Font

    return [FT2Font(str(p)) for p in paths]


def load_flags() -> Any:  # matplotlib's LoadFlags, or its int on matplotlib < 3.10
    """FreeType's no-hinting load flag, as this matplotlib takes it."""
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
    flags = load_flags()
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
    fonts = open_fonts(paths)
    flags = load_flags()
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


def versions() -> dict[str, str]:
    """The versions that decide the pixels: part of every cache key."""
    import matplotlib
    import PIL

    return {
        "glyphs": str(GLYPHS_VERSION),
        "matplotlib": matplotlib.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "unicode": unicodedata.unidata_version,
    }


def digest(payload: dict) -> str:
    """A cache key: 16 hex digits of the sha256 of the payload's canonical JSON."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def atomic_write(path: Path, write) -> None:
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
    key = digest(
        {
            "min_fonts": min_fonts,
            "fonts": {p.name: font_sha256(p) for p in paths},
            **versions(),
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
        atomic_write(path, lambda f: f.write(text.encode()))
    return eligible
