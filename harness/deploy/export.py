"""`export`: a kept model as a file that embeds images with no harness installed, ONNX
(onnxruntime, any language it serves) or TorchScript (torch alone).

The exported network is harness.deploy.model.Embedder: uint8 RGB images [N, C, S, S], already
resized and cropped as the metadata's `preprocessing` says, in; float32 embeddings [N, D] out;
the normalisation inside. The batch size is free. The metadata (preprocessing, method,
provenance, the weights' sha256) travels inside the file: ONNX metadata_props key
`dml_harness`, TorchScript extra file `dml_harness.json`; both JSON.

Before the file is moved into place, its outputs are compared with the harness's own on a
fixed batch: an export that does not embed as the harness does is never written.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.core import HarnessError
from harness.deploy.model import LoadedModel

log = logging.getLogger(__name__)

FORMATS = ("onnx", "torchscript")
META_KEY = "dml_harness"  # ONNX metadata_props key; TorchScript extra file META_KEY.json
OPSET = 18
PARITY_COSINE = 1e-4  # the largest 1 - cosine allowed between the export and the harness


def metadata(model: LoadedModel) -> dict[str, Any]:
    """What an exported file says about itself (JSON-able)."""
    meta = {k: v for k, v in model.meta.items() if k not in ("backbone", "context")}
    meta["input"] = "images: uint8 [N, C, S, S], RGB, after `preprocessing` (resize, test ops)"
    meta["output"] = "embeddings: float32 [N, D]; rank by Euclidean distance, smaller is closer"
    return meta


def sample_batch(model: LoadedModel, n: int = 4, seed: int = 0) -> torch.Tensor:
    """A fixed uint8 batch of the model's input shape (the parity check's input)."""
    spec = model.preprocessing["input"]
    gen = torch.Generator().manual_seed(seed)
    shape = (n, int(spec["channels"]), int(spec["size"]), int(spec["size"]))
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)


def export_model(model: LoadedModel, fmt: str, out: Path) -> dict[str, Any]:
    """Write `model` to `out` as `fmt` (checked against the harness's embeddings first);
    returns the parity check's figures."""
    if fmt not in FORMATS:
        raise HarnessError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        embedder = model.embedder.cpu().eval()
        batch = sample_batch(model)
        with torch.no_grad():
            expected = embedder(batch).numpy()
        if fmt == "onnx":
            _onnx(model, batch, tmp)
        else:
            _torchscript(model, batch, tmp)
        parity = check_parity(expected, run_exported(tmp, fmt, batch.numpy()), fmt)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return parity


def _onnx(model: LoadedModel, batch: torch.Tensor, path: Path) -> None:
    try:
        import onnx
        import onnxruntime  # noqa: F401  (the parity check runs the file)
        import onnxscript  # noqa: F401  (torch's exporter)
    except ImportError as exc:
        raise HarnessError(f"--format onnx needs {exc.name}: pip install -r requirements.lock "
                           "(or the export extra: pip install '.[export]'); --format "
                           "torchscript needs nothing more") from None  # fmt: skip

    program = torch.onnx.export(
        model.embedder, (batch,), input_names=["images"], output_names=["embeddings"],
        dynamic_shapes={"images": {0: torch.export.Dim("batch")}}, opset_version=OPSET,
        dynamo=True, verbose=False,
    )  # fmt: skip
    proto = program.model_proto
    del proto.metadata_props[:]
    entry = proto.metadata_props.add()
    entry.key, entry.value = META_KEY, json.dumps(metadata(model), sort_keys=True)
    onnx.save(proto, str(path))


def _torchscript(model: LoadedModel, batch: torch.Tensor, path: Path) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        # torch marks TorchScript deprecated, and the trace fixes the input's channel count
        # (the network's own): neither is the user's to act on
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model.embedder, (batch,), check_trace=False)
        extra = {f"{META_KEY}.json": json.dumps(metadata(model), sort_keys=True)}
        torch.jit.save(traced, str(path), _extra_files=extra)


def run_exported(path: Path, fmt: str, images: np.ndarray) -> np.ndarray:
    """Embed uint8 `images` with an exported file, as a user without the harness would."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return np.asarray(session.run(None, {"images": images})[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.jit.load(str(path), map_location="cpu")
    with torch.no_grad():
        return module(torch.from_numpy(images)).numpy()


def read_metadata(path: Path, fmt: str) -> dict[str, Any]:
    """The metadata an exported file carries."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return json.loads(session.get_modelmeta().custom_metadata_map[META_KEY])
    extra = {f"{META_KEY}.json": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    return json.loads(extra[f"{META_KEY}.json"])


def cosine_gap(a: np.ndarray, b: np.ndarray) -> float:
    """The largest 1 - cosine between matching rows of a and b."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)
    return float((1 - cos).max())


def check_parity(expected: np.ndarray, got: np.ndarray, fmt: str) -> dict[str, Any]:
    """The export's embeddings against the harness's; a HarnessError if they differ."""
    if got.shape != expected.shape:
        raise HarnessError(f"the {fmt} export returns {got.shape}, the harness {expected.shape}"
                           "; nothing written")  # fmt: skip
    gap = cosine_gap(expected, got)
    if not gap <= PARITY_COSINE:
        raise HarnessError(f"the {fmt} export embeds differently from the harness (1 - cosine "
                           f"{gap:.2e} > {PARITY_COSINE:g}); nothing written")  # fmt: skip
    return {"rows": len(got), "max_one_minus_cosine": gap,
            "max_abs_difference": float(np.abs(expected - got).max())}  # fmt: skip
