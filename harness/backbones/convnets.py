"""The convolutional backbones: the small conv4 of the default protocol, and torchvision's
ResNet-18/50/101 and GoogLeNet (BN-Inception's stand-in in the paper protocols)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from harness.backbones.base import BACKBONES, IMAGENET, Backbone, load_weights_file
from harness.core import HarnessError


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
