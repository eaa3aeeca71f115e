"""What a run ranked, read back from its saved test embeddings folder (`run --save-embeddings`):
the protocol it ran under, which saved rows query and which form the gallery, each saved
row's index into the dataset, each query's top-k neighbours and its MAP@R. A folder of the
current format holds all of it (indices.npy, neighbours.npy, average_precision.npy); a
format-1 folder (saved before them) gets them computed again by the runner's rules, which
only a Euclidean run's ranking allows. `show`'s retrieval grid (harness.report.retrieval)
draws from these.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from harness.core import HarnessError, Protocol, load_protocol, parse_protocol
from harness.evaluate.metrics import compute_report
from harness.evaluate.neighbours import AVERAGE_PRECISION, per_query_values, top_neighbours
from harness.evaluate.saved import SavedEmbeddings
from harness.records import read_result


def run_protocol(folder: Path, saved: SavedEmbeddings) -> Protocol:
    """The protocol the run used: as its result (beside the folder) recorded it, else the
    shipped protocol of that name if its hash is still the run's."""
    result = Path(folder).with_suffix(".json")
    recorded = (saved.meta.get("protocol") or {}).get("hash")
    if result.is_file():
        info = read_result(result).protocol
        if info.content:
            protocol = parse_protocol(info.content, info.path or str(result))
            if protocol.hash == info.hash:
                return protocol
    name = (saved.meta.get("protocol") or {}).get("name")
    if not isinstance(name, str):
        raise HarnessError(f"{folder}/embeddings.json names no protocol; rerun with "
                           "--save-embeddings --force")  # fmt: skip
    protocol = load_protocol(name)
    if protocol.hash != recorded:
        raise HarnessError(f"protocol {name} has changed since this run (hash {protocol.hash}, "
                           f"the run's {recorded}) and no result beside {folder} records the "
                           "run's; keep the seed<k>.json beside its folder")  # fmt: skip
    return protocol


def query_gallery_rows(saved: SavedEmbeddings) -> tuple[np.ndarray, np.ndarray]:
    """The saved rows that query and those that form the gallery (all of them all-vs-all)."""
    if saved.is_query is None or saved.is_gallery is None:
        every = np.arange(len(saved.labels))
        return every, every
    return np.flatnonzero(saved.is_query), np.flatnonzero(saved.is_gallery)


def dataset_indices(saved: SavedEmbeddings, split: object) -> np.ndarray:
    """Each saved row's index into the dataset: indices.npy, or for a format-1 folder the
    runner's rule (the queries then the gallery, else the test split), checked by labels."""
    if saved.indices is not None:
        return saved.indices
    gallery = np.asarray(split.gallery)
    if len(gallery):
        return np.concatenate([np.asarray(split.query), gallery]).astype(np.int64)
    return np.asarray(split.test, dtype=np.int64)


def ranked_neighbours(folder: Path, saved: SavedEmbeddings, k: int) -> np.ndarray:
    """The run's own top-k (neighbours.npy); else a Euclidean ranking of the embeddings,
    refused for a learned scorer, whose ranking the embeddings cannot give."""
    if saved.neighbours is not None and saved.neighbours.shape[1] >= k:
        return saved.neighbours
    if saved.learned_scorer:
        had = "" if saved.neighbours is None else f" with {saved.neighbours.shape[1]} neighbours"
        method = saved.meta.get("method")
        raise HarnessError(f"{folder}: {method} ranked by its learned scorer, which is not "
                           f"saved, and the folder{had} cannot give a top {k}; rerun with "
                           "--save-embeddings --force (or pass a smaller --k)")  # fmt: skip
    query, _, gallery, _ = saved.parts()
    g = None if gallery is None else torch.as_tensor(gallery)
    return top_neighbours(torch.as_tensor(query), g, k)


def query_average_precision(saved: SavedEmbeddings) -> np.ndarray:
    """Each query's MAP@R: average_precision.npy, or (a format-1, Euclidean folder) computed."""
    if saved.average_precision is not None:
        return saved.average_precision
    query, query_labels, gallery, gallery_labels = saved.parts()
    report = compute_report(query, query_labels, gallery, gallery_labels, recall_ks=(),
                            metrics=(AVERAGE_PRECISION,))  # fmt: skip
    return per_query_values(report.per_query[AVERAGE_PRECISION], query_labels, gallery_labels)


def ranking_name(saved: SavedEmbeddings) -> str:
    """How the run ranked its gallery: by its learned scorer, or by Euclidean distance."""
    return "its learned scorer" if saved.learned_scorer else "Euclidean distance"
