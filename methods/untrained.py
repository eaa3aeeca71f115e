"""The backbone's features with no training (the "GoogLeNet pool5" baseline row of HDC)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness import Embedded, Method, MethodContext, register_method


class BackboneFeatures(nn.Module):
    """The last stage's pooled features as they are: nothing to learn."""

    def __init__(self, normalize: bool) -> None:
        super().__init__()
        self.normalize = normalize

    def forward(self, features: list[torch.Tensor]) -> Embedded:
        x = features[-1]
        return Embedded(F.normalize(x, dim=1) if self.normalize else x)


@register_method("untrained", family="none", version=1, paper="hdc_iccv2017")
def build(ctx: MethodContext, *, normalize: bool = False) -> Method:
    return Method(head=BackboneFeatures(normalize))
