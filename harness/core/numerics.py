"""Pinned numerics: settings under which the regression check's runs round alike on every
x86-64 processor with AVX2 and FMA, Intel or AMD, so that its baselines hold bit for bit there.

Math libraries choose their code paths by processor: torch's own kernels (ATen) by instruction
set, oneDNN by instruction set, MKL by instruction set *and vendor* (on an AMD processor it
takes other paths than on an Intel one of the same instruction set), OpenBLAS (numpy, faiss)
by core type. Training amplifies their different rounding into seed-noise-sized differences
of the metrics, so without these settings a baseline holds bit for bit only on the processor
type that made it (issue 72). The pinned mode holds each library to one path:

- ATen to its AVX2 kernels (`ATEN_CPU_CAPABILITY=avx2`), oneDNN to AVX2
  (`ONEDNN_MAX_CPU_ISA`), OpenBLAS to its Haswell kernels (`OPENBLAS_CORETYPE`), faiss to
  AVX2 (`FAISS_SIMD_LEVEL`): these dispatch by instruction set only, so an AVX2 path is the
  same code on every processor that has AVX2;
- MKL to its conditional-numerical-reproducibility branch COMPATIBLE (`MKL_CBWR`): SSE2 code
  without the approximate rcpps/rsqrtps instructions, the one branch Intel documents as giving
  the same results on Intel and non-Intel processors (its AVX2 branch is for Intel processors
  only: elsewhere MKL falls back to its automatic choice);
- every other kernel-selecting variable (`MKL_ENABLE_INSTRUCTIONS`, ...) removed, so an ISA
  stand-in set around the check changes nothing: the pinned mode overrides it.

Measured with tests/benchmarks/pinned_numerics.py (docs/reproducibility.md has the table):
under these settings the metrics are identical bit for bit under every ISA stand-in, while
without them every stand-in changes them. They must be in the environment before torch
loads, so they apply to fresh worker processes (harness.sweep.engines starts them with
`pinned_environ`), never to the process that is already running.

One part cannot be pinned: onnxruntime (the photo protocols' frozen-trunk engine) picks its
MLAS kernels from the processor's feature bits (AVX-512F, else FMA3) with no setting to hold
them, so its outputs are the same on two processors of one MLAS level, whatever the vendor,
and differ between levels. `mlas_level` names it; a protocol that runs its trunk on
onnxruntime compares exactly only with a baseline of the same level.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

# Bumped whenever PINNED_ENV changes: a baseline of another version is another mode.
PINNED_VERSION = 1
# Set in a pinned worker's environment; the fingerprint records the mode from it.
MODE_VAR = "DML_HARNESS_NUMERICS"
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "COMPATIBLE",
    "OPENBLAS_CORETYPE": "Haswell",
    "FAISS_SIMD_LEVEL": "AVX2",
}
# Kernel-selecting variables the pinned mode removes (a stand-in's, say).
PINNED_UNSET = ("MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "FAISS_OPT_LEVEL")
# The fingerprint fields that name the processor itself: the pinned mode makes them irrelevant.
MACHINE_KEYS = ("cpu_vendor", "cpu_model", "cpu_family_model_stepping", "cpu_count", "id")
NUMERICS = ("auto", "pinned", "native")


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The first processor's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def mlas_level(flags: frozenset[str] | None = None) -> str:
    """The kernels onnxruntime's MLAS takes on this processor (it reads the feature bits, not
    the vendor): AVX512F, FMA3 (AVX2 and FMA), AVX or SSE2."""
    flags = cpu_flags() if flags is None else flags
    if "avx512f" in flags:
        return "AVX512F"
    if {"avx2", "fma"} <= flags:
        return "FMA3"
    return "AVX" if "avx" in flags else "SSE2"


def pinned_unavailable(device_type: str = "cpu") -> str:
    """Why the pinned mode cannot hold here ('' when it can): it needs an x86-64 processor with
    AVX2 and FMA, torch built with MKL, and the CPU as the device."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"the processor is {machine}, not x86-64"
    if device_type != "cpu":
        return f"the runs are on {device_type}, not on the CPU"
    if not {"avx2", "fma"} <= cpu_flags():
        return "the processor lacks AVX2 or FMA"
    import torch

    if not torch.backends.mkl.is_available():
        return "torch is built without MKL"
    return ""


@contextlib.contextmanager
def pinned_environ() -> Iterator[None]:
    """os.environ with the pinned settings (and none of PINNED_UNSET) while the block runs,
    for the worker processes started in it; restored afterwards."""
    saved = {k: os.environ.get(k) for k in (*PINNED_ENV, *PINNED_UNSET, MODE_VAR)}
    for key in PINNED_UNSET:
        os.environ.pop(key, None)
    os.environ.update(PINNED_ENV)
    os.environ[MODE_VAR] = f"pinned-{PINNED_VERSION}"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def numerics_record(torch_isa: str) -> dict[str, Any] | None:
    """What a fingerprint records of a pinned process (None in a native one): the mode, its
    version, whether it holds (the settings are all in place and torch took the AVX2
    kernels) and onnxruntime's MLAS level."""
    if os.environ.get(MODE_VAR) != f"pinned-{PINNED_VERSION}":
        return None
    in_place = all(os.environ.get(k) == v for k, v in PINNED_ENV.items()) and not any(
        k in os.environ for k in PINNED_UNSET
    )
    return {"mode": "pinned", "version": PINNED_VERSION,
            "holds": in_place and torch_isa == "AVX2", "onnxruntime_mlas": mlas_level()}  # fmt: skip


def is_pinned(fp: dict[str, Any] | None) -> bool:
    """Whether a fingerprint was made under the pinned mode of this version, and it held."""
    record = (fp or {}).get("numerics") or {}
    return (record.get("mode") == "pinned" and record.get("version") == PINNED_VERSION
            and bool(record.get("holds")))  # fmt: skip


def numerics_id(fp: dict[str, Any] | None, uses_onnxruntime: bool = False) -> str | None:
    """For a pinned fingerprint, a hash of what decides its rounding apart from the processor
    (kernels, builds, versions, threads, device): two machines of one numerics id give the same
    bits. onnxruntime's MLAS level counts only where the runs use onnxruntime. None when the
    fingerprint is not pinned."""
    if not is_pinned(fp):
        return None
    assert fp is not None
    rest = {k: v for k, v in fp.items() if k not in MACHINE_KEYS}
    record = dict(rest["numerics"])
    if not uses_onnxruntime:
        record.pop("onnxruntime_mlas", None)
    rest["numerics"] = record
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:16]
