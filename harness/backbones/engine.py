"""The engine that runs a frozen network forward: torch itself, or onnxruntime on the same
network exported to ONNX.

A frozen trunk only runs forward, and on a CPU onnxruntime runs EfficientNet-Lite0 about 4x
as fast as torch's fp32 (measured: tests/benchmarks/bench_embed.py, docs/cost.md), with
outputs within about 1e-5 of torch's. The network (uint8 images in, normalisation inside)
is exported once per weights and cached under the cache folder (`engines/`); before its
first use in a process, its outputs on a fixed batch are compared with torch's, and an
engine that differs by more than PARITY (relative to the largest output) is refused, so that
nothing is ever computed, cached or indexed by an engine that does not match the network.
onnxruntime's outputs do not depend on its thread count or batch size (tested), so threads
are a speed setting, recorded with the outputs but not part of what they are.

On a GPU the torch CUDA path stays the engine (`resolve_engine`): onnxruntime's CPU build
has nothing to add there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.core import HarnessError, default_cache_dir

log = logging.getLogger(__name__)

ENGINES = ("torch", "onnxruntime")
PARITY = 1e-4  # the largest |onnxruntime - torch| allowed, relative to the largest |torch|
OPSET = 18
_SESSIONS: dict[str, Any] = {}  # an exported file's checked session, per process


@dataclass
class Engine:
    """A frozen network's forward pass: uint8 [N, C, S, S] (CPU) -> float32 [N, D] (CPU)."""

    name: str
    version: str
    threads: int
    run: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)

    def provenance(self) -> dict[str, Any]:
        return {"engine": self.name, "version": self.version, "threads": self.threads}


def onnxruntime_module() -> Any:
    """onnxruntime, or one line saying how to install it."""
    try:
        import onnxruntime
    except ImportError:
        raise HarnessError("engine onnxruntime is not installed: pip install -r "
                           "requirements.lock (or use the torch engine)") from None  # fmt: skip
    return onnxruntime


def check_threads(threads: int | None) -> int:
    """The engine's thread count: `threads`, else torch's; below 1 is one line."""
    if threads is None:
        return torch.get_num_threads()
    if int(threads) < 1:
        raise HarnessError(f"an engine's thread count must be at least 1, got {threads}")
    return int(threads)


def resolve_engine(name: str, device: torch.device) -> str:
    """The engine a run uses: `name` on a CPU; torch on a GPU, whatever was asked."""
    if name not in ENGINES:
        raise HarnessError(f"unknown engine {name!r}: use one of {', '.join(ENGINES)}")
    if device.type != "cpu" and name != "torch":
        log.info("engine %s asked for on %s: the torch %s path runs instead", name,
                 device.type, device.type)  # fmt: skip
        return "torch"
    return name


def build_engine(
    network: torch.nn.Module, example: torch.Tensor, name: str, key: dict[str, Any],
    device: torch.device, threads: int | None = None,
) -> Engine:  # fmt: skip
    """The engine `name` for `network` (eval mode, uint8 images in). `key` names what the
    network is (weights sha256, its part, its input): the exported file is cached under it.
    `example` is a uint8 batch of the input's shape, for the export and the parity check."""
    threads = check_threads(threads)
    name = resolve_engine(name, device)
    if name == "torch":

        @torch.no_grad()
        def run_torch(images: torch.Tensor) -> torch.Tensor:
            return network(images.to(device)).float().cpu()

        return Engine("torch", str(torch.__version__), threads, run_torch)
    onnxruntime = onnxruntime_module()
    session = _session(network.cpu(), example.cpu(), key, threads, onnxruntime)

    def run_onnx(images: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(images.cpu().numpy())
        return torch.from_numpy(session.run(None, {"images": array})[0])

    return Engine("onnxruntime", str(onnxruntime.__version__), threads, run_onnx)


def _session(network: torch.nn.Module, example: torch.Tensor, key: dict[str, Any],
             threads: int, onnxruntime: Any) -> Any:  # fmt: skip
    """A checked onnxruntime session for the network, from the cached export when there is
    one (exported now otherwise)."""
    ident = dict(key, torch=str(torch.__version__), opset=OPSET)
    digest = hashlib.sha256(repr(sorted(ident.items())).encode()).hexdigest()[:16]
    path = default_cache_dir() / "engines" / f"network-{digest}.onnx"
    cached = _SESSIONS.get(f"{path}:{threads}")
    if cached is not None:
        return cached
    if not path.is_file():
        _export(network, example, path)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    try:
        session = onnxruntime.InferenceSession(str(path), options,
                                               providers=["CPUExecutionProvider"])  # fmt: skip
    except Exception as exc:  # a truncated or foreign file: exported again
        log.warning("cached engine %s cannot be read (%s): exporting it again", path, exc)
        path.unlink(missing_ok=True)
        _export(network, example, path)
        session = onnxruntime.InferenceSession(str(path), options,
                                               providers=["CPUExecutionProvider"])  # fmt: skip
    check_parity(network, session, example, path)
    _SESSIONS[f"{path}:{threads}"] = session
    return session


def check_parity(network: torch.nn.Module, session: Any, example: torch.Tensor,
                 path: Path) -> float:  # fmt: skip
    """onnxruntime against torch on `example`: the relative gap, or one line refusing it."""
    with torch.no_grad():
        expected = network(example).float().numpy()
    got = session.run(None, {"images": example.numpy()})[0]
    if got.shape != expected.shape:
        raise HarnessError(f"{path} gives outputs of shape {got.shape}, not the network's "
                           f"{expected.shape}: it is not this network's export; delete it")  # fmt: skip
    gap = float(np.abs(got - expected).max() / max(float(np.abs(expected).max()), 1e-12))
    if not gap <= PARITY:
        raise HarnessError(f"{path} differs from the network by {gap:.2e} of its largest "
                           f"output (at most {PARITY:g} allowed): it is not this network's "
                           "export, or onnxruntime computes it otherwise here; delete it, or "
                           "use the torch engine")  # fmt: skip
    log.debug("engine %s: within %.1e of torch", path, gap)
    return gap


def _export(network: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    """The network as ONNX with a free batch size, written atomically."""
    log.info("exporting the frozen network to ONNX for onnxruntime (once): %s", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".part")
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                network, (example,), input_names=["images"], output_names=["outputs"],
                dynamic_shapes=({0: torch.export.Dim("batch")},), opset_version=OPSET,
                dynamo=True, verbose=False,
            )  # fmt: skip
        Path(tmp).write_bytes(program.model_proto.SerializeToString())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
