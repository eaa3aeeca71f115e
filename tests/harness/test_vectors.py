"""The vector index under `harness index` / `harness search` (harness/deploy/vectors.py; its
kinds, harness/deploy/index_spec.py): exact search equals brute force, ids survive adds and
removals, files round-trip and repeat their bytes, the approximate kinds reach a recall floor,
and every mistake gets its one-line error."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from harness.core import HarnessError  # noqa: E402
from harness.deploy import vectors  # noqa: E402
from harness.deploy.index_spec import KINDS, IndexSpec, removes_in_place  # noqa: E402
from harness.deploy.vectors import VectorIndex, build_index, load_index  # noqa: E402

# Small settings each kind can build from 4,000 x 32 vectors in well under a second.
SMALL = {
    "flat": IndexSpec.parse("flat"),
    "hnsw": IndexSpec.parse("hnsw:M=16,ef_search=32"),
    "ivfpq": IndexSpec.parse("ivfpq:nlist=16,m=16,nbits=6,nprobe=4"),
}


@pytest.fixture(autouse=True)
def one_faiss_thread():
    """faiss on one thread, as under the suite's xdist workers (conftest.py): on a busy machine
    OpenMP's spinning threads make a small IVF-PQ training ten times slower."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


def clustered(n: int, dim: int = 32, clusters: int = 40, seed: int = 0) -> np.ndarray:
    """L2-normalised cluster centres plus noise, like a trained embedding of a catalogue."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x = centres[rng.integers(0, clusters, n)] + 0.35 * rng.normal(size=(n, dim)) / np.sqrt(dim)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def catalogue() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4,000 gallery vectors under scattered ids (not 0..n-1: ids are the caller's), and 200
    queries from the same clusters that are not in the gallery."""
    x = clustered(4200)
    return np.ascontiguousarray(x[:4000]), np.arange(4000, dtype=np.int64) * 3 + 7, x[4000:]


def brute_force(gallery: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    d = ((queries[:, None, :].astype(np.float64) - gallery[None].astype(np.float64)) ** 2).sum(-1)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, axis=1), order


def recall_at_10(index: VectorIndex, truth: np.ndarray, queries: np.ndarray) -> float:
    _, found = index.search(queries, 10)
    return float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)]))


# --- searching --------------------------------------------------------------------------


def test_flat_search_equals_brute_force(catalogue):
    x, ids, queries = catalogue
    distances, found = build_index(IndexSpec(), x, ids).search(queries, 10)
    want_d, want_rows = brute_force(x, queries, 10)
    np.testing.assert_array_equal(found, ids[want_rows])
    np.testing.assert_allclose(distances, want_d, rtol=1e-4, atol=1e-5)
    assert distances.dtype == np.float32 and found.dtype == np.int64


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_approximate_kinds_reach_their_recall_floor_against_flat(catalogue, kind):
    x, ids, queries = catalogue
    _, truth = build_index(IndexSpec(), x, ids).search(queries, 10)
    # measured 1.00 (hnsw) and 0.72 (ivfpq: 16 two-dimensional sub-vectors of 6 bits)
    floor = {"hnsw": 0.95, "ivfpq": 0.6}[kind]
    assert recall_at_10(build_index(SMALL[kind], x, ids), truth, queries) >= floor


def test_hnsw_keeps_its_recall_after_adding_to_a_built_graph(catalogue):
    """Vectors added later join the graph the first build made (a graph whose entry point
    moved to an unlinked node would lose the first batch)."""
    x, ids, queries = catalogue
    _, truth = build_index(IndexSpec(), x, ids).search(queries, 10)
    index = build_index(SMALL["hnsw"], x[:500], ids[:500])
    index.add(x[500:], ids[500:])
    assert recall_at_10(index, truth, queries) >= 0.95


@pytest.mark.parametrize("kind", KINDS)
def test_k_larger_than_the_index_pads_with_minus_one_at_infinity(kind, catalogue):
    x, ids, _ = catalogue
    spec = SMALL[kind]
    if kind == "ivfpq":  # trained on the catalogue, then emptied down to five; every list probed
        index = build_index(dataclasses.replace(spec, nprobe=spec.nlist), x, ids)
        index.remove(ids[5:])
    else:
        index = build_index(spec, x[:5], ids[:5])
    distances, found = index.search(x[:2], 8)
    assert sorted(found[0, :5]) == sorted(ids[:5]) and (found[:, 5:] == -1).all()
    assert np.isinf(distances[:, 5:]).all() and np.isfinite(distances[:, :5]).all()
    assert (np.diff(distances[:, :5], axis=1) >= 0).all()


def test_an_empty_index_finds_nothing():
    index = build_index(IndexSpec(), np.zeros((0, 8), np.float32), np.zeros(0, np.int64))
    distances, found = index.search(np.ones((3, 8), np.float32), 4)
    assert len(index) == 0 and (found == -1).all() and np.isinf(distances).all()


def test_hnsw_returns_k_neighbours_when_k_exceeds_ef_search(catalogue):
    x, ids, _ = catalogue
    index = build_index(IndexSpec.parse("hnsw:M=8,ef_search=4"), x, ids)
    _, found = index.search(x[:3], 50)
    assert (found >= 0).all() and all(len(set(row)) == 50 for row in found)


# --- ids: add, remove --------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_ids_survive_adds_and_removals_and_removed_ids_never_come_back(kind, catalogue):
    x, ids, _ = catalogue
    index = build_index(SMALL[kind], x[:3000], ids[:3000])
    index.add(x[3000:], ids[3000:])
    gone = ids[::7]
    assert index.remove(gone) == len(gone)
    assert index.remove(gone) == 0  # already gone: nothing to remove
    kept = np.setdiff1d(ids, gone)
    np.testing.assert_array_equal(index.ids(), kept)
    assert len(index) == len(kept)
    _, found = index.search(np.ascontiguousarray(x[::50]), len(ids))
    assert not np.isin(found, gone).any()
    assert set(found[found >= 0]) <= set(kept)
    if kind != "ivfpq":  # exact vectors: each kept vector is its own nearest neighbour
        rows = np.flatnonzero(np.isin(ids, kept))[::97]
        np.testing.assert_array_equal(index.search(x[rows], 1)[1][:, 0], ids[rows])


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_removing_leaves_the_bytes_of_a_build_without_the_removed(kind, catalogue, tmp_path):
    x, ids, _ = catalogue
    index = build_index(SMALL[kind], x[:1000], ids[:1000])
    index.remove(ids[100:1000:3])
    keep = np.ones(1000, bool)
    keep[100:1000:3] = False
    index.save(tmp_path / "removed.faiss")
    build_index(SMALL[kind], np.ascontiguousarray(x[:1000][keep]), ids[:1000][keep]).save(
        tmp_path / "fresh.faiss"
    )
    assert (tmp_path / "removed.faiss").read_bytes() == (tmp_path / "fresh.faiss").read_bytes()


def test_tune_changes_the_search_setting_and_a_save_keeps_it(catalogue, tmp_path):
    x, ids, queries = catalogue
    index = build_index(dataclasses.replace(SMALL["ivfpq"], nprobe=1), x, ids)
    assert (index.search(queries[:1], 4000)[1] >= 0).sum() < 1000  # one list of 16
    index.tune(dataclasses.replace(SMALL["ivfpq"], nprobe=16))
    assert (index.search(queries[:1], 4000)[1] >= 0).sum() == 4000  # every list
    index.save(tmp_path / "tuned.faiss")
    assert load_index(tmp_path / "tuned.faiss").spec.nprobe == 16
    graph = build_index(SMALL["hnsw"], x, ids)
    graph.tune(IndexSpec.parse("hnsw:M=16,ef_search=200"))
    graph.save(tmp_path / "graph.faiss")
    assert (
        str(load_index(tmp_path / "graph.faiss").spec)
        == "hnsw:M=16,ef_construction=40,ef_search=200"
    )
    assert message(graph.tune, IndexSpec.parse("hnsw:M=32,ef_search=200")) == (
        "hnsw:M=32,ef_construction=40,ef_search=200 differs from this index's "
        "hnsw:M=16,ef_construction=40,ef_search=200 in what it was built with (only ef_search "
        "changes without a rebuild): build a new index to change it"
    )
    flat = build_index(IndexSpec(), x[:10], ids[:10])
    flat.tune(IndexSpec())
    assert message(flat.tune, SMALL["hnsw"]).endswith(
        "(nothing changes without a rebuild): build a new index to change it"
    )


def test_removes_in_place_tells_which_kinds_rebuild():
    assert [removes_in_place(kind) for kind in KINDS] == [True, False, True]
    with pytest.raises(HarnessError, match=re.escape("unknown index kind 'ivf' (did you mean")):
        removes_in_place("ivf")


# --- files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_save_and_load_round_trip_gives_identical_results(kind, catalogue, tmp_path):
    x, ids, queries = catalogue
    index = build_index(SMALL[kind], x, ids)
    index.save(tmp_path / "catalogue.faiss")
    loaded = load_index(tmp_path / "catalogue.faiss")
    assert loaded.spec == index.spec and str(loaded.spec) == str(SMALL[kind])
    assert (len(loaded), loaded.dim) == (4000, 32)
    np.testing.assert_array_equal(loaded.ids(), index.ids())
    for got, want in zip(loaded.search(queries, 10), index.search(queries, 10), strict=True):
        np.testing.assert_array_equal(got, want)
    assert [p.name for p in tmp_path.iterdir()] == ["catalogue.faiss"]  # no temporary left


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_vectors_and_ids_save_the_same_bytes(kind, catalogue, tmp_path):
    """flat anywhere; hnsw at any thread count on faiss 1.15; ivfpq on one machine."""
    x, ids, _ = catalogue
    for name in ("a", "b"):
        build_index(SMALL[kind], x, ids).save(tmp_path / name)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def test_hnsw_saves_the_same_bytes_at_any_thread_count(catalogue, tmp_path):
    x, ids, _ = catalogue
    for threads in (1, 2, 3):
        faiss.omp_set_num_threads(threads)
        build_index(SMALL["hnsw"], x, ids).save(tmp_path / f"{threads}.faiss")
    assert len({(tmp_path / f"{t}.faiss").read_bytes() for t in (1, 2, 3)}) == 1


def test_a_failed_save_keeps_the_old_file_and_leaves_no_temporary(catalogue, tmp_path, monkeypatch):
    x, ids, _ = catalogue
    target = tmp_path / "catalogue.faiss"
    build_index(IndexSpec(), x[:10], ids[:10]).save(target)
    before = target.read_bytes()

    def half_written(index, path):
        with open(path, "wb") as handle:
            handle.write(b"IxM2 and then the disk filled up")
        raise RuntimeError("write failed")

    monkeypatch.setattr(vectors.faiss, "write_index", half_written)
    with pytest.raises(RuntimeError, match="write failed"):
        build_index(IndexSpec(), x, ids).save(target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["catalogue.faiss"]


def test_ivfpq_trains_on_a_capped_sample_and_adds_every_vector(catalogue, monkeypatch):
    x, ids, _ = catalogue
    seen: list[int] = []
    train = faiss.IndexIVFPQ.train
    monkeypatch.setattr(
        faiss.IndexIVFPQ, "train", lambda self, v: (seen.append(len(v)), train(self, v))[1]
    )
    spec = IndexSpec.parse("ivfpq:nlist=8,m=8,nbits=3,nprobe=8")  # 8 centroids: 2,048 at most
    index = build_index(spec, x, ids)
    assert seen == [vectors.TRAIN_PER_CENTROID * 8] and len(index) == 4000


# --- the spec ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("flat", "flat"),
        ("  hnsw ", "hnsw:M=32,ef_construction=40,ef_search=64"),
        ("hnsw:M=16, ef_search=128", "hnsw:M=16,ef_construction=40,ef_search=128"),
        ("ivfpq:nlist=1024,m=64,nprobe=16", "ivfpq:nlist=1024,m=64,nbits=8,nprobe=16"),
        ("ivfpq:nprobe=4,nbits=6", "ivfpq:nlist=1024,m=64,nbits=6,nprobe=4"),
    ],
)
def test_spec_text_parses_to_its_canonical_form_and_back(text, canonical):
    spec = IndexSpec.parse(text)
    assert str(spec) == canonical and IndexSpec.parse(canonical) == spec


def test_spec_defaults_suit_a_million_by_512():
    assert IndexSpec() == IndexSpec.parse("flat")
    hnsw, ivfpq = IndexSpec.parse("hnsw"), IndexSpec.parse("ivfpq")
    assert (hnsw.M, hnsw.ef_construction, hnsw.ef_search) == (32, 40, 64)
    assert (ivfpq.nlist, ivfpq.m, ivfpq.nbits, ivfpq.nprobe) == (1024, 64, 8, 16)
    ivfpq.check_dimension(512)  # 64 sub-vectors of 8 dimensions


# --- every mistake, its one-line message ----------------------------------------------------


def message(call, *args, **kwargs) -> str:
    with pytest.raises(HarnessError) as caught:
        call(*args, **kwargs)
    text = str(caught.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "hsnw",
            "unknown index kind 'hsnw' (did you mean 'hnsw'?): choose one of flat, hnsw, ivfpq",
        ),
        (
            "",
            "index spec '' names no kind: write one of flat, hnsw, ivfpq, e.g. hnsw or "
            "hnsw:M=32,ef_search=64",
        ),
        (
            "hnsw:efsearch=3",
            "unknown hnsw parameter 'efsearch' (did you mean 'ef_search'?): "
            "hnsw takes M, ef_construction, ef_search",
        ),
        (
            "hnsw:m=16",
            "unknown hnsw parameter 'm' (did you mean 'M'?): hnsw takes M, "
            "ef_construction, ef_search",
        ),
        (
            "ivfpq:M=16",
            "unknown ivfpq parameter 'M' (did you mean 'm'?): ivfpq takes nlist, m, nbits, nprobe",
        ),
        (
            "flat:nlist=5",
            "flat takes no parameters, got 'nlist=5' in 'flat:nlist=5': write just flat",
        ),
        ("hnsw:M", "index parameter 'M' in 'hnsw:M' is not NAME=INTEGER: write e.g. hnsw:M=..."),
        (
            "hnsw:M=32,",
            "index parameter '' in 'hnsw:M=32,' is not NAME=INTEGER: write e.g. hnsw:M=...",
        ),
        ("hnsw:M=big", "hnsw parameter M='big' is not an integer: write e.g. M=32"),
        ("hnsw:M=2", "hnsw parameter M=2 is out of range: use an integer from 4 to 256"),
        ("ivfpq:nbits=17", "ivfpq parameter nbits=17 is out of range: use an integer from 1 to 16"),
        (
            "ivfpq:nlist=64,nprobe=65",
            "ivfpq nprobe=65 exceeds nlist=64: nprobe counts the lists searched, so use at most 64",
        ),
        ("hnsw:M=8,M=9", "hnsw parameter M is given twice in 'hnsw:M=8,M=9': give it once"),
    ],
)
def test_spec_text_errors(text, expected):
    assert message(IndexSpec.parse, text) == expected


def test_spec_constructor_errors():
    assert (
        message(IndexSpec, "flat", nlist=5)
        == "nlist is not a flat parameter: flat takes no parameters"
    )
    assert message(IndexSpec, "hnsw", ef_search=0) == (
        "hnsw parameter ef_search=0 is out of range: use an integer from 1 to 32768"
    )
    assert message(IndexSpec, "hnsw", M=True).startswith("hnsw parameter M=True is out of range")


def test_m_must_divide_the_dimension():
    spec = IndexSpec.parse("ivfpq:m=60")
    assert message(spec.check_dimension, 512) == (
        "ivfpq m=60 does not divide the dimension 512: each vector is split into m equal "
        "parts; use a divisor of 512, e.g. m=64"
    )
    x = clustered(20, dim=30)
    assert "m=64 does not divide the dimension 30" in message(
        build_index, IndexSpec.parse("ivfpq"), x, np.arange(20)
    )


def test_ivfpq_says_how_many_training_vectors_it_has_and_needs(catalogue):
    x, ids, _ = catalogue
    assert message(build_index, IndexSpec.parse("ivfpq:m=16"), x, ids) == (
        "ivfpq:nlist=1024,nbits=8 needs at least 39,936 vectors to train (39 per centroid: "
        "1024 lists, 256 codes per sub-quantiser), got 4,000: index more vectors or use "
        "nlist=64,nbits=6"
    )
    assert message(build_index, IndexSpec.parse("ivfpq:nlist=16,m=16"), x, ids).endswith(
        "got 4,000: index more vectors or use nbits=6"
    )
    assert message(
        build_index, IndexSpec.parse("ivfpq:nlist=4,m=16,nbits=2"), x[:50], ids[:50]
    ) == (
        "ivfpq:nlist=4,nbits=2 needs at least 156 vectors to train (39 per centroid: 4 lists, "
        "4 codes per sub-quantiser), got 50: index more vectors"
    )


def test_vector_errors(catalogue):
    x, ids, _ = catalogue
    index = build_index(IndexSpec(), x[:10], ids[:10])
    nan = x[:3].copy()
    nan[2, 5] = np.nan
    cases = [
        (
            x[:2].tolist(),
            "queries must be a numpy array, got list: pass np.asarray(x, dtype=np.float32)",
        ),
        (
            x[0],
            "queries must be 2-d (count, dimension), got shape (32,): pass x.reshape(1, -1) "
            "for a single vector",
        ),
        (
            x[:2].astype(np.float64),
            "queries must be float32, got float64: pass x.astype(np.float32)",
        ),
        (x[:4, ::2], "queries must be C-contiguous: pass np.ascontiguousarray(x)"),
        (
            x[:2, :16].copy(),
            "queries have dimension 16 but the index holds 32-d vectors: embed "
            "them with the model that built the index",
        ),
        (nan, "queries row 2 is not finite (NaN or inf): drop or re-embed it"),
    ]
    for queries, expected in cases:
        assert message(index.search, queries, 5) == expected
    assert message(index.add, nan, np.arange(3) + 10**6) == expected.replace("queries", "vectors")
    assert message(build_index, IndexSpec(), np.zeros((3, 0), np.float32), np.arange(3)) == (
        "vectors have dimension 0: embeddings need at least one dimension"
    )
    assert message(build_index, "flat", x, ids) == (
        "spec must be an IndexSpec, got str: use IndexSpec.parse"
    )


def test_k_errors(catalogue):
    x, ids, _ = catalogue
    index = build_index(IndexSpec(), x[:10], ids[:10])
    for k in (0, -1, 2.5, True):
        assert (
            message(index.search, x[:1], k)
            == f"k must be a positive integer, got {k!r}: ask for e.g. k=10"
        )


def test_id_errors(catalogue):
    x, ids, _ = catalogue
    index = build_index(IndexSpec(), x[:10], ids[:10])
    cases = [
        (
            ids[:3].astype(np.float64),
            "ids must be a 1-d integer numpy array, got float64 of shape (3,): "
            "pass np.asarray(ids, dtype=np.int64)",
        ),
        (
            [1, 2, 3],
            "ids must be a 1-d integer numpy array, got list: pass np.asarray(ids, dtype=np.int64)",
        ),
        (np.arange(2), "2 ids for 3 vectors: give one id per vector"),
        (
            np.array([5, -2, 6]),
            "id -2 is negative: ids must be >= 0 (-1 marks a missing neighbour)",
        ),
        (np.array([5, 9, 5]), "id 5 appears more than once: give each item its own id"),
        (
            np.array([2**63, 1, 2], np.uint64),
            "id 9223372036854775808 does not fit in int64: use ids below 2**63",
        ),
        (
            ids[8:11],
            f"id {ids[8]} is already in the index (2 of the 3 ids are): remove them first "
            "to replace their vectors, or give new ids",
        ),
    ]
    for bad, expected in cases:
        assert message(index.add, x[20:23], bad) == expected
    assert len(index) == 10  # nothing half-added
    assert message(index.remove, np.array([[1]])).startswith(
        "ids must be a 1-d integer numpy array"
    )


def test_load_errors(tmp_path):
    assert message(load_index, tmp_path / "none.faiss") == (
        f"no index file at {tmp_path / 'none.faiss'}: check the path, or build the index first"
    )
    (tmp_path / "junk.faiss").write_bytes(b"these are not the bytes of an index")
    assert re.fullmatch(
        re.escape(str(tmp_path / "junk.faiss"))
        + r" is not a readable faiss index \(.+\): rebuild it",
        message(load_index, tmp_path / "junk.faiss"),
    )
    foreign = {
        "ip.faiss": faiss.IndexIDMap2(faiss.IndexFlatIP(8)),
        "plain.faiss": faiss.IndexFlatL2(8),
        "idmap.faiss": faiss.IndexIDMap(faiss.IndexFlatL2(8)),
    }
    for name, index in foreign.items():
        faiss.write_index(index, str(tmp_path / name))
    for name, held in [
        ("ip.faiss", "IndexFlatIP"),
        ("plain.faiss", "IndexFlatL2"),
        ("idmap.faiss", "IndexIDMap"),
    ]:
        assert message(load_index, tmp_path / name) == (
            f"{tmp_path / name} holds a faiss {held}, not an index of the harness's kinds "
            "(flat, hnsw, ivfpq): rebuild it with the harness"
        )


@pytest.mark.parametrize("kind", KINDS)
def test_search_works_after_faiss_torch_utils_patches_the_indexes(kind, catalogue):
    # pytorch-metric-learning imports faiss.contrib.torch_utils, which replaces every index
    # class's search with one that takes no `params` (seen failing in the suite's workers)
    import faiss.contrib.torch_utils  # noqa: F401

    x, ids, queries = catalogue
    index = build_index(SMALL[kind], x, ids)
    k = SMALL["hnsw"].ef_search + 8  # above ef_search: HNSW searches with params
    distances, found = index.search(queries[:5], k)
    assert found.shape == (5, k) and (found[:, 0] >= 0).all()
    assert (np.diff(distances, axis=1)[np.isfinite(distances[:, 1:])] >= 0).all()
