"""Bounding boxes as pixel edges, shared by the PIL and the torch decoders."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    pass


def box_edges(box: np.ndarray | None, width: int, height: int) -> tuple[int, int, int, int] | None:
    """(left, top, right, bottom) pixel edges of a crop box, rounded and clamped to the image;
    None for no box (absent, NaN, or empty once clamped)."""
    if box is None or np.isnan(box).any():
        return None
    left, top = max(0, int(round(box[0]))), max(0, int(round(box[1])))
    right = min(width, max(left + 1, int(round(box[2]))))
    bottom = min(height, max(top + 1, int(round(box[3]))))
    return (left, top, right, bottom) if right > left and bottom > top else None
