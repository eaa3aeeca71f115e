"""The growth exponent b of cost ~ a * m^b, and the complexity class it supports (or not)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TIME_FIT_SIZES = 4  # times are fitted on the largest sizes (small m: fixed per-call overheads)

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

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None, n: int) -> float | None:
            return None if v is None else round(v, n)

        return {
            "exponent": r(self.exponent, 4),
            "coefficient": None if self.coefficient is None else float(f"{self.coefficient:.6g}"),
            "r2": r(self.r2, 5),
            "rms_log_residual": r(self.rms, 5),
            "sizes": self.sizes,
            "complexity": self.complexity,
        }


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
    if len(np.unique(m)) < 3:
        complexity = "unclear (fewer than 3 batch sizes)"
    elif not (r2 >= R2_MIN or rms <= RMS_MAX):
        complexity = "unclear (not a power law)"
    else:
        left = sorted(
            (abs(_slope(x, y - np.log(f(m)))[0]), name) for name, f in COMPLEXITIES.items()
        )
        (best, name), (second, _) = left[0], left[1]
        complexity = name if best <= TOLERANCE and second - best >= MARGIN else "unclear"
    return PowerFit(b, math.exp(a), r2, rms, used, complexity)


def fits(cells: list[dict[str, Any]]) -> dict[str, PowerFit]:
    """Exponents of the counts (all measured sizes: they are exact) and of the times (the
    largest TIME_FIT_SIZES measured sizes: at small m fixed per-call costs bend the line)."""
    done = [c for c in cells if "skipped" not in c]
    sizes = [c["batch_size"] for c in done]
    timed = done[-TIME_FIT_SIZES:] if len(done) > TIME_FIT_SIZES else done
    tsizes = [c["batch_size"] for c in timed]
    return {
        "evaluated": fit_power_law(sizes, [c["evaluated"] for c in done]),
        "tuples": fit_power_law(sizes, [c["tuples"] for c in done]),
        "mining_time": fit_power_law(tsizes, [c["mining_ms"] for c in timed]),
        "loss_time": fit_power_law(tsizes, [c["loss_ms"] for c in timed]),
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
