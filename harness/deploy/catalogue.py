"""A searchable catalogue: a folder of photos embedded by a kept model, with a faiss index over
the embeddings (`harness index`), searched with query photos (`harness search`).

INDEX_DIR holds `catalogue.json` (the model's weights sha256 and path, the folder, the index
kind, and the sha256 of each file below), `files.tsv` (id, the photo's sha256, bytes, path
relative to the folder; sorted by path), `vectors.npy` (float32, one row per line of
files.tsv) and `index.faiss` (harness.deploy.vectors). The catalogue's files are written
first and catalogue.json last, each atomically: a reader finds a complete catalogue, or one
whose sha256s disagree and says so.

Indexing the same folder again updates the catalogue: photos whose path and content are
unchanged keep their vectors and ids, new or changed ones are embedded and added, removed ones
are dropped; nothing changed, nothing is written. An index made from the same folder with the
same model holds the same rows, vectors and ids, wherever it is made on one machine type.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

import harness
from harness.core import HarnessError, file_sha256, program_name
from harness.deploy.images import embed_files, image_files, report_failed
from harness.deploy.model import LoadedModel
from harness.deploy.vectors import IndexSpec, VectorIndex, build_index, load_index
from harness.records import write_bytes_atomic, write_json_atomic

log = logging.getLogger(__name__)

FORMAT = "dml-harness catalogue"
VERSION = 1
HEADER, ROWS, VECTORS, INDEX = "catalogue.json", "files.tsv", "vectors.npy", "index.faiss"


@dataclass
class Rows:
    """The catalogue's rows, sorted by path: ids, content sha256s, sizes, paths, vectors."""

    ids: np.ndarray
    digests: list[str]
    sizes: list[int]
    paths: list[str]
    vectors: np.ndarray

    def tsv(self) -> bytes:
        lines = [f"{i}\t{d}\t{s}\t{p}" for i, d, s, p in
                 zip(self.ids.tolist(), self.digests, self.sizes, self.paths, strict=True)]  # fmt: skip
        return ("".join(line + "\n" for line in lines)).encode("utf-8")


@dataclass
class Catalogue:
    """A catalogue read back: its header, rows and faiss index."""

    folder: Path
    header: dict[str, Any]
    rows: Rows
    index: VectorIndex

    def paths_of(self, ids: np.ndarray) -> list[list[str | None]]:
        """The paths of an [n, k] array of ids (None for -1: fewer than k found)."""
        where = dict(zip(self.rows.ids.tolist(), self.rows.paths, strict=True))
        return [[where.get(int(i)) for i in row] for row in ids]


def read_catalogue(folder: Path) -> Catalogue:
    """INDEX_DIR read and checked: ours, complete, consistent."""
    header_path = folder / HEADER
    if not header_path.is_file():
        raise HarnessError(f"{folder} is not an index (no {HEADER}); make one with "
                           f"`{program_name()} index MODEL --images FOLDER --out {folder}`")  # fmt: skip
    try:
        header = json.loads(header_path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{header_path} cannot be read ({exc}); index the folder again "
                           "into a new --out") from None  # fmt: skip
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise HarnessError(f"{header_path} is not a catalogue header of ours")
    for name, digest in header.get("sha256", {}).items():
        path = folder / name
        if not path.is_file() or file_sha256(path) != digest:
            raise HarnessError(f"{path} is missing or not the file {HEADER} records (an "
                               "interrupted write?); index the folder again into a new --out")  # fmt: skip
    rows = _read_rows(folder)
    return Catalogue(folder, header, rows, load_index(folder / INDEX))


def _read_rows(folder: Path) -> Rows:
    ids, digests, sizes, paths = [], [], [], []
    for line in (folder / ROWS).read_text("utf-8").splitlines():
        i, digest, size, path = line.split("\t", 3)
        ids.append(int(i))
        digests.append(digest)
        sizes.append(int(size))
        paths.append(path)
    matrix = np.load(folder / VECTORS, allow_pickle=False)
    return Rows(np.asarray(ids, np.int64), digests, sizes, paths, matrix)


def check_model(header: dict[str, Any], model: LoadedModel, folder: Path) -> None:
    """The model must be the one the catalogue was made with (its weights' sha256)."""
    made_with = header["model"]["weights_sha256"]
    if model.weights_sha256 != made_with:
        raise HarnessError(f"{folder} was made by another model (weights sha256 "
                           f"{made_with[:12]}..., {header['model']['path']}), not by "
                           f"{model.path} ({model.weights_sha256[:12]}...); use that model, "
                           "or index into a new --out")  # fmt: skip


def _scan(images: Path) -> tuple[list[str], list[str], list[int]]:
    """The folder's image files with their sha256 and size; a HarnessError if it has none."""
    files = image_files(images)
    if not files:
        raise HarnessError(f"--images {images} holds no images (.jpg, .jpeg, .png, ...); give "
                           "the folder of photos to index")  # fmt: skip
    digests = [file_sha256(images / name) for name in files]
    sizes = [(images / name).stat().st_size for name in files]
    return files, digests, sizes


@dataclass
class Update:
    """What indexing did: counts of rows kept, added, dropped, and undecodable files."""

    kept: int
    added: int
    dropped: int
    skipped: int
    written: bool
    total: int


def build_or_update(
    model: LoadedModel, images: Path, out: Path, spec_text: str | None = None, *,
    progress: bool = True, device: Any = None, engine: str = "auto", threads: int | None = None,
) -> Update:  # fmt: skip
    """Index `images` with `model` into `out`: a new catalogue, or the existing one updated
    (same model required; `spec_text` None keeps its index kind, else flat for a new one)."""
    images = images.resolve()
    old = _existing(out, model)
    spec = IndexSpec.parse(spec_text or (old.header["index"] if old else "flat"))
    files, digests, sizes = _scan(images)
    if old is not None and Path(old.header["folder"]) != images:
        raise HarnessError(f"{out} indexes {old.header['folder']}, not {images}; give that "
                           "folder, or index into a new --out")  # fmt: skip
    known = {} if old is None else {(p, d): n for n, (p, d) in
                                    enumerate(zip(old.rows.paths, old.rows.digests, strict=True))}  # fmt: skip
    todo = [n for n, key in enumerate(zip(files, digests, strict=True)) if key not in known]
    embedded = embed_files(model, images, [files[n] for n in todo], progress=progress,
                           device=device, engine=engine, threads=threads)  # fmt: skip
    report_failed(embedded.failed)
    rows, stayed, next_id = _merge(old, files, digests, sizes, known, embedded)
    dropped = 0 if old is None else len(old.rows.paths) - len(stayed)
    added = len(embedded.files)
    same_kind = old is not None and old.header["index"] == str(spec)
    if old is not None and same_kind and not added and not dropped:
        return Update(len(stayed), 0, 0, len(embedded.failed), False, len(rows.paths))
    if not rows.paths:
        raise HarnessError(f"none of the {len(files)} images in {images} could be decoded; "
                           "nothing written")  # fmt: skip
    index = _index(old if same_kind else None, rows, stayed, spec)
    engine = embedded.engine or (old.header.get("engine") if old is not None else None)
    _write(out, model, images, spec, rows, index, next_id, engine)
    return Update(len(stayed), added, dropped, len(embedded.failed), True, len(rows.paths))


def _existing(out: Path, model: LoadedModel) -> Catalogue | None:
    """The catalogue already in `out` (checked to be the model's), or None for a new one."""
    if (out / HEADER).is_file():
        old = read_catalogue(out)
        check_model(old.header, model, out)
        return old
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HarnessError(f"--out {out} exists and is not an index; give a new or empty "
                           "folder")  # fmt: skip
    return None


def _merge(
    old: Catalogue | None, files: list[str], digests: list[str], sizes: list[int],
    known: dict[tuple[str, str], int], embedded: Any,
) -> tuple[Rows, list[int], int]:  # fmt: skip
    """The new rows in path order: unchanged ones with their old id and vector, then the
    newly embedded ones with new ids (the next after the largest ever given)."""
    new_vec = dict(zip(embedded.files, embedded.vectors, strict=True))
    next_id = 0 if old is None else int(old.header["next_id"])
    ids, keep_d, keep_s, keep_p, vecs, stayed = [], [], [], [], [], []
    for path, digest, size in zip(files, digests, sizes, strict=True):
        row = known.get((path, digest))
        if row is not None:
            ids.append(int(old.rows.ids[row]))
            vecs.append(old.rows.vectors[row])
            stayed.append(row)
        elif path in new_vec:
            ids.append(next_id)
            next_id += 1
            vecs.append(new_vec[path])
        else:
            continue  # could not be decoded
        keep_d.append(digest)
        keep_s.append(size)
        keep_p.append(path)
    dim = old.rows.vectors.shape[1] if old is not None else embedded.vectors.shape[1]
    matrix = np.stack(vecs).astype(np.float32) if vecs else np.zeros((0, dim), np.float32)
    return Rows(np.asarray(ids, np.int64), keep_d, keep_s, keep_p, matrix), stayed, next_id


def _index(old: Catalogue | None, rows: Rows, stayed: list[int], spec: IndexSpec) -> VectorIndex:
    """The faiss index over `rows`: the old one (of the same spec) with dropped ids removed
    and new ones added, else one built from the rows' vectors (no photo embedded again)."""
    if old is None:
        return build_index(spec, rows.vectors, rows.ids)
    index = old.index
    kept_ids = set(old.rows.ids[stayed].tolist())
    gone = np.asarray([i for i in old.rows.ids.tolist() if i not in kept_ids], np.int64)
    if len(gone):
        index.remove(gone)
    new = np.asarray([n for n, i in enumerate(rows.ids.tolist()) if i not in kept_ids], np.int64)
    if len(new):
        index.add(rows.vectors[new], rows.ids[new])
    return index


def _write(
    out: Path, model: LoadedModel, images: Path, spec: IndexSpec, rows: Rows, index: VectorIndex,
    next_id: int, engine: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    written = {ROWS: rows.tsv(), VECTORS: _npy(rows.vectors)}
    for name, data in written.items():
        write_bytes_atomic(out / name, data)
    index.save(out / INDEX)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in written.items()}
    header = {
        "format": FORMAT, "version": VERSION,
        "model": {"path": str(model.path.resolve()), "weights_sha256": model.weights_sha256,
                  "method": model.meta["method"]["name"],
                  "protocol": model.meta["provenance"]["protocol"]},
        "folder": str(images), "index": str(spec), "dimension": int(rows.vectors.shape[1]),
        "count": len(rows.paths), "next_id": next_id,
        "sha256": {**digests, INDEX: file_sha256(out / INDEX)},  # the bytes in hand: not re-read
        "engine": engine,  # what embedded the photos added last: name, version, threads
        "harness_version": harness.__version__,
        "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip
    write_json_atomic(out / HEADER, header)


def _npy(matrix: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(matrix, dtype=np.float32), allow_pickle=False)
    return buffer.getvalue()


@dataclass(frozen=True)
class Hit:
    """One search result: its rank (1 = nearest), path relative to the catalogue's folder,
    and Euclidean distance to the query."""

    rank: int
    path: str
    distance: float


def search(
    catalogue: Catalogue,
    model: LoadedModel,
    queries: list[Path],
    k: int,
    engine: str = "auto",
    threads: int | None = None,
) -> list[list[Hit]]:
    """Each query photo's `k` nearest catalogue photos, embedded by the engine model_engine
    gives for `engine` (checked first: the catalogue's model, and every query decodable)."""
    import torch

    from harness.deploy.images import BATCH, model_engine, preprocess

    check_model(catalogue.header, model, catalogue.folder)
    if k < 1:
        raise HarnessError(f"-k must be at least 1, got {k}")
    batch = []
    for query in queries:
        if not Path(query).is_file():
            raise HarnessError(f"query image {query} does not exist")
        batch.append(preprocess(query, model.preprocessing))
    runner = model_engine(model, None, engine, threads)
    embedded = np.concatenate([runner.run(torch.stack(batch[s : s + BATCH])).numpy()
                               for s in range(0, len(batch), BATCH)])  # fmt: skip
    distances, ids = catalogue.index.search(np.ascontiguousarray(embedded), k)
    out = []
    for row_d, paths in zip(distances, catalogue.paths_of(ids), strict=True):
        out.append([Hit(r + 1, p, float(np.sqrt(max(d, 0.0)))) for r, (p, d) in
                    enumerate(zip(paths, row_d.tolist(), strict=True)) if p is not None])  # fmt: skip
    return out
