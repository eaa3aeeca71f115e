"""The regression check's numerics (issue 72): whether its runs are pinned
(harness.core.numerics), what that means for the baseline file, and how many seeds it runs.

- **pinned** (`--numerics auto`, the default, on an x86-64 processor with AVX2 and FMA, on the
  CPU): the runs go to worker processes under the pinned settings, so their numbers are the
  same on every such processor, Intel or AMD. A baseline written in the pinned mode is then
  checked exactly there (`same_numerics`), whatever the processor that wrote it; only a
  protocol whose frozen trunk runs on onnxruntime also needs the same MLAS level (AVX-512F or
  FMA3: onnxruntime cannot be held to one). `--update` writes baselines only in this mode.
- **native** (ARM, a GPU, or `--numerics native`): the libraries choose their own kernels, as
  before issue 72; a pinned baseline is compared statistically, with STATISTICAL_SEEDS check
  seeds instead of the protocol's 4, so that the bound on every method's MAP@R stays under
  the check's 0.05 (none "too noisy to guard").

A pinned check refuses a baseline written in another mode (native, or another version of the
pinned settings), naming the command that rewrites it: it could only pass statistically,
which would hide that the baseline is stale.
"""

from __future__ import annotations

from typing import Any

from harness.core import HarnessError, program_name, resolve_device
from harness.core.numerics import (
    NUMERICS,
    PINNED_VERSION,
    is_pinned,
    mlas_level,
    numerics_id,
    pinned_unavailable,
)
from harness.records import describe

# Check seeds where the comparison is statistical. Against the baseline's 20 seeds the widest
# MAP@R bound (supcon, seed spread 0.024; 261 rows) is 0.063 with 4 check seeds, 0.040 with
# 12 and 0.036 with 16: 16 leaves room for a machine whose seeds happen to spread more, so
# that no method is too noisy to guard (docs/reproducibility.md).
STATISTICAL_SEEDS = 16


def pinned_numerics(numerics: str, device: str) -> tuple[bool, str]:
    """(whether the runs are pinned, why not): `auto` pins wherever the pinned mode holds;
    `pinned` where it cannot hold is one line."""
    if numerics not in NUMERICS:
        raise HarnessError(f"--numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    if numerics == "native":
        return False, "--numerics native"
    why = pinned_unavailable(resolve_device(device).type)
    if why and numerics == "pinned":
        raise HarnessError(f"--numerics pinned cannot hold here: {why}")
    return not why, why


def refuse_update_unless_pinned(pinned: bool, why: str) -> None:
    """`--update` writes baselines only in the pinned mode: a native baseline would hold bit
    for bit on one processor type only."""
    if not pinned:
        raise HarnessError(
            f"--update writes baselines only in the pinned mode, and this check runs natively "
            f"({why}): run it on an x86-64 processor with AVX2 and FMA, on the CPU, with "
            "--numerics auto or pinned"
        )


def refuse_other_mode(baseline: dict[str, Any], path: Any, protocol: str, pinned: bool) -> None:
    """A pinned check against a baseline written in another mode is one line with the fix."""
    if not pinned or is_pinned(baseline.get("fingerprint")):
        return
    record = (baseline.get("fingerprint") or {}).get("numerics") or {}
    written = ("native numerics" if record.get("mode") != "pinned"
               else f"pinned numerics version {record.get('version')}")  # fmt: skip
    raise HarnessError(
        f"{path} was written in {written}, and this check runs in pinned numerics (version "
        f"{PINNED_VERSION}): rewrite it with `{program_name()} check --protocol {protocol} "
        "--update --reason TEXT`"
    )


def uses_onnxruntime(protocol: Any) -> bool:
    """Whether the protocol's frozen trunk runs on onnxruntime (which cannot be pinned)."""
    features = getattr(protocol, "features", None)
    return (
        bool(getattr(features, "cached", False))
        and getattr(features, "engine", "") == "onnxruntime"
    )


def expect_exact(baseline: dict[str, Any], pinned: bool, protocol: Any) -> bool:
    """Whether this check's runs should reproduce the baseline bit for bit: both pinned, and,
    for an onnxruntime trunk, the same MLAS level."""
    fp = baseline.get("fingerprint") or {}
    if not (pinned and is_pinned(fp)):
        return False
    return not uses_onnxruntime(protocol) or fp["numerics"].get("onnxruntime_mlas") == mlas_level()


def check_seeds(protocol_seeds: list[int], baseline_seeds: list[int], exact: bool) -> list[int]:
    """The protocol's check seeds where the check is exact; where it is statistical, up to
    STATISTICAL_SEEDS of the baseline's seeds (the protocol's first)."""
    seeds = list(protocol_seeds)
    if exact:
        return seeds
    extra = [s for s in baseline_seeds if s not in seeds]
    return sorted(seeds + extra[: max(0, STATISTICAL_SEEDS - len(seeds))])


def same_numerics(here: dict[str, Any], base: dict[str, Any], protocol: Any) -> bool:
    """Two pinned fingerprints that round alike (processors aside)."""
    ours = numerics_id(here, uses_onnxruntime(protocol))
    return ours is not None and ours == numerics_id(base, uses_onnxruntime(protocol))


def same_machine(here: dict[str, Any], base: dict[str, Any], protocol: Any) -> str:
    """Why two fingerprints give the same bits ('' when they need not): the same fingerprint,
    or pinned numerics on both machines (another processor)."""
    if here.get("id") == base.get("id"):
        return "same fingerprint"
    return "pinned numerics on both machines" if same_numerics(here, base, protocol) else ""


def machine(fp: dict[str, Any] | None) -> str:
    """describe(), plus the processor's vendor and family/model/stepping: the check names both
    machines, so that a pinned baseline confirmed on another processor says which."""
    fp = fp or {}
    where = "/".join(x for x in (fp.get("cpu_vendor"), fp.get("cpu_family_model_stepping")) if x)
    return describe(fp) + (f" ({where})" if where and not fp.get("gpu") else "")
