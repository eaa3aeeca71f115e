"""A stand-in for another processor: environment variables that make torch and oneDNN take
other kernels than this process does, whatever this process was started with (the whole suite
may itself run under a stand-in)."""

from __future__ import annotations

import os

import torch

STAND_IN_KEYS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def other_kernels_env() -> dict[str, str]:
    """os.environ for a subprocess whose fingerprint differs from this process's (and from a
    plain process's): AVX2 kernels, or the default (non-vector) ones where this process
    already runs on AVX2 or less."""
    env = {k: v for k, v in os.environ.items() if k not in STAND_IN_KEYS}
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return {**env, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    return {**env, "ATEN_CPU_CAPABILITY": "default"}


def plain_env() -> dict[str, str]:
    """os.environ without the stand-in's variables."""
    return {k: v for k, v in os.environ.items() if k not in STAND_IN_KEYS}
