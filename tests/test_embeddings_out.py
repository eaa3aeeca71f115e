"""Embeddings out: `run --save-embeddings` writes a finished run's test embeddings beside its
result (sha256s recorded, query/gallery flags and each row's image path for In-shop; no
paths for rendered glyphs), `evaluate DIR` gives the run's
own metrics to 1e-9, a learned scorer's embeddings are refused unless `--euclidean`, and
evaluate says when queries copy gallery rows or when all-vs-all excludes each item."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import miniature_archives as mini
import numpy as np
import pytest
import torch

from harness.cli import main
from harness.core import load_protocol
from harness.data import inshop
from harness.evaluate import compute_metrics
from harness.records import RunResult
from harness.sweep import RunSpec, resolve
from harness.sweep.ray import run_task
from harness.sweep.record import write_run

pytestmark = pytest.mark.xdist_group("embeddings_out")
QUICK = ["--device", "cpu", "--workers", "0"]
TINY_INSHOP = """\
schema: 1
name: tiny_inshop
version: 1
description: In-shop's official query/gallery split on the miniature archive, conv4, 2 steps
dataset: {name: inshop, params: {}}
split: {official: true}
backbone: {name: conv4, input_size: 16, pretrained: none, params: {width: 8}}
embedding_dim: 8
sampler: {classes_per_batch: 2, images_per_class: 2}
optimizer: {name: adam, lr: 0.001}
budget: {steps: 2}
evaluation: {recall_ks: [1, 2]}
seeds: [0]
"""


def run_smoke(results: Path, method: str, *extra: str) -> Path:
    """A smoke run (2 steps at most) into `results`; the path of its result file."""
    code = main(["-q", "run", "--protocol", "smoke", "--method", method, "--max-steps", "2",
                 "--results-dir", str(results), *QUICK, *extra])  # fmt: skip
    assert code == 0
    return results / "runs" / "smoke" / method / "seed0.json"


def evaluate_json(capsys, *args: str) -> dict:
    """`evaluate ... --json`'s object (its stderr lines checked to be its warnings)."""
    capsys.readouterr()
    assert main(["evaluate", *args, "--json"]) == 0
    out = capsys.readouterr()
    printed = json.loads(out.out)
    assert out.err.splitlines() == printed["warnings"]  # the same lines, on stderr too
    return printed


def one_line_error(capsys, *args: str) -> str:
    """`evaluate ...` that must fail: exit 2 and one `error:` line, returned."""
    capsys.readouterr()
    assert main(["evaluate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A smoke contrastive run with --save-embeddings: its result file."""
    return run_smoke(tmp_path_factory.mktemp("saved"), "contrastive", "--save-embeddings")


def test_saved_files_match_the_sha256_in_the_result(saved_run: Path):
    record = json.loads(saved_run.read_text())
    folder = saved_run.with_suffix(".embeddings")
    assert record["status"] == "ok" and record["embeddings"]["path"] == "seed0.embeddings"
    files = record["embeddings"]["files"]
    # rendered glyphs are read from no file: no paths.txt
    assert set(files) == {"embeddings.npy", "labels.npy", "indices.npy", "neighbours.npy",
                          "average_precision.npy", "embeddings.json"}  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)  # no temporary file left
    for name, sha in files.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == sha
    embeddings, labels = np.load(folder / "embeddings.npy"), np.load(folder / "labels.npy")
    assert embeddings.dtype == np.float32 and embeddings.shape == (96, 16)  # 12 classes x 8
    assert labels.dtype == np.int64 and labels.shape == (96,)
    meta = json.loads((folder / "embeddings.json").read_text())
    assert meta["ranking"] == {"ranking": "euclidean"} and meta["mode"] == "all_vs_all"
    assert (meta["method"], meta["seed"], meta["protocol"]["hash"]) == (
        "contrastive", 0, record["protocol"]["hash"])  # fmt: skip
    assert meta["recall_ks"] == [1, 2] and meta["clustering"] == "harness"


def test_evaluate_dir_gives_every_metric_of_the_run(saved_run: Path, capsys):
    metrics = json.loads(saved_run.read_text())["metrics"]
    printed = evaluate_json(capsys, str(saved_run.with_suffix(".embeddings")))
    assert set(printed) == {*metrics, "warnings"}
    for name, value in metrics.items():
        assert abs(printed[name] - value) <= 1e-9, name
    assert printed["warnings"] == [
        "note: all-vs-all: each of the 96 items queries the other 95; it is excluded from its "
        "own gallery"
    ]
    # without --json: one line per metric, the note on stderr
    assert main(["evaluate", str(saved_run.with_suffix(".embeddings"))]) == 0
    out = capsys.readouterr()
    assert out.out.split()[:2] == ["recall@1", f"{metrics['recall@1']:.4f}"]
    assert "excluded from its own gallery" in out.err


def test_evaluate_dir_notices_a_changed_file(saved_run: Path, tmp_path: Path, capsys):
    copy = tmp_path / "seed0.embeddings"
    shutil.copytree(saved_run.with_suffix(".embeddings"), copy)
    shutil.copy(saved_run, tmp_path / "seed0.json")
    labels = np.load(copy / "labels.npy")
    np.save(copy / "labels.npy", labels[::-1].copy())
    printed = evaluate_json(capsys, str(copy))
    assert any("labels.npy differ from the files seed0.json recorded" in w
               for w in printed["warnings"])  # fmt: skip


def test_a_run_without_the_option_has_no_new_key_and_is_rerun_with_it(tmp_path: Path):
    results = tmp_path / "results"
    path = run_smoke(results, "contrastive")
    plain = json.loads(path.read_text())
    assert "embeddings" not in plain and not path.with_suffix(".embeddings").exists()
    run_smoke(results, "contrastive", "--save-embeddings")  # not skipped: no embeddings yet
    saved = json.loads(path.read_text())
    assert saved["metrics"] == plain["metrics"] and path.with_suffix(".embeddings").is_dir()
    assert {k for k in saved if k not in plain} == {"embeddings"}
    archived = sorted((results / "archive" / "smoke" / "contrastive").iterdir())
    assert [p.suffix for p in archived] == [".json"]  # the result without embeddings, kept
    before = path.read_bytes()
    run_smoke(results, "contrastive", "--save-embeddings")  # finished with them: skipped
    run_smoke(results, "contrastive")  # a result with embeddings is a finished run too
    assert path.read_bytes() == before
    run_smoke(results, "contrastive", "--save-embeddings", "--force")
    archived = sorted(p.suffix for p in (results / "archive" / "smoke" / "contrastive").iterdir())
    assert archived == [".embeddings", ".json", ".json"]  # the folder goes with its result


def test_query_gallery_protocol_saves_the_flags(tmp_path: Path, capsys):
    protocol = tmp_path / "tiny_inshop.yaml"
    protocol.write_text(TINY_INSHOP)
    data = mini.inshop(tmp_path / "inshop")
    results = tmp_path / "results"
    assert main(["-q", "run", "--protocol", str(protocol), "--method", "contrastive",
                 "--data-root", str(data), "--results-dir", str(results), "--save-embeddings",
                 *QUICK]) == 0  # fmt: skip
    path = results / "runs" / "tiny_inshop" / "contrastive" / "seed0.json"
    record = json.loads(path.read_text())
    folder = path.with_suffix(".embeddings")
    is_query, is_gallery = np.load(folder / "is_query.npy"), np.load(folder / "is_gallery.npy")
    assert is_query.dtype == np.bool_ and (is_query == ~is_gallery).all()
    split = record["split"]
    assert (is_query.sum(), is_gallery.sum()) == (split["query_images"], split["gallery_images"])
    assert {"is_query.npy", "is_gallery.npy"} <= set(record["embeddings"]["files"])
    assert json.loads((folder / "embeddings.json").read_text())["mode"] == "query_gallery"
    # each row's image, relative to the data root: the queries', then the gallery's
    paths = (folder / "paths.txt").read_text().splitlines()
    listing = inshop.listing(data)
    labels, indices = np.load(folder / "labels.npy"), np.load(folder / "indices.npy")
    assert len(paths) == len(labels) and "paths.txt" in record["embeddings"]["files"]
    for path, label, index, query in zip(paths, labels, indices, is_query, strict=True):
        assert data / path == Path(listing.files[index]) and path.startswith("Img/img/")
        assert Path(path).parent.name == listing.class_names[label]  # the item's folder
        assert (listing.partition[index] == "query") == query
    printed = evaluate_json(capsys, str(folder))
    assert printed["warnings"] == []  # In-shop's queries are other images than its gallery's
    for name, value in record["metrics"].items():
        assert abs(printed[name] - value) <= 1e-9, name


def test_a_learned_scorer_is_refused_unless_euclidean_is_asked_for(tmp_path: Path, capsys):
    path = run_smoke(tmp_path / "results", "pddm_score", "--save-embeddings")
    folder = path.with_suffix(".embeddings")
    meta = json.loads((folder / "embeddings.json").read_text())
    assert meta["ranking"]["ranking"] == "learned_scorer"
    err = one_line_error(capsys, str(folder))
    assert "learned scorer" in err and "--euclidean" in err
    printed = evaluate_json(capsys, str(folder), "--euclidean")
    assert printed["warnings"][0].startswith("warning: ranked by Euclidean distance, not by the "
                                             "run's learned scorer")  # fmt: skip
    embeddings, labels = np.load(folder / "embeddings.npy"), np.load(folder / "labels.npy")
    euclidean = compute_metrics(embeddings, labels, recall_ks=(1, 2), metrics=meta["metrics"])
    assert {k: v for k, v in printed.items() if k != "warnings"} == pytest.approx(euclidean)


def test_identical_query_and_gallery_rows_are_counted(tmp_path: Path, capsys):
    rng = np.random.default_rng(0)
    gallery = rng.normal(size=(20, 4)).astype(np.float32)
    labels = np.arange(20) % 5
    query = np.concatenate([gallery[:3], rng.normal(size=(2, 4)).astype(np.float32)])
    for name, array in {"g": gallery, "gl": labels, "q": query, "ql": labels[:5]}.items():
        np.save(tmp_path / f"{name}.npy", array)
    files = ["--embeddings", str(tmp_path / "g.npy"), "--labels", str(tmp_path / "gl.npy"),
             "--query-embeddings", str(tmp_path / "q.npy"), "--query-labels",
             str(tmp_path / "ql.npy")]  # fmt: skip
    printed = evaluate_json(capsys, *files)
    assert len(printed["warnings"]) == 2  # the copies, then the k-means convention used
    assert printed["warnings"][0].startswith("warning: 3 of 5 query rows are identical to a "
                                             "gallery row")  # fmt: skip
    assert printed["warnings"][1].startswith("note: nmi and f1 from faiss k-means")
    printed = evaluate_json(capsys, "--embeddings", str(tmp_path / "g.npy"), "--labels",
                            str(tmp_path / "gl.npy"))  # fmt: skip
    assert printed["warnings"][0] == ("note: all-vs-all: each of the 20 items queries the other "
                                      "19; it is excluded from its own gallery")  # fmt: skip
    assert len(printed["warnings"]) == 2


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (lambda f: (f / "embeddings.npy").unlink(), "holds no embeddings.npy"),
        (lambda f: (f / "embeddings.json").unlink(), "has no embeddings.json"),
        (lambda f: np.save(f / "labels.npy", np.zeros(5, dtype=np.int64)), "has 96 rows but"),
        (lambda f: np.save(f / "embeddings.npy", _nan_rows(f)), "NaN or inf in 2 of 96 rows"),
        (lambda f: (f / "embeddings.json").write_text("{}"), "not format-1 or format-2 metadata"),
        (lambda f: (f / "paths.txt").write_text("a.png\n"), "but paths.txt has 1 line;"),
    ],
    ids=["no embeddings", "no metadata", "row counts", "NaN rows", "bad metadata", "paths"],
)
def test_a_bad_folder_is_one_line(saved_run: Path, tmp_path: Path, capsys, damage, fragment):
    folder = tmp_path / "seed0.embeddings"
    shutil.copytree(saved_run.with_suffix(".embeddings"), folder)
    damage(folder)
    assert fragment in one_line_error(capsys, str(folder))


def _nan_rows(folder: Path) -> np.ndarray:
    embeddings = np.load(folder / "embeddings.npy")
    embeddings[[3, 7], 0] = np.nan
    return embeddings


def test_folder_and_file_options_do_not_mix(saved_run: Path, tmp_path: Path, capsys):
    folder = str(saved_run.with_suffix(".embeddings"))
    assert "not both" in one_line_error(capsys, folder, "--labels", str(tmp_path / "l.npy"))
    assert "is not a folder" in one_line_error(capsys, str(tmp_path / "nowhere"))
    assert "--embeddings and --labels" in one_line_error(capsys)


def test_a_ray_task_hands_the_embeddings_to_the_driver(tmp_path: Path):
    """What `--engine ray` runs, without Ray: the task returns its record and embeddings
    unwritten, and the driver's write_run writes both, as a local run does."""
    spec = resolve(RunSpec(protocol=load_protocol("smoke"), method="contrastive", seed=0,
                           device="cpu", max_steps=2, workers=0, save_embeddings=True,
                           results_dir=str(tmp_path)))  # fmt: skip
    threads = torch.get_num_threads()
    try:
        out = run_task(spec, threads=1)  # sets the worker's torch threads
    finally:
        torch.set_num_threads(threads)
    path = tmp_path / "runs" / "smoke" / "contrastive" / "seed0.json"
    assert out["status"] == "ok" and not path.exists()
    assert not path.with_suffix(".embeddings").exists()  # nothing written by the task
    assert out["embeddings"].embeddings.shape == (96, 16)
    write_run(path, RunResult.from_json(out["result"]), out["embeddings"])
    files = json.loads(path.read_text())["embeddings"]["files"]
    folder = path.with_suffix(".embeddings")
    assert all(hashlib.sha256((folder / n).read_bytes()).hexdigest() == s for n, s in files.items())
