"""The vector index under `harness index` and `harness search`: a catalogue's embeddings in a
faiss index, each under the stable int64 id its caller gave it (one id per catalogue file).

The kinds (flat, hnsw, ivfpq) and their parameters: harness.deploy.index_spec.

Determinism (same vectors and ids in the same order, same spec): ``flat`` saves byte-identical
files anywhere. ``hnsw`` saves byte-identical files at any thread count on faiss 1.15 (its
graph build is deterministic there; measured at 1, 2, 4 and 8 threads); on an older faiss,
whose build races between threads, the graph is built on one thread so that the bytes still
repeat. ``ivfpq`` repeats its bytes on the same machine (seeded k-means, measured at 1 and 2
threads); another processor's float rounding may train other centroids. Removing from a
``flat`` or ``hnsw`` index leaves the same bytes as building without the removed items.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from harness.core import HarnessError
from harness.deploy.index_spec import (
    KINDS,
    SEARCH_PARAMETERS,
    IndexSpec,
)

try:  # faiss is optional for the rest of the harness; the index needs it.
    import faiss
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None

# faiss's k-means warns below 39 training points per centroid (Clustering's
# min_points_per_centroid) and subsamples above 256 (max_points_per_centroid).
MIN_TRAIN_PER_CENTROID = 39
TRAIN_PER_CENTROID = 256
TRAIN_SEED = 1234  # the training sample and faiss's k-means, so a rebuild repeats itself


class VectorIndex:
    """A faiss index over vectors with stable int64 ids, and the spec that made it. Made by
    ``build_index`` or ``load_index``."""

    def __init__(self, spec: IndexSpec, index: faiss.Index) -> None:
        self.spec = spec
        self.index = index  # the faiss index itself (IndexIDMap2 or IndexIVFPQ)

    @property
    def dim(self) -> int:
        """The vectors' dimension."""
        return int(self.index.d)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def __repr__(self) -> str:
        return f"VectorIndex({str(self.spec)!r}, {len(self)} x {self.dim})"

    def ids(self) -> np.ndarray:
        """Every id in the index, ascending (int64)."""
        if self.spec.kind == "ivfpq":
            lists = self.index.invlists
            parts = [
                faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy()
                for i in range(lists.nlist)
                if lists.list_size(i)
            ]
            return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
        return np.sort(faiss.vector_to_array(self.index.id_map).astype(np.int64))

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        """Add ``vectors`` [n, dim] under ``ids`` [n], none of them already in the index (remove
        an id first to replace its vector). IVF-PQ encodes them with its existing training."""
        _check_vectors(vectors, self.dim, "vectors")
        ids = _check_ids(ids, len(vectors))
        present = ids[np.isin(ids, self.ids())]
        if len(present):
            raise HarnessError(
                f"id {present[0]} is already in the index ({len(present)} of the {len(ids)} "
                "ids are): remove them first to replace their vectors, or give new ids"
            )
        _add(self.index, self.spec, vectors, ids)

    def remove(self, ids: np.ndarray) -> int:
        """Remove the vectors under ``ids`` and return how many were there (ids not in the index
        are ignored). Flat and IVF-PQ remove in place; HNSW rebuilds its graph from the vectors
        it keeps (see ``removes_in_place``)."""
        drop = _check_ids(ids, None)
        if self.spec.kind != "hnsw":
            return int(self.index.remove_ids(drop))
        stored = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        keep = ~np.isin(stored, drop)
        if keep.all():
            return 0
        base = faiss.downcast_index(faiss.downcast_index(self.index.index).storage)
        vectors = faiss.rev_swig_ptr(base.get_xb(), len(self) * self.dim)
        kept = np.ascontiguousarray(vectors.reshape(len(self), self.dim)[keep])
        fresh = _empty(self.spec, self.dim)
        _add(fresh, self.spec, kept, stored[keep])
        self.index = fresh
        return int((~keep).sum())

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest vectors to each query [n, dim]: (squared L2 distances [n, k]
        float32, ascending; their ids [n, k] int64). Where fewer than k are found (always when
        k exceeds the index's size; HNSW and IVF-PQ may also find fewer), the rest of the row
        is id -1 at distance inf. IVF-PQ's distances are those of its compressed codes."""
        _check_vectors(queries, self.dim, "queries")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise HarnessError(f"k must be a positive integer, got {k!r}: ask for e.g. k=10")
        params = None
        if self.spec.kind == "hnsw" and k > self.spec.ef_search:
            # HNSW keeps ef_search candidates: fewer than k would cut the list short.
            params = faiss.SearchParametersHNSW()
            params.efSearch = int(k)
        # faiss.contrib.torch_utils (which pytorch-metric-learning imports) replaces every
        # index's search with one that takes no `params`; faiss's own stays as search_numpy
        search = getattr(self.index, "search_numpy", self.index.search)
        distances, found = search(queries, int(k), params=params)
        distances[found < 0] = np.inf
        return distances, found

    def tune(self, spec: IndexSpec) -> None:
        """Switch to ``spec``'s search-time setting (hnsw ef_search, ivfpq nprobe) without a
        rebuild; saved afterwards, the index keeps it. Any other difference is an error."""
        name = SEARCH_PARAMETERS.get(self.spec.kind)
        wanted = dataclasses.replace(spec, **{name: getattr(self.spec, name)}) if name else spec
        if spec.kind != self.spec.kind or wanted != self.spec:
            can = f"only {name} changes" if name else "nothing changes"
            raise HarnessError(
                f"{spec} differs from this index's {self.spec} in what it was built with "
                f"({can} without a rebuild): build a new index to change it"
            )
        if name == "ef_search":
            faiss.downcast_index(self.index.index).hnsw.efSearch = spec.ef_search
        elif name == "nprobe":
            self.index.nprobe = spec.nprobe
        self.spec = spec

    def save(self, path: str | Path) -> None:
        """Write the index to ``path`` atomically (a temporary file beside it, then a rename),
        so a reader never sees half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            mask = os.umask(0o022)
            os.umask(mask)
            os.fchmod(fd, 0o666 & ~mask)
            faiss.write_index(self.index, tmp)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise


def build_index(spec: IndexSpec, vectors: np.ndarray, ids: np.ndarray) -> VectorIndex:
    """A new index of ``spec``'s kind over ``vectors`` [n, dim] under ``ids`` [n] (unique,
    non-negative int64). IVF-PQ trains on these vectors first, so they must number at least
    ``MIN_TRAIN_PER_CENTROID`` per centroid; flat and HNSW accept none at all."""
    _require_faiss()
    if not isinstance(spec, IndexSpec):
        raise HarnessError(
            f"spec must be an IndexSpec, got {type(spec).__name__}: use IndexSpec.parse"
        )
    dim = _check_vectors(vectors, None, "vectors")
    spec.check_dimension(dim)
    ids = _check_ids(ids, len(vectors))
    index = _empty(spec, dim)
    if spec.kind == "ivfpq":
        _train(index, spec, vectors)
    _add(index, spec, vectors, ids)
    return VectorIndex(spec, index)


def load_index(path: str | Path) -> VectorIndex:
    """The index saved at ``path`` by ``VectorIndex.save``, with its spec read back from it."""
    _require_faiss()
    path = Path(path)
    if not path.is_file():
        raise HarnessError(f"no index file at {path}: check the path, or build the index first")
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else "unreadable"
        raise HarnessError(f"{path} is not a readable faiss index ({reason}): rebuild it") from None
    return VectorIndex(_spec_of(index, path), index)


def _require_faiss() -> None:
    if faiss is None:
        raise HarnessError("the vector index needs faiss: pip install faiss-cpu")


def _empty(spec: IndexSpec, dim: int) -> faiss.Index:
    """An empty faiss index of ``spec``; flat and HNSW get ids through IndexIDMap2 (which can
    also give a vector back by id), IVF-PQ keeps ids in its lists itself."""
    if spec.kind == "flat":
        return faiss.IndexIDMap2(faiss.IndexFlatL2(dim))
    if spec.kind == "hnsw":
        graph = faiss.IndexHNSWFlat(dim, spec.M)
        graph.hnsw.efConstruction = spec.ef_construction
        graph.hnsw.efSearch = spec.ef_search
        return faiss.IndexIDMap2(graph)
    index = faiss.IndexIVFPQ(faiss.IndexFlatL2(dim), dim, spec.nlist, spec.m, spec.nbits)
    index.nprobe = spec.nprobe
    index.cp.seed = TRAIN_SEED
    index.pq.cp.seed = TRAIN_SEED
    return index


def _train(index: faiss.Index, spec: IndexSpec, vectors: np.ndarray) -> None:
    """Train IVF-PQ's coarse centroids and codebooks on at most ``TRAIN_PER_CENTROID`` vectors
    per centroid, sampled with ``TRAIN_SEED``, so the same vectors train the same index."""
    centroids = max(spec.nlist, 2**spec.nbits)
    need = MIN_TRAIN_PER_CENTROID * centroids
    if len(vectors) < need:
        raise HarnessError(_too_few(spec, len(vectors), need))
    cap = TRAIN_PER_CENTROID * centroids
    if len(vectors) > cap:
        rows = np.random.default_rng(TRAIN_SEED).choice(len(vectors), size=cap, replace=False)
        vectors = vectors[np.sort(rows)]
    index.train(vectors)


def _too_few(spec: IndexSpec, have: int, need: int) -> str:
    """Why IVF-PQ cannot train on ``have`` vectors, and settings small enough that it could."""
    most = have // MIN_TRAIN_PER_CENTROID  # the most centroids ``have`` vectors can train
    smaller = []
    if most >= 2 and spec.nlist > most:
        smaller.append(f"nlist={1 << (most.bit_length() - 1)}")
    if most >= 2 and 2**spec.nbits > most:
        smaller.append(f"nbits={most.bit_length() - 1}")
    fix = f"index more vectors or use {','.join(smaller)}" if smaller else "index more vectors"
    return (
        f"ivfpq:nlist={spec.nlist},nbits={spec.nbits} needs at least {need:,} vectors to train "
        f"({MIN_TRAIN_PER_CENTROID} per centroid: {spec.nlist} lists, {2**spec.nbits} codes per "
        f"sub-quantiser), got {have:,}: {fix}"
    )


@contextmanager
def _reproducible_graph_build() -> Iterator[None]:
    """faiss 1.15 builds HNSW graphs deterministically at any thread count; a faiss with the
    opt-in flag gets it set; an older one, whose threads race, builds on one thread."""
    if hasattr(faiss.cvar, "hnsw_deterministic_build"):
        before = faiss.cvar.hnsw_deterministic_build
        faiss.cvar.hnsw_deterministic_build = True
        try:
            yield
        finally:
            faiss.cvar.hnsw_deterministic_build = before
    elif hasattr(faiss, "hnsw_add_vertices_deterministic"):
        yield
    else:  # pragma: no cover - faiss before the deterministic build
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            yield
        finally:
            faiss.omp_set_num_threads(threads)


def _add(index: faiss.Index, spec: IndexSpec, vectors: np.ndarray, ids: np.ndarray) -> None:
    if not len(vectors):
        return
    if spec.kind == "hnsw":
        with _reproducible_graph_build():
            index.add_with_ids(vectors, ids)
    else:
        index.add_with_ids(vectors, ids)


def _spec_of(index: faiss.Index, path: Path) -> IndexSpec:
    """The spec that built a faiss index read from ``path``, or an error for one we never write."""
    if isinstance(index, faiss.IndexIVFPQ) and index.metric_type == faiss.METRIC_L2:
        return IndexSpec(
            "ivfpq", nlist=index.nlist, m=index.pq.M, nbits=index.pq.nbits, nprobe=index.nprobe
        )
    if isinstance(index, faiss.IndexIDMap2):
        inner = faiss.downcast_index(index.index)
        if isinstance(inner, faiss.IndexHNSWFlat) and inner.metric_type == faiss.METRIC_L2:
            graph = inner.hnsw
            return IndexSpec(
                "hnsw",
                M=graph.nb_neighbors(1),
                ef_construction=graph.efConstruction,
                ef_search=graph.efSearch,
            )
        if type(inner) is faiss.IndexFlatL2:
            return IndexSpec("flat")
        index = inner
    raise HarnessError(
        f"{path} holds a faiss {type(index).__name__}, not an index of the harness's kinds "
        f"({', '.join(KINDS)}): rebuild it with the harness"
    )


def _check_vectors(vectors: np.ndarray, dim: int | None, what: str) -> int:
    """Raise unless ``vectors`` is a finite float32 C-contiguous [n, dim] array; return dim."""
    if not isinstance(vectors, np.ndarray):
        raise HarnessError(
            f"{what} must be a numpy array, got {type(vectors).__name__}: "
            "pass np.asarray(x, dtype=np.float32)"
        )
    if vectors.ndim != 2:
        raise HarnessError(
            f"{what} must be 2-d (count, dimension), got shape {vectors.shape}: "
            "pass x.reshape(1, -1) for a single vector"
        )
    if vectors.dtype != np.float32:
        raise HarnessError(
            f"{what} must be float32, got {vectors.dtype}: pass x.astype(np.float32)"
        )
    if not vectors.flags.c_contiguous:
        raise HarnessError(f"{what} must be C-contiguous: pass np.ascontiguousarray(x)")
    if dim is not None and vectors.shape[1] != dim:
        raise HarnessError(
            f"{what} have dimension {vectors.shape[1]} but the index holds {dim}-d vectors: "
            "embed them with the model that built the index"
        )
    if vectors.shape[1] < 1:
        raise HarnessError(f"{what} have dimension 0: embeddings need at least one dimension")
    # A float64 sum is finite exactly when every float32 entry is (it cannot overflow), and
    # needs no n x dim mask of its own.
    if not np.isfinite(np.sum(vectors, dtype=np.float64)):
        row = int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])
        raise HarnessError(f"{what} row {row} is not finite (NaN or inf): drop or re-embed it")
    return int(vectors.shape[1])


def _check_ids(ids: np.ndarray, count: int | None) -> np.ndarray:
    """``ids`` as int64, or an error unless they are 1-d, integer, non-negative, unique and
    (when ``count`` is given) one per vector."""
    if not isinstance(ids, np.ndarray) or ids.ndim != 1 or ids.dtype.kind not in "iu":
        shown = ids.dtype if isinstance(ids, np.ndarray) else type(ids).__name__
        shape = f" of shape {ids.shape}" if isinstance(ids, np.ndarray) else ""
        raise HarnessError(
            f"ids must be a 1-d integer numpy array, got {shown}{shape}: "
            "pass np.asarray(ids, dtype=np.int64)"
        )
    if count is not None and len(ids) != count:
        raise HarnessError(f"{len(ids)} ids for {count} vectors: give one id per vector")
    if len(ids) and ids.dtype.kind == "u" and ids.max() > np.iinfo(np.int64).max:
        raise HarnessError(f"id {ids.max()} does not fit in int64: use ids below 2**63")
    ids = ids.astype(np.int64, copy=False)
    if len(ids) and ids.min() < 0:
        raise HarnessError(
            f"id {ids.min()} is negative: ids must be >= 0 (-1 marks a missing neighbour)"
        )
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) < len(ids):
        raise HarnessError(
            f"id {unique[counts > 1][0]} appears more than once: give each item its own id"
        )
    return np.ascontiguousarray(ids)
