"""`backbone: {name: timm, params: {model: NAME}}`: any timm model as the backbone, e.g. ViT-S/16
with DINO weights (`vit_small_patch16_224.dino`, 384-d), DINOv2, ConvNeXt or timm's ResNet-50.

Stages, so heads can attach at several depths (HDC's cascade) on a ViT too: `stages` S
(default 3) gives S - 1 intermediate outputs at evenly spaced depths of the model's
feature_info (a ViT's blocks, a CNN's stages), each averaged over its spatial positions
(timm's forward_intermediates, NCHW), then the model's own pooled output (pre-logits: the
[CLS] token of a ViT, the average pool of a CNN), whose width is the last stage's.

Weights: `pretrained: imagenet` loads the model's own pretrained weights (the name's tag:
`.dino`, `.augreg_in21k`, ...), downloaded once by timm from the Hugging Face hub (which
needs the internet); `--weights FILE` / `backbone.weights_file` loads a local file instead
(a state_dict saved with torch.save, or .safetensors), for machines without it. Any other
params (e.g. img_size: 32 for a ViT at another input size) go to timm.create_model.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.backbones.base import BACKBONES, IMAGENET, Backbone
from harness.core import HarnessError, closest


class TimmBackbone(Backbone):
    """A timm model whose forward returns S pooled features, shallowest first."""

    def __init__(self, net: nn.Module, stages: int) -> None:
        info = list(getattr(net, "feature_info", []) or [])
        if stages < 1 or stages - 1 > len(info):
            raise HarnessError(f"backbone timm: stages must be 1..{len(info) + 1} for this "
                               f"model, got {stages}")  # fmt: skip
        picks: list[int] = []
        for k in range(1, stages):  # evenly spaced, distinct even when stages - 1 == len(info)
            picks.append(max(round(len(info) * k / stages) - 1, picks[-1] + 1 if picks else 0))
        dims = [int(info[i]["num_chs"]) for i in picks] + [int(net.num_features)]
        cfg = getattr(net, "pretrained_cfg", None) or {}
        mean = tuple(cfg.get("mean", IMAGENET[0]))
        std = tuple(cfg.get("std", IMAGENET[1]))
        super().__init__([net], dims, 3, mean, std)
        self.picks = picks

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        net = self.stages[0]
        if not self.picks:
            return [net.forward_head(net.forward_features(x), pre_logits=True)]
        final, inter = net.forward_intermediates(x, indices=self.picks, output_fmt="NCHW")
        return [t.mean((-2, -1)) for t in inter] + [net.forward_head(final, pre_logits=True)]


def _timm() -> Any:
    try:
        import timm
    except ImportError:
        raise HarnessError("backbone timm needs the timm package: pip install -r "
                           "requirements.lock (or pip install timm)") from None  # fmt: skip
    return timm


@BACKBONES.register("timm")
def timm_backbone(
    *, pretrained: str, in_channels: int, model: str = "", stages: int = 3,
    weights_file: str = "", **options: Any,
) -> Backbone:  # fmt: skip
    """A timm model by name (see the module docstring)."""
    timm = _timm()
    if not model:
        raise HarnessError("backbone timm needs params.model, a timm model name such as "
                           "vit_small_patch16_224.dino (timm.list_models(pretrained=True))")  # fmt: skip
    if not timm.is_model(model):
        raise HarnessError(f"backbone timm: unknown model {model!r}"
                           f"{closest(model, timm.list_models(model.split('_')[0] + '*'))}")  # fmt: skip
    kwargs: dict[str, Any] = {"num_classes": 0, **options}
    if weights_file:
        if not Path(weights_file).is_file():
            raise HarnessError(f"weights file {weights_file} does not exist (from --weights or "
                               "weights_file)")  # fmt: skip
        kwargs.update(pretrained=True, pretrained_cfg_overlay={"file": weights_file})
    elif pretrained == "imagenet":
        kwargs["pretrained"] = True
    source = f"weights file {weights_file}" if weights_file else "the pretrained weights"
    try:
        with _incomplete_loads() as incomplete:
            net = timm.create_model(model, **kwargs)
    except TypeError as exc:
        raise HarnessError(f"backbone timm: bad backbone.params for {model} ({exc})") from None
    except Exception as exc:  # a failed download; a damaged, foreign or unpicklable file
        hint = ("it must be a state_dict (torch.save) or .safetensors of this model" if
                weights_file else "without the internet, pass `--weights FILE` (a state_dict "
                "or .safetensors of this model)")  # fmt: skip
        raise HarnessError(f"backbone timm: cannot load {source} of {model} "
                           f"({type(exc).__name__}: {_first_line(exc)}); {hint}") from None  # fmt: skip
    if incomplete:
        raise HarnessError(f"backbone timm: {source} does not fit {model}: {incomplete[0]}")
    return TimmBackbone(net, stages)


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""


@contextmanager
def _incomplete_loads() -> Iterator[list[str]]:
    """Collect timm's reports of pretrained weights that did not cover the model. timm loads
    non-strictly whenever it drops the classifier (num_classes 0 here, so for most models)
    and says what was missing only in its log: caught here, so that a wrong file is an error
    instead of a silently random backbone."""
    found: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith(("Missing keys", "Unexpected keys", "Unable to convert")):
                found.append(message.split(" discovered")[0].split(" found")[0][:300])

    log, handler = logging.getLogger("timm.models._builder"), Catch(logging.INFO)
    level, propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = False  # the error below says it once
    log.addHandler(handler)
    try:
        yield found
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
