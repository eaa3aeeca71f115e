"""Dataset modules: glyphs (rendered from matplotlib's fonts) and omniglot (official archives)."""

from __future__ import annotations

import inspect
import io
import os
import re
import unicodedata
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import harness.data as data
from harness.core import HarnessError
from harness.data import glyph_fonts, glyphs, omniglot
from harness.data.unicode_blocks import BLOCKS, block_of

SMALL = {"num_classes": 24, "images_per_class": 6, "image_size": 24}
OMNIGLOT_SMALL1 = Path("/work/shared/data/omniglot/images_background_small1.zip")
needs_small1 = pytest.mark.skipif(
    not OMNIGLOT_SMALL1.is_file(), reason=f"real Omniglot archive not present at {OMNIGLOT_SMALL1}"
)


def test_both_datasets_registered_with_keyword_only_params():
    assert {"glyphs", "omniglot"} <= set(data.DATASETS.names())
    for name in ("glyphs", "omniglot"):
        sig = inspect.signature(data.DATASETS.get(name))
        params = list(sig.parameters.values())
        assert [p.name for p in params[:2]] == ["data_root", "cache_dir"]
        for p in params[2:]:
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, p.name
            assert p.default is not inspect.Parameter.empty, p.name
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


# ----------------------------------------------------------------------------- glyphs


# the tests of the module fixtures below run on one xdist worker, which builds them once
SMALL_GLYPHS = pytest.mark.xdist_group("small_glyphs")


@pytest.fixture(scope="module")
def glyph_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("glyph-cache")


@pytest.fixture(scope="module")
def small_glyphs(glyph_cache) -> data.LabelledImages:
    return glyphs.build(None, glyph_cache, **SMALL)


@SMALL_GLYPHS
def test_glyphs_shapes_dtypes_and_labels(small_glyphs):
    ds = small_glyphs
    c, n, s = SMALL["num_classes"], SMALL["images_per_class"], SMALL["image_size"]
    assert ds.images.dtype == torch.uint8
    assert tuple(ds.images.shape) == (c * n, 1, s, s)
    assert ds.labels.dtype == np.int64 and ds.coarse_labels.dtype == np.int64
    assert len(ds.class_names) == c and len(set(ds.class_names)) == c
    assert ds.class_names == sorted(ds.class_names)
    assert np.array_equal(np.bincount(ds.labels, minlength=c), np.full(c, n))
    assert all(re.fullmatch(r"U\+[0-9A-F]{5} \S.*", name) for name in ds.class_names)
    assert ds.coarse_labels.min() >= 0 and ds.coarse_labels.max() < len(ds.coarse_names)
    assert len(set(ds.coarse_labels.tolist())) > 1  # more than one Unicode block
    for label, name in enumerate(ds.class_names):  # coarse label is the code point's block
        block = block_of(int(name[2:7], 16))
        coarse = ds.coarse_labels[ds.labels == label]
        assert {ds.coarse_names[k] for k in coarse} == {block}
    assert ds.source.startswith("matplotlib ") and "DejaVuSans.ttf" in ds.source
    assert f"{c} classes" in ds.source and "glyphs-" in ds.source


@SMALL_GLYPHS
def test_glyphs_are_white_on_black_centred_and_not_empty(small_glyphs):
    imgs = small_glyphs.images[:, 0].numpy().astype(np.float64)
    s = imgs.shape[-1]
    assert (imgs.reshape(len(imgs), -1).max(1) >= 128).all()  # every image has ink
    assert imgs.mean() < 80  # mostly black background
    border = np.concatenate([imgs[:, 0], imgs[:, -1], imgs[:, :, 0], imgs[:, :, -1]], axis=1)
    assert border.mean() < 5  # the glyph is not clipped at the edges
    ys, xs = np.mgrid[:s, :s] + 0.5
    mass = imgs.sum((1, 2))
    cy = (imgs * ys).sum((1, 2)) / mass
    cx = (imgs * xs).sum((1, 2)) / mass
    assert np.abs(cy - s / 2).max() < s * 0.25 and np.abs(cx - s / 2).max() < s * 0.25
    assert abs(np.median(cy) - s / 2) < 2 and abs(np.median(cx) - s / 2) < 2


@SMALL_GLYPHS
def test_glyphs_within_class_images_vary(small_glyphs):
    ds = small_glyphs
    for label in range(len(ds.class_names)):
        imgs = ds.images[torch.from_numpy(np.flatnonzero(ds.labels == label))]
        assert len(torch.unique(imgs.reshape(len(imgs), -1), dim=0)) == len(imgs)


@SMALL_GLYPHS
def test_glyphs_classes_really_differ(small_glyphs):
    ds = small_glyphs
    x = ds.images.reshape(len(ds), -1).double() / 255
    d = torch.cdist(x, x).numpy()
    same = ds.labels[:, None] == ds.labels[None, :]
    off = ~np.eye(len(ds), dtype=bool)
    assert d[same & off].mean() < d[~same].mean()
    np.fill_diagonal(d, np.inf)
    nn_acc = (ds.labels[d.argmin(1)] == ds.labels).mean()
    chance = 1 / len(ds.class_names)
    assert nn_acc > 5 * chance  # raw pixels already separate classes well above chance...
    assert nn_acc < 0.99  # ...but the augmentation keeps the task from being trivial


@SMALL_GLYPHS
def test_glyphs_deterministic_across_fresh_caches(small_glyphs, tmp_path):
    again = glyphs.build(None, tmp_path, **SMALL)  # fresh cache: scans and renders from scratch
    assert again.class_names == small_glyphs.class_names
    assert again.coarse_names == small_glyphs.coarse_names
    assert np.array_equal(again.labels, small_glyphs.labels)
    assert np.array_equal(again.coarse_labels, small_glyphs.coarse_labels)
    assert again.images.numpy().tobytes() == small_glyphs.images.numpy().tobytes()


@SMALL_GLYPHS
def test_glyphs_second_call_uses_the_cache(small_glyphs, glyph_cache, monkeypatch):
    (npz,) = [p for p in glyph_cache.glob("glyphs-*.npz")]
    mtime = npz.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("rebuilt although the cache was there")

    monkeypatch.setattr(glyphs, "render_classes", fail)
    monkeypatch.setattr(glyphs, "eligible_code_points", fail)
    again = glyphs.build(None, glyph_cache, **SMALL)
    assert npz.stat().st_mtime_ns == mtime
    assert torch.equal(again.images, small_glyphs.images)
    assert not list(glyph_cache.glob(".*.tmp"))  # atomic writes leave no temp files


@SMALL_GLYPHS
def test_glyphs_params_change_the_output(small_glyphs, glyph_cache):
    other_seed = glyphs.build(None, glyph_cache, **{**SMALL, "seed": 1})
    assert other_seed.class_names != small_glyphs.class_names
    bigger = glyphs.build(None, glyph_cache, **{**SMALL, "image_size": 32, "images_per_class": 3})
    assert tuple(bigger.images.shape) == (SMALL["num_classes"] * 3, 1, 32, 32)
    assert bigger.class_names == small_glyphs.class_names  # same seed, same classes
    assert len(list(glyph_cache.glob("glyphs-*.npz"))) == 3


@SMALL_GLYPHS
def test_glyphs_eligible_set(small_glyphs, glyph_cache):
    eligible = glyph_fonts.eligible_code_points(8, glyph_cache)  # cached by the fixture's build
    assert 2500 <= len(eligible) <= 3500
    for cp, fonts in eligible.items():
        assert len(fonts) >= 8 and fonts == sorted(set(fonts))
        assert unicodedata.category(chr(cp))[0] not in "ZCM"
        assert block_of(cp) is not None
    assert {ord(c) for c in "Aa0%&\u03bb\u0416\u2211\u2500"} <= set(eligible)
    # Exact homoglyphs are merged, keeping the lowest code point.
    assert ord("o") in eligible and 0x043E not in eligible  # CYRILLIC SMALL LETTER O
    assert ord("A") in eligible and 0x0391 not in eligible  # GREEK CAPITAL LETTER ALPHA


def test_glyphs_kept_fonts_have_unicode_correct_charmaps():
    from matplotlib.ft2font import FT2Font

    for path in glyph_fonts.font_paths():
        font = FT2Font(str(path))
        checked = 0
        for cp, gid in font.get_charmap().items():
            if unicodedata.category(chr(cp)) == "Co":  # private use: never a class
                continue
            m = re.fullmatch(r"(?:uni|u)([0-9A-Fa-f]{4,6})(?:\..*)?", font.get_glyph_name(gid))
            if m:
                assert int(m.group(1), 16) == cp, (path.name, hex(cp))
                checked += 1
        assert checked > 500, path.name


def test_excluded_cm_fonts_would_give_wrong_labels():
    from matplotlib.ft2font import FT2Font

    cmr10 = FT2Font(str(glyph_fonts.font_dir() / "cmr10.ttf"))
    assert cmr10.get_glyph_name(cmr10.get_charmap()[0xA1]) == "Gamma"  # not INVERTED EXCLAMATION
    assert not any(
        name.startswith(("cm", "LastResort", "STIXSiz")) for name in glyph_fonts.FONT_FILES
    )


@SMALL_GLYPHS
@pytest.mark.parametrize(
    "params, message",
    [
        ({"num_classes": 100_000}, "only"),
        ({"image_size": 4}, "image_size"),
        ({"num_classes": "many"}, "integer"),
        ({"images_per_class": True}, "integer"),
        ({"seed": -1}, "seed"),
        ({"min_fonts": 99}, "min_fonts"),
    ],
)
def test_glyphs_bad_params(params, message, small_glyphs, glyph_cache):
    with pytest.raises(HarnessError, match=message):
        glyphs.build(None, glyph_cache, **params)


def test_unicode_block_table_matches_blocks_txt():
    blocks_txt = Path("/usr/share/perl/5.36.0/unicore/Blocks.txt")
    if not blocks_txt.is_file():
        pytest.skip(f"no Unicode Blocks.txt at {blocks_txt} to check against")
    official = {}
    for line in blocks_txt.read_text().splitlines():
        m = re.match(r"([0-9A-F]+)\.\.([0-9A-F]+); (.+)", line)
        if m:
            official[m.group(3).strip()] = (int(m.group(1), 16), int(m.group(2), 16))
    for first, last, name in BLOCKS:
        assert official[name] == (first, last), name
    assert [b[0] for b in BLOCKS] == sorted(b[0] for b in BLOCKS)
    assert block_of(0x41) == "Basic Latin" and block_of(0x2500) == "Box Drawing"
    assert block_of(0xAC00) is None  # Hangul Syllables: not in the table


# ----------------------------------------------------------------------------- omniglot


def _png(corrupt: bool = False, seed: int = 0) -> bytes:
    """A 105x105 1-bit PNG like Omniglot's: black strokes on white."""
    rng = np.random.default_rng(seed)
    pixels = np.ones((105, 105), bool)
    r, c = rng.integers(10, 90, size=2)
    pixels[r : r + 12, 10:95] = False
    pixels[10:95, c : c + 6] = False
    buf = io.BytesIO()
    Image.fromarray(pixels).convert("1").save(buf, format="PNG")
    raw = buf.getvalue()
    return raw[: len(raw) // 2] if corrupt else raw


def _make_zip(
    path: Path, name: str, alphabets=("Alpha", "Beta"), chars=2, drawers=3, corrupt=None
) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for a in alphabets:
            for k in range(1, chars + 1):
                for d in range(1, drawers + 1):
                    entry = f"{name}/{a}/character{k:02d}/{k:04d}_{d:02d}.png"
                    z.writestr(entry, _png(corrupt == entry, seed=k * 10 + d))
    return path


@needs_small1
def test_omniglot_real_small1_archive(tmp_path):
    ds = omniglot.build(OMNIGLOT_SMALL1.parent, tmp_path)
    assert len(ds.class_names) == 136 and len(ds) == 2720
    assert len(ds.coarse_names) == 5
    assert ds.coarse_names == ["Balinese", "Early_Aramaic", "Greek", "Korean", "Latin"]
    assert np.array_equal(np.bincount(ds.labels), np.full(136, 20))
    assert ds.class_names == sorted(ds.class_names)
    assert ds.class_names[0] == "Balinese/character01"
    assert tuple(ds.images.shape) == (2720, 1, 32, 32) and ds.images.dtype == torch.uint8
    imgs = ds.images.numpy()
    assert imgs.mean() < 60  # strokes high on a black background (inverted)
    assert (imgs.reshape(len(imgs), -1).max(1) > 100).all()
    for label, name in enumerate(ds.class_names):
        alphabets = {ds.coarse_names[k] for k in ds.coarse_labels[ds.labels == label]}
        assert alphabets == {name.split("/")[0]}
    assert "images_background_small1.zip" in ds.source


@needs_small1
def test_omniglot_extracted_folder_matches_zip(tmp_path):
    root = tmp_path / "root"
    with zipfile.ZipFile(OMNIGLOT_SMALL1) as z:
        members = [
            n
            for n in z.namelist()
            if n.startswith(("images_background_small1/Greek/", "images_background_small1/Latin/"))
        ]
        z.extractall(root, members=members)
    ds = omniglot.build(root, tmp_path / "cache", image_size=28)
    assert ds.coarse_names == ["Greek", "Latin"]
    assert len(ds.class_names) == 24 + 26 and len(ds) == 50 * 20
    assert tuple(ds.images.shape[1:]) == (1, 28, 28)
    full = omniglot.build(OMNIGLOT_SMALL1.parent, tmp_path / "cache", image_size=28)
    idx = np.flatnonzero(np.isin(np.asarray(full.class_names)[full.labels], ds.class_names))
    assert torch.equal(full.images[torch.from_numpy(idx)], ds.images)  # same pixels as the zip


def test_omniglot_synthetic_zip_and_cache(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    _make_zip(root / "images_background_small1.zip", "images_background_small1")
    cache = tmp_path / "cache"
    ds = omniglot.build(root, cache, archives=["images_background_small1"], image_size=16)
    assert ds.class_names == [
        "Alpha/character01",
        "Alpha/character02",
        "Beta/character01",
        "Beta/character02",
    ]
    assert ds.coarse_names == ["Alpha", "Beta"] and len(ds) == 12
    assert ds.coarse_labels.tolist() == [0] * 6 + [1] * 6
    assert tuple(ds.images.shape) == (12, 1, 16, 16)
    (npz,) = cache.glob("omniglot-*.npz")

    def fail(*args, **kwargs):
        raise AssertionError("decoded again although the cache was there")

    monkeypatch.setattr(omniglot, "_decode", fail)
    again = omniglot.build(root, cache, image_size=16)
    assert torch.equal(again.images, ds.images) and list(cache.glob("omniglot-*.npz")) == [npz]
    # A changed archive (new mtime) is read again.
    stat = (root / "images_background_small1.zip").stat()
    os.utime(root / "images_background_small1.zip", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="decoded again"):
        omniglot.build(root, cache, image_size=16)


def test_omniglot_needs_data_root(tmp_path):
    with pytest.raises(
        HarnessError, match=r"--data-root DIR holding images_background_small1\.zip"
    ):
        omniglot.build(None, tmp_path)


def test_omniglot_missing_archive_names_file_and_dir(tmp_path):
    with pytest.raises(HarnessError) as err:
        omniglot.build(tmp_path, tmp_path / "cache", archives=("images_evaluation",))
    assert "images_evaluation.zip" in str(err.value) and str(tmp_path) in str(err.value)


def test_omniglot_unknown_or_overlapping_archives(tmp_path):
    with pytest.raises(HarnessError, match="did you mean 'images_evaluation'"):
        omniglot.build(tmp_path, tmp_path, archives=["images_evalution"])
    _make_zip(tmp_path / "images_background.zip", "images_background")
    _make_zip(tmp_path / "images_background_small1.zip", "images_background_small1")
    with pytest.raises(HarnessError, match="both hold alphabet Alpha"):
        omniglot.build(
            tmp_path, tmp_path / "c", archives=["images_background", "images_background_small1"]
        )


def test_omniglot_corrupt_png_names_the_entry(tmp_path):
    bad = "images_background_small1/Beta/character02/0002_03.png"
    _make_zip(tmp_path / "images_background_small1.zip", "images_background_small1", corrupt=bad)
    with pytest.raises(HarnessError, match=re.escape(bad)):
        omniglot.build(tmp_path, tmp_path / "cache")


def test_omniglot_not_a_zip_or_no_images(tmp_path):
    (tmp_path / "images_background_small1.zip").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(HarnessError, match="not a readable zip"):
        omniglot.build(tmp_path, tmp_path / "cache")
    with zipfile.ZipFile(tmp_path / "images_background_small1.zip", "w") as z:
        z.writestr("images_background_small1/README.txt", "nothing here")
    with pytest.raises(HarnessError, match="holds no images"):
        omniglot.build(tmp_path, tmp_path / "cache")


class _Response(io.BytesIO):
    """What urlopen returns, enough for the download code: read() and a context manager."""


def test_omniglot_download_with_mocked_urlopen(tmp_path, monkeypatch):
    payload = _make_zip(tmp_path / "served.zip", "images_background_small2").read_bytes()
    requested = []

    def fake_urlopen(url, timeout=None):
        requested.append(url)
        return _Response(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    root = tmp_path / "root"
    root.mkdir()
    ds = omniglot.build(
        root, tmp_path / "cache", archives=("images_background_small2",), download=True
    )
    assert requested == [
        "https://raw.githubusercontent.com/brendenlake/omniglot/master/python/"
        "images_background_small2.zip"
    ]
    assert (root / "images_background_small2.zip").read_bytes() == payload
    assert sorted(p.name for p in root.iterdir()) == ["images_background_small2.zip"]  # no .part
    assert len(ds.class_names) == 4 and len(ds) == 12
    # Present now: no second download.
    omniglot.build(root, tmp_path / "cache", archives=("images_background_small2",), download=True)
    assert len(requested) == 1
    # Without data_root, download goes to cache_dir/omniglot.
    ds2 = omniglot.build(
        None, tmp_path / "cache2", archives=("images_background_small2",), download=True
    )
    assert (tmp_path / "cache2" / "omniglot" / "images_background_small2.zip").is_file()
    assert torch.equal(ds2.images, ds.images)


def test_omniglot_download_failures(tmp_path, monkeypatch):
    def offline(url, timeout=None):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(HarnessError, match="could not download https://raw.githubusercontent"):
        omniglot.build(tmp_path, tmp_path / "cache", download=True)
    assert list(tmp_path.glob("*.zip")) == [] and list(tmp_path.glob(".*part")) == []

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: _Response(b"<html>"))
    with pytest.raises(HarnessError, match="did not return a zip"):
        omniglot.build(tmp_path, tmp_path / "cache", download=True)
    assert list(tmp_path.glob("*.zip")) == [] and list(tmp_path.glob(".*part")) == []
