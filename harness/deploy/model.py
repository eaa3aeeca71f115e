"""A trained embedding network kept for use (`run --save-model`): the whole network that embeds
raw photos, its preprocessing and its provenance, in one file beside the run's result.

Under a frozen, cached trunk (protocol `features:`) a run trains only the stages after the
trunk and the head, on the trunk's cached outputs; the kept network is the whole backbone
again: the frozen trunk's ImageNet weights with the trained tail and head, so that it embeds
photos, not cached features. The file is a torch.save of plain data (tensors, strings,
numbers), read back with `weights_only=True`: loading it never runs code. Its weights' sha256
(`weights_sha256`) is over the tensors themselves, so an index (harness.deploy.catalogue)
knows the model it was made with whatever file holds it.

A plugin method's model records the plugin (`method.source`: its file's path and sha256, as
the run's result does). The file names the plugin but never loads it: the commands that
rebuild the method take the same `--plugin`, and a plugin whose source changed since the
model was kept is refused (the network it builds might not be the one trained).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.backbones import Backbone, FrozenTrunkTail, build_backbone
from harness.core import (
    METHODS,
    BackboneSpec,
    HarnessError,
    MethodContext,
    Protocol,
    describe_source,
    load_methods,
    program_name,
)
from harness.records import write_bytes_atomic

FORMAT = "dml-harness embedding model"
VERSION = 1


class Embedder(nn.Module):
    """The network a kept model is: uint8 RGB images [N, C, S, S] (after the preprocessing's
    resize and test crop) -> the retrieval embeddings [N, D], float32. The normalisation
    (scale to [0, 1], ImageNet mean and std) is inside, as in training."""

    def __init__(self, backbone: Backbone, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(self.backbone.prepare(images))).embedding.float()


@dataclass
class KeptModel:
    """What the model file holds: `meta` (plain data: format, backbone, method, context,
    preprocessing, provenance, weights_sha256) and the tensors (`backbone.*`, `head.*`)."""

    meta: dict[str, Any]
    state: dict[str, torch.Tensor]

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        torch.save({"meta": self.meta, "state": self.state}, buffer)
        return buffer.getvalue()


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """The sha256 of the tensors (names, dtypes, shapes and values, in name order)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def preprocessing(protocol: Protocol, backbone: Backbone) -> dict[str, Any]:
    """How a photo becomes the network's input, as the run's evaluation made it: turned
    upright by its EXIF orientation tag, decoded to the RGB a viewer shows
    (harness.data.photo_decode), resized to load_size x load_size (PIL bilinear, aspect not
    kept; 0: its own size), then the protocol's test ops (e.g. center_crop 224); uint8,
    NCHW. The mean and std are applied inside the network and recorded for reference."""
    ops = [{k: v for k, v in dataclasses.asdict(op).items() if k in ("op", "size")}
           | ({"interpolation": op.interpolation} if op.op.startswith("resize") else {})
           for op in protocol.augmentation.test]  # fmt: skip
    return {
        "exif_transpose": True,
        "decode": "PIL: first turned upright by the EXIF orientation tag (ImageOps."
        "exif_transpose), then RGB: 16-bit images by their high byte, transparency "
        "composited on white, other modes by PIL's convert('RGB')",
        "load_size": protocol.load_size,
        "resize": "PIL bilinear to load_size x load_size, aspect not kept (0: not resized)",
        "test_ops": ops,
        "input": {
            "dtype": "uint8",
            "layout": "NCHW",
            "channels": backbone.in_channels,
            "size": protocol.backbone.input_size,
        },  # fmt: skip
        "inside_the_network": {
            "scale": "1/255",
            "mean": backbone.mean.flatten().tolist(),
            "std": backbone.std.flatten().tolist(),
        },  # fmt: skip
    }


def whole_backbone(
    protocol: Protocol, backbone: Backbone, weights: str | None, in_channels: int
) -> Backbone:
    """The backbone that embeds photos: `backbone` itself, or, for the stages after a frozen
    trunk, the protocol's whole backbone (its starting weights) with the trained tail's
    stages loaded into it."""
    if not isinstance(backbone, FrozenTrunkTail):
        return backbone
    spec = protocol.backbone
    if weights:
        spec = dataclasses.replace(spec, weights_file=weights)
    whole = build_backbone(spec, in_channels)
    for i, stage in enumerate(backbone.stages):
        whole.stages[backbone.frozen_stages + i].load_state_dict(stage.state_dict())
    return whole.to(backbone.mean.device)


def keep_model(
    protocol: Protocol, backbone: Backbone, head: nn.Module, *, in_channels: int,
    weights: str | None, meta: dict[str, Any],
) -> KeptModel:  # fmt: skip
    """A finished run's network as a KeptModel; `meta` holds the method (name, version,
    hyperparameters), its MethodContext fields and the run's provenance."""
    whole = whole_backbone(protocol, backbone, weights, in_channels)
    state = {f"backbone.{k}": v.detach().cpu().contiguous().clone()
             for k, v in whole.state_dict().items()}  # fmt: skip
    state |= {f"head.{k}": v.detach().cpu().contiguous().clone()
              for k, v in head.state_dict().items()}  # fmt: skip
    spec = dataclasses.asdict(protocol.backbone) | {"pretrained": "none", "weights_file": ""}
    full = {"format": FORMAT, "version": VERSION, "backbone": spec, "in_channels": in_channels,
            "embedding_dim": protocol.embedding_dim,
            "preprocessing": preprocessing(protocol, whole), **meta,
            "weights_sha256": state_sha256(state)}  # fmt: skip
    return KeptModel(full, state)


def write_model(path: Path, kept: KeptModel) -> dict[str, Any]:
    """Write the model file atomically; returns what the run's result records of it."""
    data = kept.to_bytes()
    write_bytes_atomic(path, data)
    return {"file": path.name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
            "weights_sha256": kept.meta["weights_sha256"]}  # fmt: skip


@dataclass
class LoadedModel:
    """A model file read back: the network (eval mode, on the CPU) and its meta."""

    embedder: Embedder
    meta: dict[str, Any]
    path: Path

    @property
    def weights_sha256(self) -> str:
        return str(self.meta["weights_sha256"])

    @property
    def preprocessing(self) -> dict[str, Any]:
        return dict(self.meta["preprocessing"])


def read_model(path: Path) -> KeptModel:
    """The model file at `path`, checked: ours, complete and its tensors as recorded."""
    not_ours = f"{path} is not a model saved by `run --save-model`"
    if not path.is_file():
        raise HarnessError(f"model file {path} does not exist; save one with `{program_name()} "
                           "run --method NAME --save-model` (it is written beside the run's "
                           "seed<k>.json)")  # fmt: skip
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated zip, a pickle of other objects, a text file
        raise HarnessError(f"{not_ours}, or it is truncated ({type(exc).__name__}); save it "
                           f"again with `{program_name()} run --method NAME --save-model "
                           "--force`") from None  # fmt: skip
    meta = data.get("meta") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise HarnessError(f"{not_ours} (no `{FORMAT}` header)")
    if meta.get("version") != VERSION:
        raise HarnessError(f"{path} is a format-{meta.get('version')} model; this harness "
                           f"reads format {VERSION}: save it again with this version")  # fmt: skip
    state = data.get("state")
    if not isinstance(state, dict) or state_sha256(state) != meta.get("weights_sha256"):
        raise HarnessError(f"{path}: its tensors do not match the sha256 it records (damaged "
                           f"file); save it again with `{program_name()} run --method "
                           f"{meta.get('method', {}).get('name', 'NAME')} --save-model --force`")  # fmt: skip
    return KeptModel(meta, state)


def load_model(path: Path | str) -> LoadedModel:
    """The network of a model file (checked as read_model does), rebuilt and loaded."""
    path = Path(path)
    kept = read_model(path)
    meta = kept.meta
    load_methods()
    method_spec = METHODS.get(_rebuildable(meta, path))
    context = MethodContext(
        **{**meta["context"], "stage_dims": tuple(meta["context"]["stage_dims"])}
    )
    method = method_spec.build(context, **meta["method"]["hyperparameters"])
    backbone = build_backbone(BackboneSpec(**meta["backbone"]), int(meta["in_channels"]))
    for prefix, module in (("backbone.", backbone), ("head.", method.head)):
        part = {k[len(prefix) :]: v for k, v in kept.state.items() if k.startswith(prefix)}
        try:
            module.load_state_dict(part, strict=True)
        except RuntimeError as exc:
            raise HarnessError(f"{path}: its {prefix[:-1]} does not fit {meta['method']['name']}"
                               f" ({str(exc).splitlines()[0]})") from None  # fmt: skip
    embedder = Embedder(backbone, method.head).eval()
    return LoadedModel(embedder, meta, path)


def _plugin_option(source: dict[str, str]) -> str:
    """The `--plugin` that loads a recorded plugin source: its module's name or file's path."""
    return f"--plugin {source.get('module') or source['path']}"


def _rebuildable(meta: dict[str, Any], path: Path) -> str:
    """The kept model's method name, once its code is the code it was kept with: a plugin's
    method must be loaded (`--plugin`, as `run` had it; a model file names its plugin but never
    runs it), and a plugin whose source changed since is refused (its network might not be the
    one trained). Models kept before sources were recorded are not checked."""
    method = meta["method"]
    name = str(method["name"])
    if "source" not in method:
        return name
    kept = method["source"]
    if name not in METHODS and kept and ("plugin" in kept or "distribution" in kept):
        way = (f"pass {_plugin_option(kept)}" if "plugin" in kept
               else f"install {kept['distribution']} {kept['version']}")  # fmt: skip
        raise HarnessError(f"{path} was kept from method {name!r} of {describe_source(kept)}, "
                           f"which is not loaded: {way}")  # fmt: skip
    now = METHODS.get(name).source if name in METHODS else None
    if name in METHODS and _identity(now) != _identity(kept):
        raise HarnessError(_changed(path, meta, now))
    return name


def _identity(source: dict[str, str] | None) -> dict[str, str] | None:
    """What makes two sources the same code: a file's sha256, a distribution's version; not
    where the file lies (as harness.records' MethodInfo.source_identity)."""
    return None if source is None else {k: v for k, v in source.items() if k != "path"}


def _changed(path: Path, meta: dict[str, Any], now: dict | None) -> str:
    """One line: what changed in the method's source since the model was kept (a plugin's
    sha256, a distribution's version), and what to do: restore it, or keep the model again."""
    name, kept = meta["method"]["name"], meta["method"]["source"]
    what = describe_source(now)
    for key in ("sha256", "version"):
        if kept and now and kept.get(key) and now.get(key):
            then, here = str(kept[key])[:12], str(now[key])[:12]
            what += f" changed since the model was kept ({key} {then} then, {here} now)"
            break
    else:
        what = f"method {name!r} was kept from {describe_source(kept)}, but is now {what}"
    plugin = f" {_plugin_option(now)}" if now and "plugin" in now else ""
    return (f"{path}: {what}, so {name!r} might not rebuild the network that was trained; "
            f"restore it as it was, or keep the model again with `{_rerun(meta)}{plugin} "
            "--save-model --force`")  # fmt: skip


def _rerun(meta: dict[str, Any]) -> str:
    """`run` of the kept model's method, protocol and seed (the protocol by name where that
    name loads the protocol the model was kept under, else PROTOCOL for its YAML file)."""
    from harness.core import load_protocol

    kept = meta.get("provenance", {}).get("protocol", {})
    try:
        same = load_protocol(kept.get("name", "")).hash == kept.get("hash")
    except HarnessError:
        same = False
    protocol = kept.get("name") if same else "PROTOCOL.yaml"
    seed = meta.get("provenance", {}).get("seed")
    seeds = f" --seeds {seed}" if seed is not None else ""
    return f"{program_name()} run --protocol {protocol} --method {meta['method']['name']}{seeds}"
