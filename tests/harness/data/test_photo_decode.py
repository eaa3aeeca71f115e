"""Photos decoded as their owners see them (harness.data.photo_decode): the EXIF orientation
tags 1-8 turn a real photo upright, exactly; CMYK, 16-bit, palette and alpha images become
the RGB a viewer shows (transparency over white); an image over PIL's decompression-bomb
limit and a file that is no image are one-line errors, and `index` reports both kinds."""

from __future__ import annotations

import base64
import io
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.core import HarnessError
from harness.data.lazy import decode, open_rgb
from harness.data.photo_decode import open_photo
from harness.deploy.images import report_failed
from harness.deploy.search_page import thumbnail

REPO = Path(__file__).resolve().parents[3]
CUB100 = REPO.parent / "shared" / "data" / "cub100" / "cub100.zip"
ORIENTATION = 0x0112


@pytest.fixture(scope="module")
def upright() -> np.ndarray:
    """A real bird photo's pixels, uint8 [H, W, 3], cropped to 96 x 64 (not square, so a
    wrong quarter turn changes the shape)."""
    if not CUB100.is_file():
        pytest.skip(f"cub100.zip not present at {CUB100}")
    with zipfile.ZipFile(CUB100) as archive:
        name = sorted(n for n in archive.namelist() if n.lower().endswith(".jpg"))[0]
        data = archive.read(name)
    with Image.open(io.BytesIO(data)) as im:
        photo = np.asarray(im.convert("RGB"))
    top, left = (photo.shape[0] - 64) // 2, (photo.shape[1] - 96) // 2
    return np.ascontiguousarray(photo[top : top + 64, left : left + 96])


def stored_as(upright: np.ndarray, tag: int) -> np.ndarray:
    """How a camera stores `upright` under orientation `tag`, from the EXIF definition (where
    the stored 0th row and 0th column are in the upright picture), not from PIL's table."""
    u = upright
    return {
        1: u,  # row 0 at the top, column 0 at the left
        2: u[:, ::-1],  # top, right
        3: u[::-1, ::-1],  # bottom, right
        4: u[::-1, :],  # bottom, left
        5: u.swapaxes(0, 1),  # left, top
        6: np.rot90(u, 1),  # right, top: a viewer turns it 90 degrees clockwise
        7: u[::-1, ::-1].swapaxes(0, 1),  # right, bottom
        8: np.rot90(u, -1),  # left, bottom
    }[tag]


def encoded(pixels: np.ndarray | Image.Image, fmt: str = "PNG", tag: int | None = None,
            **options: object) -> bytes:  # fmt: skip
    image = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels.copy())
    if tag is not None:
        exif = Image.Exif()
        exif[ORIENTATION] = tag
        options["exif"] = exif
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def rgb(source: bytes | Path) -> np.ndarray:
    return np.asarray(open_photo(source, "test photo"))


@pytest.mark.parametrize("tag", range(1, 9))
def test_each_orientation_tag_turns_a_real_photo_upright_exactly(upright, tag, tmp_path):
    data = encoded(stored_as(upright, tag), tag=tag)  # PNG's eXIf chunk: lossless
    assert Image.open(io.BytesIO(data)).getexif()[ORIENTATION] == tag
    np.testing.assert_array_equal(rgb(data), upright)
    (tmp_path / "p.png").write_bytes(data)  # from a path too, and through the dataset decoder
    np.testing.assert_array_equal(rgb(tmp_path / "p.png"), upright)
    np.testing.assert_array_equal(decode(tmp_path / "p.png", 0).transpose(1, 2, 0), upright)


def test_a_camera_jpeg_stored_sideways_decodes_upright(upright, tmp_path):
    """A JPEG with orientation 6 in its APP1 block, as a phone writes it: its stored pixels,
    turned 90 degrees clockwise, exactly; the thumbnail of `search --html` is upright too."""
    data = encoded(stored_as(upright, 6), "JPEG", tag=6, quality=95)
    with Image.open(io.BytesIO(data)) as im:
        stored = np.asarray(im.convert("RGB"))
    assert stored.shape == (96, 64, 3)
    np.testing.assert_array_equal(rgb(data), np.rot90(stored, -1))
    assert np.abs(rgb(data).astype(int) - upright).mean() < 4  # JPEG noise only
    (tmp_path / "sideways.jpg").write_bytes(data)
    uri = thumbnail(tmp_path / "sideways.jpg")
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as thumb:
        assert thumb.size == (96, 64)


def test_an_unreadable_exif_block_is_no_tag(upright):
    data = encoded(upright, "JPEG", exif=b"Exif\x00\x00not a tiff header", quality=95)
    assert rgb(data).shape == (64, 96, 3)


def test_cmyk_16_bit_palette_and_alpha_decode_to_what_a_viewer_shows():
    cmyk = Image.new("CMYK", (3, 1))
    cmyk.putdata([(0, 255, 255, 0), (64, 128, 0, 51), (0, 0, 0, 255)])
    # R = (255 - C)(255 - K) / 255, rounded: 191 * 204 / 255 = 152.8; 127 * 204 / 255 = 101.6
    assert rgb(encoded(cmyk, "TIFF")).tolist() == [[[255, 0, 0], [153, 102, 204], [0, 0, 0]]]

    deep = np.array([[0, 255, 256, 40000, 65535]], dtype=np.uint16)
    assert Image.open(io.BytesIO(encoded(deep))).mode == "I;16"
    # the high byte (40000 = 156 * 256 + 64), grey; PIL's convert would clip 256.. to white
    assert rgb(encoded(deep)).tolist() == [[[v] * 3 for v in (0, 0, 1, 156, 255)]]

    palette = Image.new("P", (3, 1))
    palette.putpalette([255, 0, 0, 0, 0, 255, 10, 20, 30])
    palette.putdata([0, 1, 2])
    assert rgb(encoded(palette)).tolist() == [[[255, 0, 0], [0, 0, 255], [10, 20, 30]]]
    # entry 1 transparent: white where it is
    assert rgb(encoded(palette, transparency=1)).tolist() == [[[255, 0, 0], [255] * 3,
                                                               [10, 20, 30]]]  # fmt: skip

    rgba = Image.new("RGBA", (3, 1))
    rgba.putdata([(255, 0, 0, 255), (255, 0, 0, 0), (0, 0, 0, 51)])
    # opaque red; fully transparent: white; black at alpha 51 (1/5) over white: 255 * 4/5
    assert rgb(encoded(rgba)).tolist() == [[[255, 0, 0], [255] * 3, [204] * 3]]
    la = Image.new("LA", (3, 1))
    la.putdata([(0, 255), (0, 0), (0, 51)])
    assert rgb(encoded(la)).tolist() == [[[0] * 3, [255] * 3, [204] * 3]]


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # see the next test
def test_a_decompression_bomb_is_refused_in_one_line(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    over = encoded(np.zeros((10, 12, 3), np.uint8))  # 120 pixels: PIL would only warn
    with pytest.raises(HarnessError) as refused:
        open_photo(over, "photo.png")
    assert str(refused.value) == ("photo.png is too large to decode: 12 x 10 = 120 pixels, over "
                                  "PIL's decompression-bomb limit of 100 "
                                  "(PIL.Image.MAX_IMAGE_PIXELS)")  # fmt: skip
    (tmp_path / "huge.png").write_bytes(encoded(np.zeros((20, 20, 3), np.uint8)))  # over 2x
    with pytest.raises(HarnessError) as refused:
        open_rgb(tmp_path / "huge.png")
    message = str(refused.value)
    assert message.startswith(f"image {tmp_path / 'huge.png'} is too large to decode: over "
                              "twice PIL's decompression-bomb limit of 100") and "\n" not in message  # fmt: skip
    # `index` skips it with the reason, apart from the files that are no image
    failed = [("huge.png", message), ("a.jpg", "cannot decode a.jpg (...)"), ("b.jpg", "...")]
    with caplog.at_level(logging.WARNING):
        report_failed(failed)
    assert [r.getMessage() for r in caplog.records] == [
        "skipped 2 file(s) that could not be decoded: a.jpg, b.jpg",
        "skipped 1 file(s) too large to decode (over PIL's decompression-bomb limit of 100 "
        "pixels): huge.png",
    ]


def test_a_file_that_is_no_image_is_one_line_naming_it(tmp_path):
    for data in (b"not a photo", b"\xff\xd8\xff\xe0 a truncated jpeg", b""):
        with pytest.raises(HarnessError) as error:
            open_photo(data, "holiday/1.jpg")
        message = str(error.value)
        assert message.startswith("cannot decode holiday/1.jpg (") and "\n" not in message
        assert message.endswith("the file is not an image, or a corrupt or truncated one")
    png = encoded(np.zeros((40, 40, 3), np.uint8))
    (tmp_path / "cut.png").write_bytes(png[: len(png) // 2])
    with pytest.raises(HarnessError, match=r"cannot decode image .*cut\.png .*replace it from"):
        open_rgb(tmp_path / "cut.png")
    with pytest.raises(FileNotFoundError):  # for the caller to name where it should be
        open_photo(tmp_path / "gone.jpg", "gone.jpg")


def test_pils_own_warning_stays_out_of_the_output(tmp_path):
    """Between the limit and twice it PIL warns on opening (two lines on stderr); the refusal
    is already the one line. A fresh process, as pytest resets the warning filters."""
    (tmp_path / "over.png").write_bytes(encoded(np.zeros((10, 12, 3), np.uint8)))
    code = ("import sys; from PIL import Image; from harness.data.photo_decode import "
            "open_photo; Image.MAX_IMAGE_PIXELS = 100\n"
            "try: open_photo(sys.argv[1], 'over.png')\nexcept Exception as e: print(e)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "over.png")],
                          capture_output=True, text=True, check=True, cwd=REPO)  # fmt: skip
    assert done.stdout.startswith("over.png is too large to decode: 12 x 10") and not done.stderr


@pytest.mark.parametrize("tag", range(1, 9))
def test_the_torch_decoder_turns_each_tag_upright_as_pil_does(upright, tag):
    """`run --decoder torch` applies the tag itself, the same on CPU and CUDA (torchvision's
    own flag is CPU-only): the lossless PNG decodes to the upright pixels exactly."""
    from harness.data.torch_decode import Encoded

    data = encoded(stored_as(upright, tag), tag=tag)
    out = Encoded([data], [None], ["p.png"], 0, "cpu").decode()[0]
    np.testing.assert_array_equal(out.permute(1, 2, 0).numpy(), upright)
