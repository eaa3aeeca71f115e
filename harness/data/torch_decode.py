"""Decoding image files with torchvision's decoder on the run's device (`run --decoder
torch`): nvJPEG on CUDA, libjpeg-turbo on the CPU.

With PIL (the default decoder) the data workers decode and augment whole batches, and a GPU
waits when the CPU cores cannot keep up. With `torch`, the workers only read the files'
bytes (an `Encoded` batch); the training process decodes the batch in one call on its
device, crops the bounding boxes, resizes and augments there. On the CPU the decoded pixels
equal PIL's (both libjpeg-turbo; tested); the resize is torch's antialiased bilinear, which
differs from PIL's by rounding. A photo's EXIF orientation tag is applied to the decoded
pixels, on either device (torchvision's own `apply_exif_orientation` is CPU-only), so that
a sideways-stored photo is upright, as with PIL (harness.data.photo_decode). torchvision marks its decoders deprecated in favour of
TorchCodec (0.29); they are what the pinned versions have, so they are used until the lock
moves.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.core import HarnessError, program_name
from harness.data.boxes import box_edges

JPEG = b"\xff\xd8"


def broken_advice(own: bool) -> str:
    """What to do about a broken photo: an official dataset's copy comes again from its
    archive; a photo in the user's own folder can only be fixed or removed there."""
    if own:
        return "fix or remove the file in your folder (docs/own-data.md)"
    return "replace it from the official archive"


@dataclass
class Encoded:
    """A batch of image files as read from disk, to be decoded on `device`: what the data
    workers hand to the training process when it decodes."""

    data: list[bytes]  # each file's bytes (as bytes, not tensors: a tensor from a worker holds
    # a file descriptor in the training process until freed, 180 a batch would exhaust them)
    boxes: list[np.ndarray | None]  # crop box per image (left, top, right, bottom) or None
    paths: list[str]
    size: int  # side of the square to resize to; 0: each image at its own size
    device: str
    own: bool = False  # the photos are the user's own folder's (what a broken one's error says)

    def decode(self) -> torch.Tensor | list[torch.Tensor]:
        """uint8 [B, 3, S, S] on the device (size 0: a list of [3, H, W])."""
        data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in self.data]
        images = _decode_all(data, self.paths, torch.device(self.device), self.own)
        images = [upright(x, orientation(b)) for x, b in zip(images, self.data, strict=True)]
        out = [_crop_resize(x, box, self.size) for x, box in zip(images, self.boxes, strict=True)]
        if not self.size:
            return out
        if not out:
            return torch.empty((0, 3, self.size, self.size), dtype=torch.uint8)
        return torch.stack(out)


def read(
    paths: list[str], boxes: list[np.ndarray | None], size: int, device: str, own: bool = False
) -> Encoded:
    """The files' bytes, read (not decoded); a missing, unreadable or empty file is a
    HarnessError naming it (`own`: the photos are the user's own, see broken_advice)."""
    data = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data.append(f.read())
        except FileNotFoundError:
            raise HarnessError(f"image {path} is missing; check the dataset with "
                               f"`{program_name()} data verify`") from None  # fmt: skip
        except OSError as exc:
            raise HarnessError(f"cannot read image {path} ({exc.strerror or exc})") from None
        if not data[-1]:
            raise HarnessError(f"image {path} is empty; {broken_advice(own)}")
    return Encoded(data, boxes, list(paths), int(size), str(device), own)


def _decode_all(
    data: list[torch.Tensor], paths: list[str], device: torch.device, own: bool
) -> list:
    """Every file as RGB uint8 [3, H, W] on `device`: the JPEGs in one batched call, other
    formats (PNG, ...) one by one on the CPU."""
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    out: list[Any] = [None] * len(data)
    jpeg = [i for i, b in enumerate(data) if bytes(b[:2].tolist()) == JPEG]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # see the module docstring
        try:
            if jpeg:
                decoded = decode_jpeg([data[i] for i in jpeg], mode=ImageReadMode.RGB,
                                      device=device)  # fmt: skip
                for i, x in zip(jpeg, decoded, strict=True):
                    out[i] = x
            for i in (i for i in range(len(data)) if out[i] is None):
                out[i] = _eight_bit(decode_image(data[i], mode=ImageReadMode.RGB)).to(device)
        except RuntimeError:
            return [_decode_one(b, path, device, own) for b, path in zip(data, paths, strict=True)]
    return out


def _decode_one(data: torch.Tensor, path: str, device: torch.device, own: bool) -> torch.Tensor:
    """After a batched call failed: this file alone on the device, else on the CPU (nvJPEG
    does not take every JPEG, e.g. CMYK ones); a file no decoder takes is named."""
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            if bytes(data[:2].tolist()) == JPEG:
                return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            pass
        try:
            return _eight_bit(decode_image(data, mode=ImageReadMode.RGB)).to(device)
        except RuntimeError as exc:
            raise HarnessError(f"cannot decode image {path} ({exc}); the file is corrupt or "
                               f"truncated: {broken_advice(own)}") from None  # fmt: skip


def orientation(data: bytes) -> int:
    """The EXIF orientation tag of an encoded image (1, upright, when it has none or an
    unreadable one): PIL reads the header only."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            value = im.getexif().get(0x0112, 1)
    except Exception:  # the decoder names a broken file; no tag here
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def upright(image: torch.Tensor, tag: int) -> torch.Tensor:
    """[C, H, W] turned as EXIF orientation `tag` says a viewer shows it (PIL's
    ImageOps.exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90
    clockwise, 7 transverse, 8 rotate 90 counter-clockwise)."""
    h, w = -2, -1
    if tag == 2:
        return image.flip(w)
    if tag == 3:
        return image.flip(h, w)
    if tag == 4:
        return image.flip(h)
    if tag == 5:
        return image.transpose(h, w)
    if tag == 6:
        return torch.rot90(image, -1, dims=(h, w))
    if tag == 7:
        return image.transpose(h, w).flip(h, w)
    if tag == 8:
        return torch.rot90(image, 1, dims=(h, w))
    return image


def _eight_bit(image: torch.Tensor) -> torch.Tensor:
    """A 16-bit PNG's pixels as uint8 (their high byte, as the PIL decoder takes them)."""
    return image if image.dtype == torch.uint8 else (image.int() >> 8).to(torch.uint8)


def _crop_resize(image: torch.Tensor, box: np.ndarray | None, size: int) -> torch.Tensor:
    """The bounding box crop (the same pixel edges as the PIL decoder's), then
    the antialiased bilinear resize to size x size (size 0: none)."""
    import torchvision.transforms.v2.functional as TF

    edges = box_edges(box, image.shape[-1], image.shape[-2])
    if edges is not None:
        left, top, right, bottom = edges
        image = image[:, top:bottom, left:right]
    if size:
        image = TF.resize(image, [size, size], antialias=True)
    return image.contiguous()
