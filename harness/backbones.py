"""Backbones by name. Each exposes its stages, so heads may attach at several depths (HDC).

A backbone maps a float image batch to a list of globally pooled features, one per stage,
shallowest first; `stage_dims` gives their sizes. The runner builds it from the protocol:
methods never choose or change it.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from harness.errors import HarnessError
from harness.protocol import BackboneSpec
from harness.registry import Registry


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


@BACKBONES.register("conv4")
def conv4(*, pretrained: str, in_channels: int, width: int = 64, blocks: int = 4) -> Backbone:
    """The 4-block CNN of few-shot Omniglot work (conv3x3-BN-ReLU-maxpool): fast on a CPU."""
    if pretrained != "none":
        raise HarnessError("conv4 has no pretrained weights: set backbone.pretrained: none")
    stages: list[nn.Module] = []
    channels = in_channels
    for _ in range(blocks):
        stages.append(
            nn.Sequential(
                nn.Conv2d(channels, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
            )
        )
        channels = width
    return Backbone(
        stages, [width] * blocks, in_channels, (0.5,) * in_channels, (0.5,) * in_channels
    )


def _torchvision(name: str, pretrained: str, weights_file: str = "") -> nn.Module:
    """A torchvision model: ImageNet weights from `weights_file` when given, else from
    torchvision's weights API (downloaded once, then cached). Never silently random when
    pretrained is "imagenet": no weights is an error."""
    import torchvision

    kwargs = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
    if weights_file:
        net = getattr(torchvision.models, name)(weights=None, **kwargs)
        load_weights_file(net, name, Path(weights_file))
        return net
    weights = "DEFAULT" if pretrained == "imagenet" else None
    if weights is not None:  # with its weights, torchvision drops GoogLeNet's aux heads itself
        kwargs = {}
    try:
        return getattr(torchvision.models, name)(weights=weights, **kwargs)
    except (OSError, RuntimeError) as exc:  # a download that failed
        raise HarnessError(
            f"cannot get the ImageNet weights of {name} ({exc}); the protocol says pretrained: "
            "imagenet and the run will not train from random weights. On a machine with "
            f"internet, torchvision.models.{name}(weights='DEFAULT') caches the file in "
            "~/.cache/torch/hub/checkpoints/; copy it here and pass `--weights FILE` (or "
            "backbone.weights_file in the protocol)"
        ) from None


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
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        raise HarnessError(f"cannot read weights file {path} ({exc})") from None
    return {"file": str(path), "sha256": digest.hexdigest()}


def _resnet(name: str, pretrained: str, dims: list[int], weights_file: str = "") -> Backbone:
    net = _torchvision(name, pretrained, weights_file)
    stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1)
    return Backbone([stem, net.layer2, net.layer3, net.layer4], dims, 3, *IMAGENET)


@BACKBONES.register("resnet18")
def resnet18(*, pretrained: str, in_channels: int, weights_file: str = "") -> Backbone:
    return _resnet("resnet18", pretrained, [64, 128, 256, 512], weights_file)


@BACKBONES.register("resnet50")
def resnet50(*, pretrained: str, in_channels: int, weights_file: str = "") -> Backbone:
    return _resnet("resnet50", pretrained, [256, 512, 1024, 2048], weights_file)


@BACKBONES.register("resnet101")
def resnet101(*, pretrained: str, in_channels: int, weights_file: str = "") -> Backbone:
    return _resnet("resnet101", pretrained, [256, 512, 1024, 2048], weights_file)


@BACKBONES.register("googlenet")
def googlenet(*, pretrained: str, in_channels: int, weights_file: str = "") -> Backbone:
    """GoogLeNet cut where HDC attaches its heads: after inception_4a, inception_4d, pool5."""
    net = _torchvision("googlenet", pretrained, weights_file)
    stem = nn.Sequential(
        net.conv1, net.maxpool1, net.conv2, net.conv3, net.maxpool2,
        net.inception3a, net.inception3b, net.maxpool3, net.inception4a,
    )  # fmt: skip
    middle = nn.Sequential(net.inception4b, net.inception4c, net.inception4d)
    top = nn.Sequential(net.inception4e, net.maxpool4, net.inception5a, net.inception5b)
    # torchvision's ImageNet GoogLeNet (ported from TensorFlow) expects pixels scaled to
    # [-1, 1]: its forward() converts ImageNet-normalised input (transform_input, on with
    # those weights). The stages here bypass forward(), so normalise to [-1, 1] directly.
    norm = ((0.5,) * 3, (0.5,) * 3) if pretrained == "imagenet" else IMAGENET
    return Backbone([stem, middle, top], [512, 528, 1024], 3, *norm)


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


from harness import timm_backbone  # noqa: E402, F401  (registers "timm"; imports timm lazily)
