"""Images read from disk when a batch needs them, for datasets too large to hold in memory.

SOP (120k images), In-shop (52k) and VehicleID (221k) at 224 px would take 18-33 GB as one
uint8 tensor. A LazyImages stands in for that tensor: indexing it (an index tensor, a numpy
array, a list or a slice) returns another LazyImages, a view that decodes nothing; `.to(device)`
(what the training loop and the evaluation call on every batch) or `.load()` decodes the
view's files into a uint8 tensor [B, 3, S, S]. So `images[split.train]`, `images[idx].to(dev)`
and `images[start:end].to(dev)` work unchanged on either kind of image source.

Decoding is deterministic: PIL opens the file, turns it upright and converts it to RGB as a
viewer shows it (harness.data.photo_decode), crops the bounding box when one is given, and
resizes the result to S x S with PIL's bilinear filter (antialiased; the aspect ratio is not
kept, like the 256 x 256 resize of the seed papers). Size 0 keeps each image at its own size
and aspect (the augmentation's `load: original`): `.load()` then returns a list of [3, H, W]
tensors, for the augmentation to crop and resize one by one.
Random crops and flips are the augmentation's (harness.data.augment), not the decoder's. A missing,
truncated or corrupt file raises a HarnessError naming its path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from harness.core import HarnessError, program_name
from harness.data.boxes import box_edges
from harness.data.photo_decode import open_photo
from harness.data.torch_decode import broken_advice, read

if TYPE_CHECKING:
    from PIL import Image

    from harness.data.torch_decode import Encoded

# PIL releases the GIL while decoding JPEGs: a few threads keep a GPU fed; order is kept.
DECODE_THREADS = max(1, min(8, os.cpu_count() or 1))
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="decode")
    return _POOL


def set_decode_threads(threads: int) -> None:
    """Decode with this many threads from now on in this process (a data-loading worker
    process uses 1: there the workers are the parallelism)."""
    global DECODE_THREADS, _POOL
    DECODE_THREADS, _POOL = max(1, int(threads)), None


def open_rgb(path: str | Path, own: bool = False) -> Image.Image:
    """The image at `path` fully decoded as a viewer shows it (upright, RGB: harness.data.
    photo_decode); a HarnessError naming the path otherwise, saying what to do about it (a
    photo of the user's own folder, `own`, is fixed or removed there)."""
    try:
        return open_photo(path, f"image {path}", advice="the file is corrupt or truncated: "
                          f"{broken_advice(own)}")  # fmt: skip
    except FileNotFoundError:
        raise HarnessError(
            f"image {path} is missing; check the dataset with `{program_name()} data verify`"
        ) from None


def decode(
    path: str | Path, size: int, box: np.ndarray | None = None, own: bool = False
) -> np.ndarray:
    """uint8 [3, size, size]: the image, cropped to `box` (left, top, right, bottom; pixel
    edges, clamped to the image) when given, resized to size x size (size 0: not resized)."""
    return pixels(open_rgb(path, own), size, box)


def pixels(im: Image.Image, size: int, box: np.ndarray | None = None) -> np.ndarray:
    """uint8 [3, size, size] of a decoded RGB image, cropped and resized as `decode` does:
    the one resize that both evaluation and a kept model (harness.deploy) apply."""
    from PIL import Image

    edges = box_edges(box, im.width, im.height)
    if edges is not None:
        im = im.crop(edges)
    if size:
        im = im.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(im, dtype=np.uint8).transpose(2, 0, 1)


def relative_paths(paths: Sequence[str], root: str | Path) -> tuple[str, ...]:
    """Each path relative to `root`, with POSIX separators: what `run --save-embeddings`
    records per row (paths.txt), so that a row names its image on any machine holding the
    dataset. A path under the resolved root (a csv table's paths are joined to it) counts as
    under the root; one outside both is written as os.path.relpath gives it (leading `..`)."""
    root = Path(root)
    prefixes = [os.path.join(str(r), "") for r in dict.fromkeys((root, root.resolve()))]

    def one(path: str) -> str:
        text = str(path)
        for prefix in prefixes:
            if text.startswith(prefix):
                return Path(text[len(prefix) :]).as_posix()
        return Path(os.path.relpath(text, root)).as_posix()

    return tuple(one(p) for p in paths)


class LazyImages:
    """A view of image files that looks like a uint8 tensor [N, 3, size, size] to the harness.

    paths: one file per item; boxes: float [N, 4] crop boxes (NaN rows: no crop) or None.
    decoder: "pil" (decode with PIL on the CPU, in whichever process loads) or "torch"
    (torchvision's decoder on `device`; harness.data.torch_decode). own: the files are the
    user's own folder's, not an official dataset's (a broken one's error says to fix or
    remove it, not to fetch it again).
    """

    dtype = torch.uint8
    ndim = 4

    def __init__(
        self,
        paths: Sequence[str],
        size: int,
        boxes: np.ndarray | None = None,
        indices: np.ndarray | None = None,
        decoder: str = "pil",
        device: str = "cpu",
        own: bool = False,
    ) -> None:
        self.paths, self.own = paths, own
        self.size = int(size)
        self.boxes = boxes
        self.indices = np.arange(len(paths)) if indices is None else np.asarray(indices, np.int64)
        self.decoder, self.device = decoder, str(device)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self), 3, self.size, self.size))

    def __repr__(self) -> str:
        return f"LazyImages({len(self)} images at {self.size} px)"

    def __getitem__(self, key: object) -> LazyImages | torch.Tensor:
        """A view for a slice or an index array; the decoded image [3, S, S] for an int."""
        if isinstance(key, (int, np.integer)):
            return self._view(self.indices[[int(key)]]).load()[0]
        if isinstance(key, slice):
            return self._view(self.indices[key])
        if isinstance(key, torch.Tensor):
            key = key.cpu().numpy()
        idx = np.asarray(key)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        return self._view(self.indices[idx.astype(np.int64)])

    def _with(self, **changes: Any) -> LazyImages:
        """This view with some of its constructor's arguments changed."""
        args = {"paths": self.paths, "size": self.size, "boxes": self.boxes,
                "indices": self.indices, "decoder": self.decoder, "device": self.device,
                "own": self.own}  # fmt: skip
        return LazyImages(**{**args, **changes})

    def _view(self, indices: np.ndarray) -> LazyImages:
        return self._with(indices=indices)

    def resized(self, size: int) -> LazyImages:
        """The same images decoded at another size."""
        return self._with(size=size)

    def decoded_by(self, decoder: str, device: str | torch.device = "cpu") -> LazyImages:
        """The same images decoded by "pil" or by "torch" on `device`."""
        return self._with(decoder=decoder, device=str(device))

    def read(self) -> Encoded:
        """The view's files read but not decoded, for the torch decoder on self.device."""

        boxes = [None if self.boxes is None else self.boxes[i] for i in self.indices]
        return read([str(self.paths[i]) for i in self.indices], boxes, self.size, self.device,
                    self.own)  # fmt: skip

    def path(self, i: int) -> str:
        return str(self.paths[int(self.indices[i])])

    def load(self) -> torch.Tensor | list[torch.Tensor]:
        """Decode every image of this view: uint8 [B, 3, S, S] (size 0: a list of
        [3, H, W], each at its own size). The torch decoder returns them on its device."""
        if self.decoder == "torch":
            return self.read().decode()
        # at a fixed size each image is decoded straight into the batch; at size 0 into a list
        out: np.ndarray | list = (
            np.empty((len(self), 3, self.size, self.size), dtype=np.uint8)
            if self.size
            else [None] * len(self)
        )

        def one(pos: int) -> None:
            i = int(self.indices[pos])
            box = None if self.boxes is None else self.boxes[i]
            out[pos] = decode(self.paths[i], self.size, box, self.own)

        if len(self) <= 2 or DECODE_THREADS == 1:
            for pos in range(len(self)):
                one(pos)
        else:
            for _ in _pool().map(one, range(len(self))):  # re-raises the first error
                pass
        if not self.size:  # kept channels last in memory: torchvision's uint8 resize is
            # 2-3x faster on that layout, with the same pixels (tests/harness/test_augment.py)
            return [torch.from_numpy(a.copy(order="K")) for a in out]
        return torch.from_numpy(out)

    def to(self, *args: object, **kwargs: object) -> torch.Tensor:
        """Decode, then Tensor.to(...): what the training loop calls on every batch."""
        return self._batch().to(*args, **kwargs)

    def _batch(self) -> torch.Tensor:
        if not self.size:
            raise HarnessError("images loaded at their original sizes (augmentation load: "
                               "original) need a pipeline that resizes them; this one has none")  # fmt: skip
        return self.load()  # type: ignore[return-value]

    def float(self) -> torch.Tensor:
        return self._batch().float()
