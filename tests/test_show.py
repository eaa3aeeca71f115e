"""What the model retrieves: the grid's row selection on a hand-made example, the saved
neighbours as the run's own ranking (Euclidean, and a learned scorer's), `show` end to end
(pixel size, green and red frames) and its one-line refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from harness.cli import main
from harness.core import load_protocol
from harness.core.page_style import CORRECT_COLOUR, WRONG_COLOUR
from harness.data import prepare_data
from harness.evaluate import top_neighbours
from harness.evaluate.retrieval_rows import RowChoice, select_rows
from harness.report.retrieval import DPI, cell_rect, grid_size

pytestmark = pytest.mark.xdist_group("show")
QUICK = ["--device", "cpu", "--workers", "0"]


def test_rows_are_the_worst_the_best_then_random_ones():
    ap = np.array([0.5, 0.1, 0.9, 0.1, np.nan, 0.7, 0.3])
    query_labels = np.array([0, 1, 2, 1, 3, 0, 2])
    gallery_labels = np.array([0, 1, 2, 3])
    neighbours = np.array([[0, 1, 2], [1, 0, 2], [3, 2, 1], [0, 1, 3],
                           [3, 0, 1], [1, 0, 2], [2, 2, 0]])  # fmt: skip
    rows = select_rows(ap, neighbours, query_labels, gallery_labels,
                       RowChoice(k=2, worst=2, best=1, random=10, seed=0))  # fmt: skip
    # the tie at 0.1 goes to the lower index; 4 (NaN: alone in its class) is never chosen
    assert [(r.query, r.kind) for r in rows] == [
        (1, "worst"), (3, "worst"), (2, "best"), (0, "random"), (5, "random"), (6, "random")]  # fmt: skip
    assert rows[0].neighbours == (1, 0) and rows[0].correct == (True, False)
    assert rows[1].correct == (False, True) and rows[2].correct == (False, True)
    assert rows[2].average_precision == 0.9
    # reproducible: the same seed draws the same random rows, another seed may not
    three = RowChoice(k=2, worst=0, best=0, random=2, seed=3)
    again = select_rows(ap, neighbours, query_labels, gallery_labels, three)
    assert again == select_rows(ap, neighbours, query_labels, gallery_labels, three)
    assert len(again) == 2 and all(r.kind == "random" for r in again)


def test_top_neighbours_on_a_line():
    points = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
    assert top_neighbours(points, None, 2).tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]
    gallery = torch.tensor([[2.0], [-1.0], [10.0]])
    assert top_neighbours(points[:2], gallery, 3).tolist() == [[1, 0, 2], [0, 1, 2]]
    # a scorer ranks instead: higher is closer
    farthest = top_neighbours(points, None, 1, scorer=lambda q, g: torch.cdist(q, g))
    assert farthest.tolist() == [[3], [3], [3], [0]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Smoke runs of a Euclidean method and a learned-scorer one, with --save-embeddings."""
    results = tmp_path_factory.mktemp("show")
    assert main(["-q", "run", "--protocol", "smoke", "--method", "contrastive,pddm_score",
                 "--max-steps", "2", "--results-dir", str(results), "--save-embeddings",
                 *QUICK]) == 0  # fmt: skip
    return results / "runs" / "smoke"


def _load(folder: Path) -> dict[str, np.ndarray]:
    return {p.stem: np.load(p) for p in folder.glob("*.npy")}


def test_saved_neighbours_are_the_euclidean_ranking(runs: Path):
    folder = runs / "contrastive" / "seed0.embeddings"
    saved, meta = _load(folder), json.loads((folder / "embeddings.json").read_text())
    emb = saved["embeddings"].astype(np.float64)
    distances = ((emb[:, None] - emb[None]) ** 2).sum(-1)
    np.fill_diagonal(distances, np.inf)
    brute = np.argsort(distances, axis=1, kind="stable")[:, :10]
    assert meta["neighbours"] == 10 and meta["average_precision"] == "map@r"
    assert saved["neighbours"].shape == (96, 10) and (saved["neighbours"] == brute).all()
    # each row's image: the saved labels are the dataset's at the saved indices
    data = prepare_data(load_protocol("smoke"), None).data
    assert (data.labels[saved["indices"]] == saved["labels"]).all()
    metrics = json.loads((runs / "contrastive" / "seed0.json").read_text())["metrics"]
    assert np.nanmean(saved["average_precision"]) == pytest.approx(metrics["map@r"], abs=1e-12)


def test_saved_neighbours_of_a_learned_scorer_are_its_own_ranking(runs: Path):
    folder = runs / "pddm_score" / "seed0.embeddings"
    saved, meta = _load(folder), json.loads((folder / "embeddings.json").read_text())
    record = json.loads((runs / "pddm_score" / "seed0.json").read_text())
    assert meta["ranking"]["ranking"] == "learned_scorer"
    assert meta["ranking"]["pair_scores"] == 96 * 96  # the extra pass is not counted
    labels, top = saved["labels"], saved["neighbours"]
    precision_at_1 = float((labels[top[:, 0]] == labels).mean())  # every smoke query has R > 0
    assert precision_at_1 == pytest.approx(record["metrics"]["precision@1"], abs=1e-12)
    assert precision_at_1 == pytest.approx(record["metrics"]["recall@1"], abs=1e-12)
    recall_2 = float((labels[top[:, :2]] == labels[:, None]).any(1).mean())
    assert recall_2 == pytest.approx(record["metrics"]["recall@2"], abs=1e-12)
    assert np.nanmean(saved["average_precision"]) == pytest.approx(record["metrics"]["map@r"])
    euclidean = top_neighbours(torch.as_tensor(saved["embeddings"]), None, 10)
    assert (top != euclidean).any()  # the scorer's order, not the embeddings' distances


def _pixel(image: np.ndarray, rows: int, k: int, row: int, column: int) -> np.ndarray:
    """The RGB at the middle of a cell's left frame line."""
    left, bottom, _, height = cell_rect(rows, k, row, column)
    x = int(round(left * image.shape[1]))
    y = int(round((1.0 - bottom - height / 2) * image.shape[0]))
    return image[y, x, :3]


def test_show_draws_the_grid_with_green_and_red_frames(runs: Path, tmp_path: Path, capsys):
    result = runs / "contrastive" / "seed0.json"
    out = tmp_path / "grid.png"
    capsys.readouterr()
    assert main(["show", str(result), "--k", "5", "--worst", "1", "--best", "1", "--random",
                 "1", "--seed", "0", "--out", str(out)]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == str(out)
    image = imread(out)
    width, height = grid_size(3, 5)
    assert abs(image.shape[1] - width * DPI) <= 1 and abs(image.shape[0] - height * DPI) <= 1
    saved = _load(result.with_suffix(".embeddings"))
    rows = select_rows(saved["average_precision"], saved["neighbours"], saved["labels"],
                       saved["labels"], RowChoice(k=5, worst=1, best=1, random=1, seed=0))  # fmt: skip
    cells = [(r, c + 1, ok) for r, row in enumerate(rows) for c, ok in enumerate(row.correct)]
    for wanted, colour in ((True, CORRECT_COLOUR), (False, WRONG_COLOUR)):
        r, c, _ = next(cell for cell in cells if cell[2] is wanted)
        assert np.allclose(_pixel(image, 3, 5, r, c), to_rgb(colour), atol=0.02), (r, c)
    # the default: beside the run
    assert main(["show", str(result.with_suffix(".embeddings")), "--k", "2", "--worst", "1",
                 "--best", "0", "--random", "0"]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == str(runs / "contrastive" / "seed0.retrieval.png")


def _format_1(folder: Path) -> None:
    """Make a saved folder look like one written before format 2."""
    meta = json.loads((folder / "embeddings.json").read_text())
    for name in ("indices", "neighbours", "average_precision"):
        (folder / f"{name}.npy").unlink()
        meta["files"].remove(f"{name}.npy")
        meta.pop(name, None)
    meta["format"] = 1
    (folder / "embeddings.json").write_text(json.dumps(meta))


def test_an_older_euclidean_folder_still_shows_and_evaluates(runs: Path, tmp_path: Path, capsys):
    folder = tmp_path / "seed0.embeddings"
    shutil.copytree(runs / "contrastive" / "seed0.embeddings", folder)
    _format_1(folder)
    capsys.readouterr()
    assert main(["show", str(folder), "--k", "3", "--worst", "1", "--best", "1", "--random",
                 "0"]) == 0  # fmt: skip
    assert (tmp_path / "seed0.retrieval.png").is_file()
    assert main(["evaluate", str(folder), "--json"]) == 0
    metrics = json.loads((runs / "contrastive" / "seed0.json").read_text())["metrics"]
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert printed["map@r"] == pytest.approx(metrics["map@r"], abs=1e-9)


def one_line_error(capsys, *args: str) -> str:
    """`show ...` that must fail: exit 2 and one `error:` line, returned."""
    capsys.readouterr()
    assert main(["show", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_bad_inputs_are_one_line(runs: Path, tmp_path: Path, capsys):
    result = runs / "contrastive" / "seed0.json"
    unsaved = tmp_path / "unsaved" / "seed0.json"
    unsaved.parent.mkdir()
    record = json.loads(result.read_text())
    record.pop("embeddings")
    unsaved.write_text(json.dumps(record))
    assert "--save-embeddings" in one_line_error(capsys, str(unsaved))
    assert "is not a run's result" in one_line_error(capsys, str(tmp_path / "nowhere.txt"))
    assert "not a seed<k>.embeddings folder" in one_line_error(capsys, str(tmp_path))
    assert "more than the 95 gallery images" in one_line_error(capsys, str(result), "--k", "96")
    # a learned scorer's folder without neighbours.npy: its ranking cannot be remade
    learned = tmp_path / "learned" / "seed0.embeddings"
    shutil.copytree(runs / "pddm_score" / "seed0.embeddings", learned)
    _format_1(learned)
    assert "learned scorer" in one_line_error(capsys, str(learned))
    # saved rows whose labels are not the data's at their indices: other data
    other = tmp_path / "other" / "seed0.embeddings"
    shutil.copytree(runs / "contrastive" / "seed0.embeddings", other)
    np.save(other / "indices.npy", np.load(other / "indices.npy") - 96)
    assert "is not what this run used" in one_line_error(capsys, str(other))
