"""The growth exponent b of cost ~ a * m^b, and the complexity class it supports (or not).

Counts are exact and fitted on every batch size. A time is fixed + a * m^b: every call pays
a fixed cost (Python dispatch, kernel launches, small allocations) that dominates at small m
and bends the log-log line flat there. So a time is fitted only on the sizes where it is at
least FIXED_MULTIPLE times the fixed cost, and the fixed cost is taken off first (`fit_time`):
the exponent is that of the part that grows with m. The fixed cost is the method's call on
its smallest batch (scaling.measure_fixed_cost), else, in records made before it was
measured, the time at the smallest size measured; on a shared machine a disturbed call is
caught by the growth itself (no call is faster than the fixed cost, and none slower than a
larger batch's: see fit_time).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

FIXED_MULTIPLE = 5.0  # a time is fitted where it is at least this many times the fixed cost
MIN_FIT_SIZES = 3  # fewer sizes than this name no class

# Complexity classes and the rule that names one (see fit_power_law).
R2_MIN = 0.98
RMS_MAX = 0.05
TOLERANCE = 0.15
MARGIN = 0.05
COMPLEXITIES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "O(1)": lambda m: np.ones_like(m),
    "O(m)": lambda m: m,
    "O(m log m)": lambda m: m * np.log2(m),
    "O(m^2)": lambda m: m**2,
    "O(m^3)": lambda m: m**3,  # e.g. enumerating every (anchor, positive, negative) of a batch
}


@dataclass(frozen=True)
class PowerFit:
    """cost ~ coefficient * m^exponent, fitted by least squares on log-log."""

    exponent: float | None
    coefficient: float | None
    r2: float | None
    rms: float | None  # root mean square of the log residuals (natural log)
    sizes: list[int]
    complexity: str
    fixed_ms: float | None = None  # times: the fixed per-call cost taken off before the fit
    fixed_batch_size: int | None = None  # the batch size it was measured at
    disturbed_sizes: list[int] | None = None  # times: sizes left out (slower than a larger m)

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None, n: int) -> float | None:
            return None if v is None else round(v, n)

        fitted = {
            "exponent": r(self.exponent, 4),
            "coefficient": None if self.coefficient is None else float(f"{self.coefficient:.6g}"),
            "r2": r(self.r2, 5),
            "rms_log_residual": r(self.rms, 5),
            "sizes": self.sizes,
            "complexity": self.complexity,
        }
        if self.fixed_ms is not None:
            fitted.update(fixed_ms=r(self.fixed_ms, 4), fixed_batch_size=self.fixed_batch_size)
        if self.disturbed_sizes:
            fitted["disturbed_sizes"] = self.disturbed_sizes
        return fitted


def _slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    b, a = np.polyfit(x, y, 1)
    return float(b), float(a)


def fit_power_law(sizes: Sequence[int], values: Sequence[float | None]) -> PowerFit:
    """Fit b in cost ~ a * m^b by least squares on (log m, log cost) and name the class.

    Rule: with at least 3 batch sizes and the fit supporting a power law (R^2 >= 0.98, or,
    for flat data where R^2 says nothing, an RMS log residual <= 0.05, i.e. within about 5%),
    each candidate f in O(1), O(m), O(m log m), O(m^2), O(m^3) gets the exponent left over after
    dividing it out, b_f = slope of log(cost / f(m)). The class with the smallest |b_f| is
    named when |b_f| <= 0.15 and every other candidate's |b_g| is at least 0.05 larger;
    otherwise "unclear". On m = 32..1024, m log m fits b ~ 1.2: dividing by m leaves 0.2 and
    by m log m leaves 0, so it is told apart from m, while m^1.1 (0.1 from both) or m^1.5
    stays "unclear". All-zero values (no miner, nothing counted): "none". A zero among
    positive values cannot be fitted on log axes: "unclear".
    """
    pairs = [(int(m), float(v)) for m, v in zip(sizes, values, strict=True) if v is not None]
    used = [m for m, _ in pairs]
    if not pairs or all(v == 0 for _, v in pairs):
        return PowerFit(None, None, None, None, used, "none")
    if any(v <= 0 for _, v in pairs):
        return PowerFit(None, None, None, None, used, "unclear (zero at some m)")
    m = np.array([p[0] for p in pairs], dtype=float)
    v = np.array([p[1] for p in pairs], dtype=float)
    if len(np.unique(m)) < 2:
        return PowerFit(None, None, None, None, used, "unclear (one batch size)")
    x, y = np.log(m), np.log(v)
    b, a = _slope(x, y)
    residual = y - (a + b * x)
    ss_res = float(np.sum(residual**2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 1e-12 else 1.0
    rms = math.sqrt(ss_res / len(y))
    if len(np.unique(m)) < MIN_FIT_SIZES:
        complexity = f"unclear (fewer than {MIN_FIT_SIZES} batch sizes)"
    elif not (r2 >= R2_MIN or rms <= RMS_MAX):
        complexity = "unclear (not a power law)"
    else:
        left = sorted(
            (abs(_slope(x, y - np.log(f(m)))[0]), name) for name, f in COMPLEXITIES.items()
        )
        (best, name), (second, _) = left[0], left[1]
        complexity = name if best <= TOLERANCE and second - best >= MARGIN else "unclear"
    return PowerFit(b, math.exp(a), r2, rms, used, complexity)


def fit_time(
    sizes: Sequence[int], times: Sequence[float | None], fixed_ms: float | None,
    fixed_batch_size: int | None = None,
) -> PowerFit:  # fmt: skip
    """The exponent of a time above its fixed per-call cost (see the module docstring): the
    sizes whose time is at least FIXED_MULTIPLE x the fixed cost, fitted as time - fixed.
    `fixed_ms` None: the time at the smallest size. The work grows with m, so no call can
    take less than the fixed cost (a slower fixed call was disturbed: the fastest call is
    taken instead), and a time above that of a larger m was disturbed, or the implementation
    changed algorithm there: such sizes are left out (`disturbed_sizes`). Fewer than
    MIN_FIT_SIZES sizes left: no class, and the complexity says up to which m the fixed cost
    dominates."""
    pairs = [(int(m), float(t)) for m, t in zip(sizes, times, strict=True) if t is not None]
    if not pairs or all(t == 0 for _, t in pairs):
        return fit_power_law([m for m, _ in pairs], [t for _, t in pairs])  # "none"
    lowest = min(pairs, key=lambda p: p[1])
    if fixed_ms is None or lowest[1] < fixed_ms:
        fixed_batch_size, fixed_ms = lowest
    steady = [(m, t) for i, (m, t) in enumerate(pairs) if all(t <= u for _, u in pairs[i + 1 :])]
    disturbed = sorted({m for m, _ in pairs} - {m for m, _ in steady})
    above = [(m, t - fixed_ms) for m, t in steady if t >= FIXED_MULTIPLE * fixed_ms]
    below = [m for m, t in steady if t < FIXED_MULTIPLE * fixed_ms]
    if len(above) < MIN_FIT_SIZES and below:
        why = (f"unclear (fixed cost dominates up to m={max(below)}: {len(above)} size(s) at "
               f"{FIXED_MULTIPLE:g}x the m={fixed_batch_size} call's {fixed_ms:.3g} ms or more, "
               f"{MIN_FIT_SIZES} needed)")  # fmt: skip
        fitted = PowerFit(None, None, None, None, [m for m, _ in above], why)
    else:
        fitted = fit_power_law([m for m, _ in above], [t for _, t in above])
    return dataclasses.replace(fitted, fixed_ms=fixed_ms, fixed_batch_size=fixed_batch_size,
                               disturbed_sizes=disturbed)  # fmt: skip


def fits(cells: list[dict[str, Any]], fixed: dict[str, Any] | None = None) -> dict[str, PowerFit]:
    """Exponents of the counts (all measured sizes: they are exact) and of the times (above
    the fixed per-call cost, fit_time; `fixed`: the method's call on its smallest batch,
    scaling.measure_fixed_cost, else None)."""
    done = [c for c in cells if "skipped" not in c]
    sizes = [c["batch_size"] for c in done]
    fixed = fixed or {}

    def timed(key: str) -> PowerFit:
        return fit_time(sizes, [c[key] for c in done], fixed.get(key), fixed.get("batch_size"))

    return {
        "evaluated": fit_power_law(sizes, [c["evaluated"] for c in done]),
        "tuples": fit_power_law(sizes, [c["tuples"] for c in done]),
        "mining_time": timed("mining_ms"),
        "loss_time": timed("loss_ms"),
    }


def fit_summary(fitted: dict[str, PowerFit]) -> dict[str, Any]:
    """The exponents, R^2 and classes a cost file keeps per method (None: not measured)."""

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 4)

    ev, tm, lt, tu = (fitted[k] for k in ("evaluated", "mining_time", "loss_time", "tuples"))
    return {
        "count_exponent": r(ev.exponent), "count_r2": r(ev.r2), "count_complexity": ev.complexity,
        "tuple_exponent": r(tu.exponent), "tuple_complexity": tu.complexity,
        "time_exponent": r(tm.exponent), "time_r2": r(tm.r2), "time_complexity": tm.complexity,
        "loss_time_exponent": r(lt.exponent), "loss_time_r2": r(lt.r2),
        "loss_time_complexity": lt.complexity,
    }  # fmt: skip
