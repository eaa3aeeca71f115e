"""Machine fingerprint: what decides the float rounding of a run, so numbers made on one
processor are never compared bit for bit with numbers made on another.

Training is deterministic on one processor type, thread count and set of package versions,
but the kernels torch, oneDNN, MKL and OpenBLAS pick depend on the processor (AVX2 or
AVX-512, Intel or AMD), and training amplifies their different rounding into seed-noise-sized
differences of the trained metrics. The fingerprint names those choices; its `id` is a hash of
them. Two machines with the same id reproduce each other's numbers exactly; for any other pair
only a statistical comparison is meaningful (see harness/check/).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from functools import lru_cache
from importlib import metadata
from typing import Any

import torch

from harness.core.numerics import numerics_record

# Environment variables that change which kernels run (the ISA stand-ins included).
KERNEL_ENV = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "OPENBLAS_CORETYPE",
    "FAISS_SIMD_LEVEL",
)
# Package versions whose code computes the numbers.
NUMERIC_PACKAGES = ("torch", "numpy", "faiss-cpu", "faiss-gpu-cu12", "pytorch-metric-learning")
# Everything here except these enters the id (the core count does not change the rounding,
# the thread count does).
NOT_HASHED = ("id", "cpu_count")


@lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """vendor_id, model name, cpu family, model and stepping of the first processor (Linux);
    platform's answer elsewhere."""
    fields = {"vendor_id": "", "model name": "", "cpu family": "", "model": "", "stepping": ""}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                if key.strip() in fields:
                    fields[key.strip()] = value.strip()
    except OSError:
        fields["model name"] = platform.processor() or platform.machine()
    return fields


def _torch_build() -> dict[str, str]:
    """The BLAS and oneDNN builds torch was compiled with, read from torch's build summary."""
    show = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", show)
    mkl = re.search(r"Math Kernel Library Version ([\w.\-]+)", show)
    onednn = re.search(r"MKL-DNN (v[\w.]+)", show)
    return {
        "blas": (blas.group(1) if blas else "unknown") + (f" {mkl.group(1)}" if mkl else ""),
        "onednn": onednn.group(1) if onednn else "none",
    }


def _numpy_blas() -> str:
    """numpy's BLAS and the core type it dispatches to (evaluation uses numpy)."""
    try:
        import numpy  # noqa: F401
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown"
    # numpy's own library, not whichever BLAS another package (faiss, scipy) loaded first
    for info in threadpool_info():
        if info.get("user_api") == "blas" and "numpy" in str(info.get("filepath")):
            return f"{info.get('internal_api')} {info.get('version')} {info.get('architecture')}"
    return "unknown"


def package_versions(names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of those of `names` that are installed."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def machine_fingerprint(device: torch.device | str = "cpu") -> dict[str, Any]:
    """The processor, kernel choices, library builds and thread count of this process, and
    `id`, a 16-hex-digit hash of everything that decides float rounding."""
    device = torch.device(device)
    cpu = _cpuinfo()
    fp: dict[str, Any] = {
        "cpu_vendor": cpu["vendor_id"] or platform.machine(),
        "cpu_model": cpu["model name"] or platform.processor() or platform.machine(),
        "cpu_family_model_stepping": "/".join(cpu[k] for k in ("cpu family", "model", "stepping")),
        "torch_cpu_isa": torch.backends.cpu.get_cpu_capability(),
        **_torch_build(),
        "numpy_blas": _numpy_blas(),
        "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "device": device.type,
        "packages": package_versions(NUMERIC_PACKAGES),
    }
    if device.type == "cuda":
        fp["gpu"] = torch.cuda.get_device_name(device)
        fp["cuda"] = torch.version.cuda
    numerics = numerics_record(fp["torch_cpu_isa"])  # only in a pinned process (issue 72)
    if numerics is not None and device.type == "cpu":
        fp["numerics"] = numerics
    fp["id"] = fingerprint_id(fp)
    return fp


def fingerprint_id(fp: dict[str, Any]) -> str:
    """Hash of the rounding-relevant fields (not the core count, not the id itself)."""
    relevant = {k: v for k, v in fp.items() if k not in NOT_HASHED}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def describe(fp: dict[str, Any] | None) -> str:
    """One line for people: processor, ISA, threads and the id."""
    if not fp:
        return "unknown machine (recorded before fingerprints)"
    where = fp.get("gpu") or fp.get("cpu_model", "?")
    pinned = ", pinned numerics" if (fp.get("numerics") or {}).get("mode") == "pinned" else ""
    return (
        f"{where}{pinned}, {fp.get('torch_cpu_isa', '?')}, {fp.get('blas', '?')}, "
        f"{fp.get('torch_threads', '?')} thread(s) [fingerprint {fp.get('id', '?')}]"
    )
