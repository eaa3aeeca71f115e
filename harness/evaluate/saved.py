"""Saved test embeddings (`run --save-embeddings`, read back by `evaluate DIR`): a run's test
embeddings, labels and query/gallery flags as .npy files beside its result, with a small
`embeddings.json` saying how the run scored them, so that `evaluate DIR` gives the run's own
metrics and anyone can re-rank them with numpy.

runs/<protocol>/<method>/seed<k>.embeddings/ holds
  embeddings.npy   float32 [N, D], the rows the run evaluated (all-vs-all: the test split;
                   with a query/gallery split: the queries, then the gallery)
  labels.npy       int64 [N]
  is_query.npy, is_gallery.npy   bool [N], only for a protocol with a query/gallery split
  indices.npy      int64 [N], each row's index into the protocol's dataset
                   (harness.data.prepare_data(protocol, data_root).data): its image
  neighbours.npy   int64 [Q, k], each query's top-k gallery rows (positions among the gallery
                   rows: all-vs-all, all the rows, the query itself left out), best first, as
                   the run's own scorer ranked them (euclidean or learned); k = max(10, the
                   largest recall K), at most the gallery
  average_precision.npy   float64 [Q], each query's MAP@R (NaN: a query alone in its class)
  paths.txt        each row's image file, one a line (UTF-8, line i+1 for row i), relative to
                   the dataset's root as its `files` name them (harness.data.LabelledImages);
                   only for a dataset read from files (none for rendered glyphs)
  embeddings.json  protocol, method, seed, the metric options (recall_ks, metrics, k-means
                   convention and seed), how the run ranked (`ranking`: euclidean or
                   learned_scorer), `neighbours` (k) and `average_precision` ("map@r")
No metric uses coarse labels, so none are saved. Format 1 (before indices, neighbours and
average_precision) still loads; those three are then None. paths.txt is optional within
format 2 (a folder without it, or a dataset without files, has `paths` None): the metadata's
`files` lists it when it was written, and a folder whose metadata lists it must have it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.core import HarnessError, RunContext
from harness.evaluate.neighbours import AVERAGE_PRECISION
from harness.evaluate.score import Evaluation, metric_names
from harness.evaluate.scoring import retrieval_record
from harness.records import write_bytes_atomic

log = logging.getLogger(__name__)

FORMAT = 2
READABLE_FORMATS = (1, 2)  # format 1: without indices, neighbours and average_precision
METADATA = "embeddings.json"
FLAGS = ("is_query", "is_gallery")
RETRIEVED = ("neighbours", "average_precision")  # one row per query, not per saved row
PATHS = "paths.txt"  # each row's image file, one a line; optional (datasets read from files)


@dataclass
class SavedEmbeddings:
    """One run's test embeddings, labels, query/gallery flags (None: all-vs-all) and the
    metadata that says how the run scored them (see the module docstring)."""

    embeddings: np.ndarray
    labels: np.ndarray
    meta: dict[str, Any]
    is_query: np.ndarray | None = None
    is_gallery: np.ndarray | None = None
    indices: np.ndarray | None = None  # int64 [N] into the protocol's dataset (format 2)
    neighbours: np.ndarray | None = None  # int64 [Q, k] gallery positions (format 2)
    average_precision: np.ndarray | None = None  # float64 [Q], MAP@R (format 2)
    paths: list[str] | None = None  # [N] each row's image file, relative to the data's root

    @property
    def learned_scorer(self) -> bool:
        """Whether the run ranked by a learned scorer (not reproducible from the embeddings)."""
        return (self.meta.get("ranking") or {}).get("ranking") == "learned_scorer"

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays by file stem, the flags only with a query/gallery split."""
        named = {"embeddings": self.embeddings, "labels": self.labels,
                 "is_query": self.is_query, "is_gallery": self.is_gallery,
                 "indices": self.indices, "neighbours": self.neighbours,
                 "average_precision": self.average_precision}  # fmt: skip
        return {name: array for name, array in named.items() if array is not None}

    @property
    def num_queries(self) -> int:
        """The rows that query: all of them all-vs-all, else those flagged is_query."""
        return len(self.labels) if self.is_query is None else int(self.is_query.sum())

    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(queries, their labels, gallery, its labels) as compute_metrics takes them; the
        gallery is None all-vs-all."""
        if self.is_query is None or self.is_gallery is None:
            return self.embeddings, self.labels, None, None
        q, g = self.is_query, self.is_gallery
        return self.embeddings[q], self.labels[q], self.embeddings[g], self.labels[g]


def from_evaluation(
    ctx: RunContext, result: Evaluation, query_labels: np.ndarray,
    gallery_labels: np.ndarray | None, run: dict[str, Any], indices: np.ndarray | None = None,
    paths: Sequence[str] | None = None,
) -> SavedEmbeddings:  # fmt: skip
    """A finished run's test embeddings as they are saved: the evaluated rows (queries, then
    the gallery), and the metadata `evaluate DIR` needs to score them as the run did. `run`:
    who made them (protocol, method, seed); `indices`: each row's index into the protocol's
    dataset; `paths`: each row's image file (None: the images are not read from files); the
    result's neighbours and per-query MAP@R when it kept them."""
    if result.embeddings is None:
        raise HarnessError("the evaluation kept no embeddings to save")
    rows = [result.embeddings]
    if result.gallery_embeddings is not None:
        rows.append(result.gallery_embeddings)
    embeddings = torch.cat(rows).detach().float().cpu().numpy()
    labels = np.asarray(query_labels, dtype=np.int64)
    saved = SavedEmbeddings(embeddings, labels, {})
    if gallery_labels is not None:
        n = len(labels)
        saved.labels = np.concatenate([labels, np.asarray(gallery_labels, dtype=np.int64)])
        saved.is_query = np.arange(len(saved.labels)) < n
        saved.is_gallery = ~saved.is_query
    if indices is not None:
        saved.indices = np.asarray(indices, dtype=np.int64)
    if result.neighbours is not None:
        saved.neighbours = np.asarray(result.neighbours, dtype=np.int64)
    if result.average_precision is not None:
        saved.average_precision = np.asarray(result.average_precision, dtype=np.float64)
    saved.paths = _row_paths(paths, len(saved.labels))
    evaluation = ctx.protocol.evaluation
    saved.meta = {
        "format": FORMAT, **run, "seed": ctx.seed,
        "mode": "all_vs_all" if gallery_labels is None else "query_gallery",
        "rows": int(embeddings.shape[0]), "dimension": int(embeddings.shape[1]),
        "recall_ks": list(evaluation.recall_ks), "metrics": metric_names(ctx.protocol),
        "clustering": evaluation.clustering, "kmeans_seed": ctx.seed, "device": str(ctx.device),
        "ranking": retrieval_record(ctx.protocol, result.pair_scores),
        "files": [f"{name}.npy" for name in saved.arrays()]
                 + ([PATHS] if saved.paths is not None else []),
    }  # fmt: skip
    if saved.neighbours is not None:
        saved.meta["neighbours"] = int(saved.neighbours.shape[1])
    if saved.average_precision is not None:
        saved.meta["average_precision"] = AVERAGE_PRECISION
    return saved


def _row_paths(paths: Sequence[str] | None, rows: int) -> list[str] | None:
    """The rows' paths as paths.txt holds them, or None (with a warning) when they cannot be
    one a line: not one per row, or a path with a line break (the run is kept either way)."""
    if paths is None:
        return None
    out = [str(p) for p in paths]
    if len(out) != rows:
        log.warning("not saving %s: %d paths for %d rows", PATHS, len(out), rows)
        return None
    broken = next((p for p in out if "\n" in p or "\r" in p), None)
    if broken is not None:
        log.warning("not saving %s: the path %r has a line break", PATHS, broken)
        return None
    return out


def write_embeddings(folder: Path, saved: SavedEmbeddings) -> dict[str, Any]:
    """Write the folder atomically: every file into a fresh temporary folder beside it, then
    one rename (a folder left by a run that never wrote its result is replaced). Returns what
    the result records: the folder's name and each file's sha256."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(staging, 0o777 & ~mask)  # as mkdir would make it, not mkdtemp's 0o700
        files = {}
        for name, array in saved.arrays().items():
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            files[f"{name}.npy"] = _write(staging / f"{name}.npy", buffer.getvalue())
        if saved.paths is not None:
            files[PATHS] = _write(staging / PATHS, _paths_text(saved.paths))
        text = json.dumps(saved.meta, indent=2) + "\n"
        files[METADATA] = _write(staging / METADATA, text.encode("utf-8"))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"path": folder.name, "files": files}


def _paths_text(paths: list[str]) -> bytes:
    """paths.txt's bytes: one path a line, UTF-8 (a file name that is not valid UTF-8 keeps
    its own bytes)."""
    return "".join(f"{p}\n" for p in paths).encode("utf-8", "surrogateescape")


def _write(path: Path, data: bytes) -> str:
    write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 of a file, as the result records it for each saved file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_embeddings(folder: Path) -> SavedEmbeddings:
    """A folder written by `run --save-embeddings`, checked: one-line HarnessErrors for a
    missing folder, file or metadata, mismatched row counts, NaN or inf rows and bad flags."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HarnessError(f"{folder} is not a folder; pass a seed<k>.embeddings folder written "
                           "by `run --save-embeddings` (or --embeddings and --labels)")  # fmt: skip
    if not (folder / "embeddings.npy").is_file():
        raise HarnessError(f"{folder} holds no embeddings.npy: not a folder written by `run "
                           "--save-embeddings`; pass one (or --embeddings and --labels)")  # fmt: skip
    meta = _metadata(folder)
    embeddings = _array(folder, "embeddings")
    if embeddings.ndim != 2 or embeddings.dtype.kind != "f":
        raise HarnessError(f"{folder / 'embeddings.npy'} must be a float [N, D] array, got "
                           f"{embeddings.dtype} {embeddings.shape}; rerun with --save-embeddings")  # fmt: skip
    saved = SavedEmbeddings(embeddings, _array(folder, "labels"), meta)
    present = [name for name in FLAGS if (folder / f"{name}.npy").is_file()]
    if meta.get("mode") == "query_gallery" or present:
        saved.is_query, saved.is_gallery = (_array(folder, name) for name in FLAGS)
    for name in ("indices", *RETRIEVED):  # format 2; absent from a format-1 folder
        if meta.get("format", 1) >= 2 or (folder / f"{name}.npy").is_file():
            setattr(saved, name, _array(folder, name))
    saved.paths = _read_paths(folder, meta)
    _check_rows(folder, saved)
    _check_retrieved(folder, saved)
    return saved


def _metadata(folder: Path) -> dict[str, Any]:
    path = folder / METADATA
    if not path.is_file():
        raise HarnessError(f"{folder} has no {METADATA} (how the run scored its embeddings); "
                           "rerun the run with --save-embeddings --force to write it")  # fmt: skip
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HarnessError(
            f"unreadable {path}: {exc}; rerun with --save-embeddings --force"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") not in READABLE_FORMATS:
        readable = " or ".join(f"format-{n}" for n in READABLE_FORMATS)
        raise HarnessError(f"{path} is not {readable} metadata of saved embeddings; "
                           "rerun with --save-embeddings --force")  # fmt: skip
    return meta


def _read_paths(folder: Path, meta: dict[str, Any]) -> list[str] | None:
    """paths.txt's lines, or None for a folder without it (one whose metadata lists it must
    have it)."""
    path = folder / PATHS
    if not path.is_file():
        if PATHS in (meta.get("files") or []):
            raise HarnessError(f"{folder} has no {PATHS}; rerun with --save-embeddings --force")
        return None
    try:
        text = path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise HarnessError(f"cannot read {path} ({exc})") from None
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def _array(folder: Path, name: str) -> np.ndarray:
    path = folder / f"{name}.npy"
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise HarnessError(
            f"{folder} has no {name}.npy; rerun with --save-embeddings --force"
        ) from None
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{path} is not a readable .npy array ({exc})") from None


def _check_rows(folder: Path, saved: SavedEmbeddings) -> None:
    """One label (and one flag of each kind) per embedding row, finite rows, real flags."""
    n = saved.embeddings.shape[0]
    for name, array in saved.arrays().items():
        if name not in ("embeddings", *RETRIEVED) and (array.ndim != 1 or len(array) != n):
            raise HarnessError(f"{folder}: embeddings.npy has {n} rows but {name}.npy has shape "
                               f"{array.shape}; they must have one entry per row")  # fmt: skip
    if saved.paths is not None and len(saved.paths) != n:
        lines = f"{len(saved.paths)} line{'s' if len(saved.paths) != 1 else ''}"
        raise HarnessError(f"{folder}: embeddings.npy has {n} rows but {PATHS} has {lines}; "
                           "it must have one path per row")  # fmt: skip
    for name in ("labels", "indices"):
        array = getattr(saved, name)
        if array is not None and array.dtype.kind not in "iu":
            raise HarnessError(f"{folder}/{name}.npy must hold integers, got {array.dtype}")
    bad = np.flatnonzero(~np.isfinite(saved.embeddings).all(axis=1))
    if len(bad):
        raise HarnessError(f"{folder}/embeddings.npy has NaN or inf in {len(bad)} of {n} rows "
                           f"(first: row {bad[0]}); fix or drop those rows")  # fmt: skip
    for name in FLAGS:
        flags = getattr(saved, name)
        if flags is not None and (flags.dtype != np.bool_ or not flags.any()):
            raise HarnessError(f"{folder}/{name}.npy must be a bool array with at least one "
                               f"true entry, got {flags.dtype} with {int(np.count_nonzero(flags))}")  # fmt: skip


def _check_retrieved(folder: Path, saved: SavedEmbeddings) -> None:
    """One neighbour row and one MAP@R per query; neighbours are gallery positions."""
    queries = saved.num_queries
    gallery = len(saved.labels) if saved.is_gallery is None else int(saved.is_gallery.sum())
    top = saved.neighbours
    if top is not None and (top.ndim != 2 or len(top) != queries or top.dtype.kind not in "iu"
                            or (top.size and (top.min() < 0 or top.max() >= gallery))):  # fmt: skip
        raise HarnessError(f"{folder}/neighbours.npy must be integer [{queries}, k] positions "
                           f"among the {gallery} gallery rows, got {top.dtype} {top.shape}; "
                           "rerun with --save-embeddings --force")  # fmt: skip
    ap = saved.average_precision
    if ap is not None and (ap.ndim != 1 or len(ap) != queries or ap.dtype.kind != "f"):
        raise HarnessError(f"{folder}/average_precision.npy must be float [{queries}], got "
                           f"{ap.dtype} {ap.shape}; rerun with --save-embeddings --force")  # fmt: skip
