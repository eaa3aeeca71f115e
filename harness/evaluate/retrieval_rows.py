"""Which queries a retrieval grid shows and what each retrieved (`show`'s grid,
harness.report.retrieval, draws them): the worst and the best queries of a run's saved
embeddings by their MAP@R (ties to the lower query index), then random ones drawn with a seed
from the rest, so that the same folder and options give the same rows; and the saved embeddings
folder of a run's result. Numbers in, rows out: no drawing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.core import HarnessError, program_name
from harness.records import read_result


@dataclass(frozen=True)
class RetrievalRow:
    """One row of the grid: a query (its position among the saved queries), why it was
    chosen (worst, best or random), its MAP@R, its top-k gallery rows (positions among the
    saved gallery rows) and, for each, whether it has the query's class."""

    query: int
    kind: str
    average_precision: float
    neighbours: tuple[int, ...]
    correct: tuple[bool, ...]


@dataclass(frozen=True)
class RowChoice:
    """Which rows a grid shows (`show`'s options): the `worst` queries by MAP@R, the `best`,
    `random` others drawn with `seed`, each with its top `k` neighbours."""

    k: int = 8
    worst: int = 4
    best: int = 4
    random: int = 4
    seed: int = 0

    def check(self) -> None:
        """One line for a grid that cannot have the rows or columns asked for."""
        for name in ("k", "worst", "best", "random"):
            count, least = getattr(self, name), 1 if name == "k" else 0
            if count < least:
                raise HarnessError(f"--{name} must be at least {least}, got {count}")
        if self.worst + self.best + self.random == 0:
            raise HarnessError("no rows to draw: --worst, --best and --random are all 0")


def select_rows(
    average_precision: np.ndarray,
    neighbours: np.ndarray,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    choice: RowChoice = RowChoice(),
) -> list[RetrievalRow]:
    """The grid's rows, reproducibly: the `worst` queries with the lowest MAP@R, the `best`
    with the highest (ties to the lower query index; a query is chosen once), then `random`
    of the rest drawn with `seed` (in query order). Queries whose MAP@R is NaN (alone in
    their class) are never chosen. `neighbours` [Q, >= k]: each query's ranked gallery rows."""
    k, worst, best, random = choice.k, choice.worst, choice.best, choice.random
    ap = np.asarray(average_precision, dtype=np.float64)
    if neighbours.shape[1] < k:
        raise HarnessError(f"--k {k} is more than the {neighbours.shape[1]} neighbours kept")
    candidates = np.flatnonzero(np.isfinite(ap))
    by_ap = candidates[np.lexsort((candidates, ap[candidates]))]  # ascending, ties by index
    by_ap_desc = candidates[np.lexsort((candidates, -ap[candidates]))]
    chosen: list[tuple[int, str]] = [(int(q), "worst") for q in by_ap[:worst]]
    taken = {q for q, _ in chosen}
    chosen += [(int(q), "best") for q in by_ap_desc if q not in taken][:best]
    taken = {q for q, _ in chosen}
    rest = np.array([q for q in candidates if q not in taken], dtype=np.int64)
    drawn = np.random.default_rng(choice.seed).permutation(rest)[:random]
    chosen += [(int(q), "random") for q in np.sort(drawn)]
    rows = []
    for q, kind in chosen:
        top = tuple(int(g) for g in neighbours[q, :k])
        correct = tuple(bool(gallery_labels[g] == query_labels[q]) for g in top)
        rows.append(RetrievalRow(q, kind, float(ap[q]), top, correct))
    return rows


def folder_of(path: Path) -> Path:
    """The saved embeddings folder of a result file (seed<k>.json) or the folder itself;
    one-line HarnessErrors for a path that is neither, or a run that saved none."""
    path = Path(path)
    if path.is_dir():
        if not (path / "embeddings.json").is_file():
            raise HarnessError(f"{path} is not a seed<k>.embeddings folder written by `run "
                               "--save-embeddings`; pass one, or a run's seed<k>.json")  # fmt: skip
        return path
    if path.suffix != ".json" or not path.is_file():
        raise HarnessError(f"{path} is not a run's result (seed<k>.json) or its seed<k>.embeddings "
                           "folder; pass one of them")  # fmt: skip
    record = read_result(path)
    folder = path.with_suffix(".embeddings")
    if not record.embeddings or not folder.is_dir():
        state = "" if record.status == "ok" else f" (its status: {record.status})"
        raise HarnessError(f"{path} has no saved embeddings{state}; rerun it with "
                           f"`{program_name()} run ... --save-embeddings --force`")  # fmt: skip
    return folder
