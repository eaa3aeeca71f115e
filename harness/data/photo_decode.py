"""A photo decoded as its owner sees it in a viewer: upright, in RGB, over white.

A camera or phone often stores a photo sideways and records how to turn it upright in the
EXIF orientation tag (6: rotate 90 degrees clockwise); every viewer applies it, so the
owner has only ever seen the upright photo, and an upright query must find it. The tag is
applied first (PIL's ImageOps.exif_transpose), then the pixels become the RGB a viewer
shows: 16-bit and 32-bit grey (I;16*, I) by their high byte (PIL's convert would clip them
to white), palette images through their palette, CMYK by PIL's conversion, and anything
with transparency (RGBA, LA, PA, a palette or grey image with a transparent colour)
composited on white, as a viewer's page shows it. `open_photo` is the one place a photo
is decoded; the kept model records the step (harness.deploy.model.preprocessing), so that
a service using an exported model can do the same.

An image over PIL's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS pixels, 89.5
million by default) is refused before its pixels are decoded, as a file that cannot be
decoded is: with a one-line HarnessError, which `index` reports and skips.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from harness.core import HarnessError

if TYPE_CHECKING:
    from PIL import Image

# open_photo refuses such images itself, in one line; PIL's warning (between the limit and
# twice it, where PIL raises) would add a two-line message of its own to the output.
warnings.filterwarnings("ignore", message=r"Image size \(\d+ pixels\) exceeds limit",
                        module=r"PIL\.Image")  # fmt: skip

ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
CORRUPT = "the file is not an image, or a corrupt or truncated one"
TOO_LARGE = "is too large to decode"  # in the error for an image over the limit


def open_photo(source: bytes | str | Path, where: str, *, advice: str = CORRUPT) -> Image.Image:
    """The photo in `source` (a file's bytes, or its path) fully decoded, upright and RGB, as
    a viewer shows it (see the module docstring). `where` names it in an error: a one-line
    HarnessError "cannot decode <where> (...); <advice>" for a file PIL cannot decode, and
    "<where> is too large ..." for one over PIL's decompression-bomb limit. A missing file
    raises FileNotFoundError, for the caller to say where the file should have come from."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as im:
            _refuse_a_bomb(im.width, im.height, where)
            im.load()  # raises on a truncated file (LOAD_TRUNCATED_IMAGES stays False)
            _upright(im)
            return _as_viewed(im)
    except (FileNotFoundError, HarnessError):
        raise
    except Image.DecompressionBombError:  # over twice the limit: PIL refuses it on opening
        raise HarnessError(f"{where} {TOO_LARGE}: over twice PIL's decompression-"
                           f"bomb limit of {Image.MAX_IMAGE_PIXELS:,} pixels "
                           "(PIL.Image.MAX_IMAGE_PIXELS)") from None  # fmt: skip
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, zlib.error, ...
        detail = (str(exc).splitlines() or [""])[0]
        raise HarnessError(f"cannot decode {where} ({type(exc).__name__}: {detail}); "
                           f"{advice}") from None  # fmt: skip


def _refuse_a_bomb(width: int, height: int, where: str) -> None:
    """A HarnessError if width x height is over PIL's decompression-bomb limit."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        raise HarnessError(f"{where} {TOO_LARGE}: {width} x {height} = "
                           f"{width * height:,} pixels, over PIL's decompression-bomb limit "
                           f"of {limit:,} (PIL.Image.MAX_IMAGE_PIXELS)")  # fmt: skip


def _upright(im: Image.Image) -> None:
    """Turn `im` (loaded) upright in place as its EXIF orientation tag says. A tag that
    cannot be read is no tag: a viewer shows such a photo as it is stored."""
    from PIL import ImageOps

    try:
        orientation = im.getexif().get(0x0112, 1)  # ExifTags.Base.Orientation
    except Exception:  # a malformed EXIF block
        return
    if orientation in range(2, 9):
        ImageOps.exif_transpose(im, in_place=True)


def _as_viewed(im: Image.Image) -> Image.Image:
    """`im` (loaded) in RGB as a viewer shows it: 16-bit by its high byte, transparency
    composited on white, every other mode (L, 1, P, CMYK, YCbCr) by PIL's convert."""
    from PIL import Image

    if im.mode == "RGB" and "transparency" not in im.info:
        return im
    if im.mode == "I" or im.mode.startswith("I;16"):
        high = np.clip(np.asarray(im, dtype=np.int64), 0, 65535) >> 8
        return Image.fromarray(high.astype(np.uint8)).convert("RGB")
    if im.mode in ALPHA_MODES or "transparency" in im.info:
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, im.convert("RGBA")).convert("RGB")
    return im.convert("RGB")
