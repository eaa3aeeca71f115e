"""The metric names, and the checks and conversions of what callers pass in."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from harness.core import METRIC_NAMES, RECALL_PATTERN, HarnessError, closest

Array = torch.Tensor | np.ndarray


def parse_metrics(
    metrics: Iterable[str] | str | None, recall_ks: Iterable[int]
) -> tuple[list[int], set[str]]:
    """(sorted distinct K for recall@K, the other metric names) from the request."""
    ks_given = [recall_ks] if isinstance(recall_ks, int) else list(recall_ks)
    for k in ks_given:
        check_recall_k(k)
    if metrics is None:
        return sorted(set(ks_given)), set(METRIC_NAMES[1:])
    requested = [metrics] if isinstance(metrics, str) else list(metrics)
    ks: set[int] = set()
    names: set[str] = set()
    for name in requested:
        if not isinstance(name, str):
            raise HarnessError(f"metric names must be strings, got {name!r}")
        match = RECALL_PATTERN.fullmatch(name)
        if name == "recall@K":
            ks.update(ks_given)
        elif match:
            ks.add(check_recall_k(int(match.group(1))))
        elif name in METRIC_NAMES:
            names.add(name)
        else:
            raise HarnessError(
                f"unknown metric {name!r}{closest(name, METRIC_NAMES, ignore_case=True)};"
                f" known: {', '.join(METRIC_NAMES)}"
            )
    return sorted(ks), names


def check_recall_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise HarnessError(f"recall@K needs an integer K >= 1, got {k!r}")
    if k < 1:
        raise HarnessError(f"recall@K needs K >= 1, got K={k}")
    return int(k)


def check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise HarnessError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise HarnessError(f"{name} must be >= {minimum}, got {value}")


def to_tensor(x: object, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise HarnessError(f"{what} must be numeric, got dtype {arr.dtype}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype.kind == "u" and arr.dtype.itemsize >= 4:
        arr = arr.astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(arr))


def to_embeddings(x: object, what: str, device: torch.device) -> torch.Tensor:
    """Validated [N, D] real tensor on ``device`` (floating dtypes kept, others -> float32)."""
    t = to_tensor(x, what)
    if t.ndim != 2:
        hint = "; reshape 1-D embeddings with x[:, None]" if t.ndim == 1 else ""
        raise HarnessError(f"{what} must be 2-D [N, D], got shape {tuple(t.shape)}{hint}")
    if t.is_complex():
        raise HarnessError(f"{what} must be real, got dtype {t.dtype}")
    if t.shape[1] == 0:
        raise HarnessError(f"{what} have 0 dimensions (shape {tuple(t.shape)}); need D >= 1")
    if not t.is_floating_point():
        t = t.to(torch.float32)
    t = t.to(device)
    bad = ~torch.isfinite(t).all(1)
    num_bad = int(bad.sum())
    if num_bad:
        first = int(torch.nonzero(bad)[0, 0])
        raise HarnessError(
            f"{what} contain NaN or inf in {num_bad} of {t.shape[0]} rows (first: row {first});"
            " fix or drop those rows"
        )
    return t


def to_labels(y: object, what: str, device: torch.device) -> torch.Tensor:
    """Validated [N] int64 tensor on ``device``."""
    t = to_tensor(y, what)
    if t.ndim != 1:
        raise HarnessError(
            f"{what} must be 1-D [N], got shape {tuple(t.shape)}; flatten them with reshape(-1)"
        )
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise HarnessError(
            f"{what} must be integers, got dtype {t.dtype}; cast them, e.g. labels.astype(int)"
        )
    return t.to(device=device, dtype=torch.int64)


def label_array(y: object, what: str) -> np.ndarray:
    arr = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if arr.ndim != 1:
        raise HarnessError(f"{what} must be 1-D, got shape {arr.shape}")
    return arr


def check_counts(emb: torch.Tensor, labels: torch.Tensor, what: str) -> None:
    if emb.shape[0] != labels.shape[0]:
        raise HarnessError(
            f"{what} embeddings have {emb.shape[0]} rows but {what} labels have"
            f" {labels.shape[0]} entries; pass exactly one label per embedding row"
        )
