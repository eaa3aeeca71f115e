"""Augmentation as protocol data: a `train` pipeline of random ops applied to every training
image, and a deterministic `test` pipeline applied to every image that is embedded for
evaluation or validation.

Published DML results train with random (resized) crops and flips and test on a resized
center crop; numbers without them are not comparable with those tables, so the pipeline is
part of the protocol (and of its hash). Images are first loaded at `load_size` x `load_size`
(the backbone's input size when 0: the seed papers' "resize to 256 x 256, random crop 227"
is load_size 256 + random_crop 227); each pipeline must end at the backbone's input size.
With `load: original` images are loaded at their own size and aspect (the bounding box, when
the protocol crops one), as torchvision's usual pipeline takes them: RandomResizedCrop from
the original image for training, Resize(256) of the shorter side + CenterCrop(224) at test
(`resize_shorter` + `center_crop`); then each pipeline must first bring them to a known size.

Ops run on uint8 tensors [C, H, W] through torchvision.transforms.v2.functional, for
in-memory and on-disk datasets alike. Every random draw of image `pos` of the batch at
training step `step` comes from its own generator, seeded by (seed, step, pos): the draws do
not depend on which process, worker or thread prepares the batch, so a resumed run, a run
fed by N workers and a run on N ranks see the same augmented images as an uninterrupted,
single-process one. The random-resized-crop box follows torchvision's RandomResizedCrop
(10 tries, then a center crop clamped to the ratio range), drawn from that generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.core import AugmentationSpec, HarnessError, OpSpec


def generator(seed: int, step: int, pos: int) -> Any:
    """The torch generator of image `pos` of the batch at `step`: its own stream of draws."""
    import torch

    state = np.random.SeedSequence([seed, step, pos]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)


def _uniform(gen: Any, lo: float, hi: float) -> float:
    import torch

    return lo + (hi - lo) * float(torch.rand((), generator=gen, dtype=torch.float64))


def _crop_box(height: int, width: int, op: OpSpec, gen: Any) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params, drawn from `gen`: (top, left, h, w)."""
    import torch

    area = height * width
    log_lo, log_hi = math.log(op.ratio[0]), math.log(op.ratio[1])
    for _ in range(10):
        target = area * _uniform(gen, op.scale[0], op.scale[1])
        aspect = math.exp(_uniform(gen, log_lo, log_hi))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=gen))
            left = int(torch.randint(0, width - w + 1, (), generator=gen))
            return top, left, h, w
    ratio = width / height  # fallback: the whole image, clamped to the ratio range
    if ratio < op.ratio[0]:
        w, h = width, round(width / op.ratio[0])
    elif ratio > op.ratio[1]:
        h, w = height, round(height * op.ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def apply_op(image: Any, op: OpSpec, gen: Any = None) -> Any:
    """One op on uint8 [..., C, H, W] (random ops: one image, drawing from `gen`)."""
    import torch
    import torchvision.transforms.v2.functional as TF

    s = [op.size, op.size]
    height, width = image.shape[-2:]
    mode = TF.InterpolationMode(op.interpolation)
    if op.op == "resize":
        return TF.resize(image, s, mode, antialias=True)
    if op.op == "resize_shorter":  # torchvision Resize(size): the shorter side, aspect kept
        return TF.resize(image, [op.size], mode, antialias=True)
    if op.op == "center_crop":
        return TF.center_crop(image, s)
    if op.op == "random_crop":
        top = int(torch.randint(0, height - op.size + 1, (), generator=gen))
        left = int(torch.randint(0, width - op.size + 1, (), generator=gen))
        return TF.crop(image, top, left, op.size, op.size)
    if op.op == "random_resized_crop":
        box = _crop_box(height, width, op, gen)
        return TF.resized_crop(image, *box, s, mode, antialias=True)
    if op.op == "horizontal_flip":
        return image.flip(-1) if _uniform(gen, 0, 1) < op.p else image
    return _jitter(image, op, gen)


def _jitter(image: Any, op: OpSpec, gen: Any) -> Any:
    """torchvision ColorJitter: the four adjustments in a random order, random factors."""
    import torch
    import torchvision.transforms.v2.functional as TF

    if image.shape[-3] != 3 and (op.saturation or op.hue):
        raise HarnessError(f"color_jitter: saturation and hue need RGB images; these have "
                           f"{image.shape[-3]} channel(s): use brightness and contrast")  # fmt: skip
    adjust = {0: ("brightness", TF.adjust_brightness), 1: ("contrast", TF.adjust_contrast),
              2: ("saturation", TF.adjust_saturation)}  # fmt: skip
    for k in torch.randperm(4, generator=gen).tolist():
        if k == 3:
            if op.hue:
                image = TF.adjust_hue(image, _uniform(gen, -op.hue, op.hue))
            continue
        name, fn = adjust[k]
        amount = getattr(op, name)
        if amount:
            image = fn(image, _uniform(gen, max(0.0, 1 - amount), 1 + amount))
    return image


class TrainPipeline:
    """The train ops of one run (its seed): uint8 [B, C, L, L] (or a list of [C, H, W] of
    their own sizes, `load: original`) -> [B, C, S, S]."""

    def __init__(self, ops: Sequence[OpSpec], seed: int) -> None:
        self.ops, self.seed = list(ops), int(seed)

    def __call__(self, images: Any, step: int, positions: Sequence[int]) -> Any:
        import torch

        out = []
        for image, pos in zip(images, positions, strict=True):
            gen = generator(self.seed, step, int(pos))
            for op in self.ops:
                image = apply_op(image, op, gen)
            out.append(image)
        return torch.stack(out)


class EvalView:
    """Images seen through the deterministic test pipeline: slicing gives a view, `.to()`
    (what the evaluation calls on every batch) loads and transforms the view's images."""

    def __init__(self, images: Any, ops: Sequence[OpSpec], size: int) -> None:
        self.images, self.ops, self.size = images, list(ops), size

    def __len__(self) -> int:
        return len(self.images)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), self.images.shape[1], self.size, self.size)

    def __getitem__(self, key: Any) -> EvalView:
        return EvalView(self.images[key], self.ops, self.size)

    def load(self) -> Any:
        import torch

        x = self.images.load() if hasattr(self.images, "load") else self.images
        if isinstance(x, list):  # images of their own sizes (load: original): one by one
            return torch.stack([self._apply(image) for image in x])
        return self._apply(x)

    def _apply(self, x: Any) -> Any:
        for op in self.ops:
            x = apply_op(x, op)
        return x

    def to(self, *args: Any, **kwargs: Any) -> Any:
        return self.load().to(*args, **kwargs)


def for_test(images: Any, spec: AugmentationSpec, input_size: int) -> Any:
    """`images` as the evaluation embeds them: through the test pipeline when there is one."""
    if getattr(images, "in_process", False):  # a frozen trunk's cached test views
        return images
    return EvalView(images, spec.test, input_size) if spec.test else images
