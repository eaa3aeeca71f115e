"""Backbones by name: the protocol's network, the same for every method of a seed.

`base` holds the contract (a Backbone returns one pooled feature per stage, so heads may
attach at several depths), the registry and the weights files; `convnets` registers the
small conv4 and torchvision's ResNets and GoogLeNet; `timm` any timm model (ViT, DINOv2,
ConvNeXt). Importing this package registers them all.
"""

from harness.backbones import convnets, efficientnet, timm  # noqa: F401  (registers them)
from harness.backbones.base import (
    BACKBONES,
    IMAGENET,
    Backbone,
    FrozenTrunkTail,
    build_backbone,
    check_frozen_stages,
    freeze_batchnorm,
    load_weights_file,
    starting_weights,
    trunk_outputs,
    weights_record,
    weights_sha256,
)

__all__ = [
    "BACKBONES",
    "IMAGENET",
    "Backbone",
    "FrozenTrunkTail",
    "build_backbone",
    "check_frozen_stages",
    "freeze_batchnorm",
    "load_weights_file",
    "starting_weights",
    "trunk_outputs",
    "weights_record",
    "weights_sha256",
]
