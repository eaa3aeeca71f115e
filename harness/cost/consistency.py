"""The cost table's consistency check: was the throughput measurement disturbed?

Every method of a protocol trains the same backbone on the same batches; a method whose
mining + loss is a small share of its step (under SHARE_LIMIT) spends nearly all of that
step in the backbone and the optimizer, which are the same for all of them. Those methods
must therefore agree on images per second: if the fastest of them is more than SPREAD_LIMIT
times the slowest, the difference came from the machine (its load changed under the
measurement), not from the methods, and the table says so, with the spread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SHARE_LIMIT = 0.10  # methods under this mining + loss share of the step are compared
SPREAD_LIMIT = 1.20  # their img/s must agree within 20 %: fastest / slowest at most this


def _compared(methods: Sequence[dict[str, Any]]) -> list[tuple[str, float]]:
    """(method, img/s) of the rows with a measured throughput and a mining + loss share
    under SHARE_LIMIT."""
    rows = []
    for e in methods:
        tp = e.get("throughput") or {}
        share, rate = tp.get("mining_loss_share"), tp.get("images_per_second")
        if e.get("status") == "ok" and share is not None and rate and share < SHARE_LIMIT:
            rows.append((e["method"], float(rate)))
    return rows


def consistency(methods: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The check on a cost record's method rows (see the module docstring): the methods
    compared, their spread (fastest img/s / slowest), the slowest and fastest, and
    `consistent` (True, False, or None when fewer than 2 methods can be compared), with a
    one-line `summary` for the tables."""
    rows = _compared(methods)
    check: dict[str, Any] = {
        "share_limit": SHARE_LIMIT, "spread_limit": SPREAD_LIMIT,
        "methods": [name for name, _ in rows], "spread": None, "slowest": None,
        "fastest": None, "consistent": None,
    }  # fmt: skip
    if len(rows) < 2:
        check["summary"] = (f"Consistency check: not applicable ({len(rows)} method(s) with "
                            f"mining + loss under {SHARE_LIMIT:.0%} of the step; it needs 2)")  # fmt: skip
        return check
    slow, fast = min(rows, key=lambda r: r[1]), max(rows, key=lambda r: r[1])
    spread = fast[1] / slow[1]
    check.update(spread=round(spread, 3), slowest=slow[0], fastest=fast[0],
                 consistent=spread <= SPREAD_LIMIT)  # fmt: skip
    what = (f"the {len(rows)} methods whose mining + loss is under {SHARE_LIMIT:.0%} of the "
            f"step share one backbone and should agree on img/s within "
            f"{SPREAD_LIMIT - 1:.0%}")  # fmt: skip
    if check["consistent"]:
        check["summary"] = (f"Consistency check passed: {what}, and do ({fast[0]} "
                            f"{fast[1]:.0f} / {slow[0]} {slow[1]:.0f} img/s = {spread:.2f}x).")  # fmt: skip
    else:
        check["summary"] = (f"MEASUREMENT DISTURBED (consistency check failed): {what}, but "
                            f"{fast[0]} ran at {fast[1]:.0f} img/s and {slow[0]} at "
                            f"{slow[1]:.0f}: {spread:.2f}x (limit {SPREAD_LIMIT:.2f}x). The "
                            "machine's load changed during the measurement; compare img/s "
                            "within this table with care, and measure again on a quiet "
                            "machine.")  # fmt: skip
    return check
