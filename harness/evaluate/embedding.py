"""Embed images with a trained model: the retrieval embeddings (and a cascade's sub-embeddings)
in eval mode, in the protocol's precision, checked to be finite.
"""

from __future__ import annotations

import torch

from harness.backbones import Backbone
from harness.core import HarnessError, Method, TrainingFailed, autocast


def embed(
    backbone: Backbone, method: Method, images: torch.Tensor, device: torch.device,
    batch_size: int, precision: str = "fp32",
) -> torch.Tensor:  # fmt: skip
    """Retrieval embeddings [N, D] (float32, on `device`) in eval mode."""
    return embed_parts(backbone, method, images, device, batch_size, precision)[0]


@torch.no_grad()
def embed_parts(
    backbone: Backbone, method: Method, images: torch.Tensor, device: torch.device,
    batch_size: int, precision: str = "fp32",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """The retrieval embeddings and the method's `sub_embeddings` extras (float32), in eval
    mode, the backbone and head computing in `precision` as in training."""
    backbone.eval()
    method.head.eval()
    chunks: list[torch.Tensor] = []
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in method.sub_embeddings}
    for start in range(0, len(images), batch_size):
        x = backbone.prepare(images[start : start + batch_size].to(device, non_blocking=True))
        with autocast(device, precision):
            out = method.head(backbone(x))
        chunks.append(out.embedding.float())
        for name, part in parts.items():
            if name not in out.extras:
                raise HarnessError(f"the method's head returns no extra {name!r} named in its "
                                   f"sub_embeddings; it returns {sorted(out.extras)}")  # fmt: skip
            part.append(out.extras[name].float())
    embeddings = torch.cat(chunks)
    bad = int((~torch.isfinite(embeddings)).any(dim=1).sum())
    if bad:  # the model, not the user's input: the run fails and a sweep goes on
        raise TrainingFailed(f"the model's embeddings contain NaN or inf for {bad} of "
                             f"{len(embeddings)} images (e.g. overflow in low precision)")  # fmt: skip
    return embeddings, {name: torch.cat(part) for name, part in parts.items()}
