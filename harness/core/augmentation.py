"""The protocol's `augmentation:` section as data: the ops each pipeline may hold, with their
parameters checked when the protocol is parsed (harness.data.augment applies them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.core.registry import closest

# the fields each op takes (every other field must stay at its default)
PARAMS: dict[str, tuple[str, ...]] = {
    "random_resized_crop": ("size", "scale", "ratio", "interpolation"),
    "random_crop": ("size",),
    "center_crop": ("size",),
    "resize": ("size", "interpolation"),
    "resize_shorter": ("size", "interpolation"),
    "horizontal_flip": ("p",),
    "color_jitter": ("brightness", "contrast", "saturation", "hue"),
}
RANDOM = ("random_resized_crop", "random_crop", "horizontal_flip", "color_jitter")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class OpSpec:
    """One op of a pipeline, e.g. {op: random_resized_crop, size: 224, scale: [0.16, 1]}."""

    op: str
    size: int = 0
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])
    ratio: list[float] = field(default_factory=lambda: [3 / 4, 4 / 3])
    p: float = 0.5
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    hue: float = 0.0
    interpolation: str = "bilinear"  # or "bicubic" (antialiased either way)

    def __post_init__(self) -> None:
        names = list(PARAMS)
        _check(self.op in PARAMS, f"unknown op {self.op!r}{closest(self.op, names)}; known: "
                                  f"{', '.join(names)}")  # fmt: skip
        for name in _DEFAULTS:
            given = getattr(self, name) != _DEFAULTS[name]
            _check(name in PARAMS[self.op] or not given,
                   f"{self.op} takes {', '.join(PARAMS[self.op])}, not {name}")  # fmt: skip
        if "size" in PARAMS[self.op]:
            _check(self.size >= 1, f"{self.op} needs size: the output side in pixels")
        lo, hi = (self.scale + [0, 0])[:2]
        _check(len(self.scale) == 2 and 0 < lo <= hi <= 1, "scale must be [min, max] in (0, 1]")
        lo, hi = (self.ratio + [0, 0])[:2]
        _check(len(self.ratio) == 2 and 0 < lo <= hi, "ratio must be [min, max] with 0 < min")
        _check(0 <= self.p <= 1, "p must be in [0, 1]")
        for name in ("brightness", "contrast", "saturation"):
            _check(getattr(self, name) >= 0, f"{name} must be >= 0")
        _check(0 <= self.hue <= 0.5, "hue must be in [0, 0.5]")
        _check(self.interpolation in ("bilinear", "bicubic"),
               f"interpolation must be bilinear or bicubic, got {self.interpolation!r}")  # fmt: skip

    def content(self) -> dict[str, Any]:
        """What the protocol hash covers: the op and the fields it takes (interpolation only
        when not bilinear, which older protocols used without naming it)."""
        data = {"op": self.op, **{name: getattr(self, name) for name in PARAMS[self.op]}}
        if data.get("interpolation") == "bilinear":
            data.pop("interpolation")
        return data


_DEFAULTS = {"size": 0, "scale": [0.08, 1.0], "ratio": [3 / 4, 4 / 3], "p": 0.5,
             "brightness": 0.0, "contrast": 0.0, "saturation": 0.0, "hue": 0.0,
             "interpolation": "bilinear"}  # fmt: skip


@dataclass(frozen=True)
class AugmentationSpec:
    """The protocol's `augmentation:` section; empty (the default): images are loaded at the
    backbone's input size and used as they are."""

    load_size: int = 0
    train: list[OpSpec] = field(default_factory=list)
    test: list[OpSpec] = field(default_factory=list)
    load: str = "square"  # "square": load_size x load_size; "original": own size and aspect

    def __post_init__(self) -> None:
        _check(self.load_size >= 0, "load_size must be >= 0 (0: the backbone's input size)")
        _check(self.load in ("square", "original"),
               f"load must be square or original, got {self.load!r}")  # fmt: skip
        _check(self.load == "square" or not self.load_size,
               "load_size is the side of square loading: drop it with load: original")  # fmt: skip
        for op in self.test:
            _check(op.op not in RANDOM, f"test: {op.op} is random; the test pipeline must be "
                                        "deterministic (resize, center_crop)")  # fmt: skip

    @property
    def empty(self) -> bool:
        return not (self.load_size or self.train or self.test or self.load != "square")

    def check_sizes(self, input_size: int) -> None:
        """Both pipelines, from the loaded images, must end at the backbone's input size, as
        squares. With `load: original` the side is unknown until a resize or a random resized
        crop sets it; `resize_shorter` sets the shorter side (the image stays oblong)."""
        for name, ops in (("train", self.train), ("test", self.test)):
            side: int | None = None if self.load == "original" else self.load_size or input_size
            square = side is not None
            for n, op in enumerate(ops):
                if op.op in ("random_crop", "center_crop"):
                    _check(side is not None, f"{name}[{n}]: {op.op} of images of unknown size "
                                             "(load: original): resize them first")  # fmt: skip
                    _check(op.size <= side, f"{name}[{n}]: {op.op} to {op.size} px from images "
                                            f"of {side} px")  # fmt: skip
                if "size" in PARAMS[op.op]:
                    side, square = op.size, square or op.op != "resize_shorter"
            _check(side is not None, f"{name} leaves the images at their original sizes (load: "
                                     f"original): resize or crop them to {input_size}")  # fmt: skip
            _check(side == input_size and square,
                   f"{name} ends at {side} px{'' if square else ' (shorter side)'} but "
                   f"backbone.input_size is {input_size}: end it with a crop or resize to "
                   f"{input_size}")  # fmt: skip

    def content(self) -> dict[str, Any]:
        data = {"load_size": self.load_size, "train": [op.content() for op in self.train],
                "test": [op.content() for op in self.test]}  # fmt: skip
        return data if self.load == "square" else {"load": self.load, **data}
