"""The checks of a protocol that need no data on disk, in one place: `run` makes them before
its first run (runner.plan) and `validate` makes them alone, so that a protocol `validate`
passes is never rejected by `run` for a name, a parameter or a hyperparameter. What needs the
data (class counts against the sampler, files on disk) is left to the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from harness.backbones import BACKBONES, build_backbone, check_frozen_stages
from harness.core import (
    METHODS,
    HarnessError,
    Protocol,
    closest,
    keyword_names,
    protocol_hyperparameters,
    registered,
)
from harness.data import check_dataset

# build_backbone's own arguments, never backbone.params
_BACKBONE_ARGS = ("pretrained", "in_channels", "weights_file")


def check_backbone(protocol: Protocol) -> None:
    """backbone.name is registered and backbone.params names only its builder's arguments
    (a builder with **kwargs, such as timm's, checks its own when it builds)."""
    spec = protocol.backbone
    builder = registered(BACKBONES.get, spec.name, f"{protocol.path}: backbone.name")
    allowed = keyword_names(builder, _BACKBONE_ARGS)
    for param in spec.params:
        if allowed is not None and param not in allowed:
            raise HarnessError(
                f"{protocol.path}: bad backbone.params: backbone {spec.name} has no parameter "
                f"{param!r}{closest(param, allowed)}; it takes: {', '.join(allowed) or 'none'}"
            )
    if protocol.features.cached:  # the stage count of the network, built without weights
        bare = dataclasses.replace(spec, pretrained="none", weights_file="")
        stages = len(build_backbone(bare, 3).stages)
        try:
            check_frozen_stages(protocol.features.frozen_stages, stages)
        except HarnessError as exc:
            raise HarnessError(f"{protocol.path}: {exc}") from None


def check_methods(protocol: Protocol, names: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Every method in the protocol's `methods:` is registered and its overrides are its
    hyperparameters, of their types; returns the resolved hyperparameters of `names` (the
    methods a run asks for; an unknown one is an error)."""
    for name in protocol.methods:
        if name not in METHODS:
            raise HarnessError(
                f"{protocol.path}: methods: unknown method {name!r}{closest(name, METHODS.names())}"
            )
        protocol_hyperparameters(protocol, name)
    return {name: protocol_hyperparameters(protocol, name) for name in names}


def check_protocol(protocol: Protocol, methods: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """All of the above, methods registered (import `methods` first); returns the resolved
    hyperparameters of `methods`, as check_methods."""
    check_dataset(protocol)
    check_backbone(protocol)
    return check_methods(protocol, methods)
