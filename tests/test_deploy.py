"""From the verdict to a model in use, end to end on real bird photos: `run --save-model`
keeps the whole network (a frozen, cached trunk with its trained tail and head), `export`
writes ONNX and TorchScript files that embed the photos as the harness does, `index` builds a
catalogue of a photo folder and updates it, `search` finds photos; and every bad input is one
line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from harness.backbones import build_backbone
from harness.cli import main
from harness.core import Embedded, HarnessError, load_protocol
from harness.deploy.export import (
    check_parity,
    cosine_gap,
    read_metadata,
    run_exported,
)
from harness.deploy.images import embed_files, image_files, preprocess
from harness.deploy.model import KeptModel, load_model, read_model, state_sha256, write_model

REPO = Path(__file__).resolve().parent.parent
CUB100 = REPO.parent / "shared" / "data" / "cub100"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("deploy"),  # one worker trains the module's run once
    pytest.mark.skipif(
        not (CUB100 / "cub100.zip").is_file(), reason=f"cub100.zip not present in {CUB100}"
    ),  # fmt: skip
]
# 4 cub100 species; the trunk frozen to stage 6 and cached, so stages 6-7 and the head train
PROTOCOL = {
    "schema": 1, "name": "tiny_photos", "version": 1,
    "dataset": {"name": "cub100", "params": {"classes": 4}},
    "split": {"train_fraction": 0.5},
    "backbone": {"name": "efficientnet_lite0", "input_size": 224, "pretrained": "imagenet",
                 "frozen_batchnorm": True, "channels_last": True},
    "features": {"frozen_stages": 6, "train_views": 1, "view_seed": 0},
    "embedding_dim": 32,
    "sampler": {"classes_per_batch": 2, "images_per_class": 4},
    "optimizer": {"name": "adam", "lr": 0.001}, "budget": {"epochs": 1},
    "evaluation": {"recall_ks": [1, 4]}, "seeds": [0],
    "augmentation": {"load_size": 227,
                     "train": [{"op": "random_resized_crop", "size": 224, "scale": [0.16, 1.0]}],
                     "test": [{"op": "center_crop", "size": 224}]},
}  # fmt: skip
PHOTOS = 24  # test photos in the catalogue


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One arcface run with --save-model and --save-embeddings, and a folder of PHOTOS of
    its test photos (extracted from cub100.zip as they are)."""
    root = tmp_path_factory.mktemp("deploy")
    (root / "tiny_photos.yaml").write_text(yaml.safe_dump(PROTOCOL))
    code = main(["-q", "run", "--protocol", str(root / "tiny_photos.yaml"), "--method", "arcface",
                 "--seeds", "0", "--max-steps", "4", "--save-model", "--save-embeddings",
                 "--results-dir", str(root / "results")])  # fmt: skip
    assert code == 0
    result = root / "results" / "runs" / "tiny_photos" / "arcface" / "seed0.json"
    saved = result.with_suffix(".embeddings")
    paths = (saved / "paths.txt").read_text().splitlines()
    photos = root / "photos"
    with zipfile.ZipFile(CUB100 / "cub100.zip") as archive:
        for name in paths[:: len(paths) // PHOTOS][:PHOTOS]:
            target = photos / Path(name).relative_to("bird_dataset/images")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(name))
    return {"root": root, "result": result, "model": result.with_suffix(".model.pt"),
            "saved": saved, "paths": paths, "photos": photos}  # fmt: skip


def _photos_and_saved(kept: dict) -> tuple[list[str], np.ndarray]:
    """The catalogue photos (relative to the folder) and the run's own test embeddings of them."""
    files = image_files(kept["photos"])
    saved = np.load(kept["saved"] / "embeddings.npy")
    rows = [kept["paths"].index(f"bird_dataset/images/{name}") for name in files]
    return files, saved[rows]


def test_the_kept_model_embeds_photos_as_the_run_evaluated_them(kept):
    record = json.loads(kept["result"].read_text())["model"]
    model = load_model(kept["model"])
    assert record["file"] == "seed0.model.pt" and record["bytes"] == kept["model"].stat().st_size
    assert record["weights_sha256"] == model.weights_sha256
    assert model.meta["provenance"]["protocol"]["hash"] == load_protocol(
        str(kept["root"] / "tiny_photos.yaml")).hash  # fmt: skip
    # the whole network on raw photos == the run's tail + head on its cached trunk outputs
    files, saved = _photos_and_saved(kept)
    ours = embed_files(model, kept["photos"], files, progress=False).vectors
    assert cosine_gap(ours, saved) < 1e-4
    # the trained stages are in it, not the ImageNet ones they started from
    imagenet = build_backbone(load_protocol(str(kept["root"] / "tiny_photos.yaml")).backbone, 3)
    for stage in (6, 7):
        trained = model.embedder.backbone.stages[stage].state_dict()
        start = imagenet.stages[stage].state_dict()
        assert any(not torch.equal(trained[k], start[k]) for k in trained), stage
    for stage in range(6):  # the frozen trunk is ImageNet's
        trained = model.embedder.backbone.stages[stage].state_dict()
        assert all(
            torch.equal(v, imagenet.stages[stage].state_dict()[k]) for k, v in trained.items()
        )


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_embeds_real_photos_as_the_harness_does(kept, fmt, tmp_path):
    out = tmp_path / f"model.{fmt}"
    assert main(["-q", "export", str(kept["result"]), "--format", fmt, "--out", str(out)]) == 0
    model = load_model(kept["model"])
    files, saved = _photos_and_saved(kept)
    pre = model.preprocessing
    images = torch.stack([preprocess(kept["photos"] / name, pre) for name in files]).numpy()
    exported = run_exported(out, fmt, images)
    with torch.no_grad():
        harness_now = model.embedder(torch.from_numpy(images)).numpy()
    assert cosine_gap(exported, harness_now) < 1e-4 and cosine_gap(exported, saved) < 1e-4
    meta = read_metadata(out, fmt)
    assert meta["weights_sha256"] == model.weights_sha256
    assert meta["preprocessing"]["load_size"] == 227
    assert meta["preprocessing"]["test_ops"] == [{"op": "center_crop", "size": 224}]
    assert meta["preprocessing"]["exif_transpose"] is True  # a service turns photos upright too


def test_the_parity_check_catches_a_wrong_normalisation_and_a_missing_head(kept, tmp_path):
    model = load_model(kept["model"])
    files, saved = _photos_and_saved(kept)
    images = torch.stack([preprocess(kept["photos"] / n, model.preprocessing) for n in files])
    wrong = load_model(kept["model"])
    wrong.embedder.backbone.std.fill_(1.0)  # no division by ImageNet's std
    export_model_unchecked = tmp_path / "wrong.pt"
    with torch.no_grad():
        traced = torch.jit.trace(wrong.embedder, (images[:2],), check_trace=False)
    torch.jit.save(traced, str(export_model_unchecked))
    with pytest.raises(HarnessError, match="embeds differently"):
        check_parity(saved, run_exported(export_model_unchecked, "torchscript", images.numpy()),
                     "torchscript")  # fmt: skip
    wrong.embedder.head = Headless()  # the backbone's pooled features, no embedding layer
    with torch.no_grad():
        headless = torch.jit.trace(wrong.embedder, (images[:2],), check_trace=False)
    torch.jit.save(headless, str(tmp_path / "headless.pt"))
    with pytest.raises(HarnessError, match=r"returns \(24, 1280\), the harness \(24, 32\)"):
        check_parity(saved, run_exported(tmp_path / "headless.pt", "torchscript",
                                          images.numpy()), "torchscript")  # fmt: skip


class Headless(torch.nn.Module):
    def forward(self, features: list[torch.Tensor]) -> Embedded:
        return Embedded(features[-1])


def _index(kept: dict, out: Path, *extra: str) -> int:
    return main(["-q", "index", str(kept["model"]), "--images", str(kept["photos"]), "--out",
                 str(out), *extra])  # fmt: skip


def test_index_and_search_find_a_photo_and_its_class(kept, tmp_path, capsys):
    out = tmp_path / "index"
    assert _index(kept, out) == 0
    header = json.loads((out / "catalogue.json").read_text())
    assert header["count"] == PHOTOS and header["index"] == "flat"
    query = kept["photos"] / image_files(kept["photos"])[5]
    capsys.readouterr()
    page = tmp_path / "page.html"
    assert main(["search", str(out), str(query), "-k", "4", "--json", "--html", str(page)]) == 0
    found = json.loads(capsys.readouterr().out)["queries"][0]["results"]
    assert found[0]["path"] == image_files(kept["photos"])[5] and found[0]["distance"] < 1e-3
    assert [r["rank"] for r in found] == [1, 2, 3, 4]
    assert all(a["distance"] <= b["distance"] for a, b in zip(found, found[1:], strict=False))
    assert page.read_text().count("<img ") == 5


def test_a_photo_stored_sideways_finds_its_upright_self(kept, tmp_path, capsys):
    """A phone's JPEG: the pixels stored turned a quarter (90 degrees counter-clockwise) with
    EXIF orientation 6, which every viewer turns upright; `search` finds the upright photo
    first, as its owner would, and the kept model and its export record the step."""
    from PIL import Image

    out = tmp_path / "index"
    assert _index(kept, out) == 0
    name = image_files(kept["photos"])[5]
    with Image.open(kept["photos"] / name) as photo:
        upright = np.asarray(photo.convert("RGB"))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the viewer turns it 90 degrees clockwise
    sideways = Image.fromarray(np.rot90(upright).copy())
    sideways.save(tmp_path / "tagged.jpg", quality=100, subsampling=0, exif=exif)
    sideways.save(tmp_path / "untagged.jpg", quality=100, subsampling=0)  # the control
    capsys.readouterr()
    assert main(["search", str(out), str(tmp_path / "tagged.jpg"), str(tmp_path / "untagged.jpg"),
                 "-k", "3", "--json"]) == 0  # fmt: skip
    tagged, untagged = (q["results"] for q in json.loads(capsys.readouterr().out)["queries"])
    assert tagged[0]["path"] == name and tagged[0]["distance"] < 0.05, tagged  # JPEG noise
    assert not [hit for hit in untagged if hit["path"] == name and hit["distance"] < 0.05]
    assert load_model(kept["model"]).preprocessing["exif_transpose"] is True


def test_an_unchanged_folder_writes_nothing_and_a_changed_one_is_updated(kept, tmp_path):
    photos = tmp_path / "photos"
    shutil.copytree(kept["photos"], photos)
    local = dict(kept, photos=photos)
    out, fresh = tmp_path / "index", tmp_path / "fresh"
    assert _index(local, out) == 0
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert _index(local, out) == 0
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp
    names = image_files(photos)
    (photos / names[0]).unlink()
    shutil.copy(photos / names[1], photos / "new.jpg")
    assert _index(local, out) == 0
    header = json.loads((out / "catalogue.json").read_text())
    assert header["count"] == PHOTOS and header["next_id"] == PHOTOS + 1
    rows = [line.split("\t") for line in (out / "files.tsv").read_text().splitlines()]
    assert [r[3] for r in rows] == image_files(photos) and names[0] not in [r[3] for r in rows]
    assert dict((r[3], int(r[0])) for r in rows)["new.jpg"] == PHOTOS  # a new id
    # an index made afresh from the same folder holds the same rows and vectors
    assert _index(local, fresh) == 0
    again = dict((r[3], r[1]) for r in rows)
    fresh_rows = [line.split("\t") for line in (fresh / "files.tsv").read_text().splitlines()]
    assert again == {r[3]: r[1] for r in fresh_rows}
    # (both in path order; the added photo was embedded in a batch of its own: float rounding)
    np.testing.assert_allclose(np.load(out / "vectors.npy"), np.load(fresh / "vectors.npy"),
                               atol=1e-5)  # fmt: skip
    assert _index(local, tmp_path / "fresh2") == 0  # a rebuild: the same bytes
    for name in ("files.tsv", "vectors.npy", "index.faiss"):
        assert (fresh / name).read_bytes() == (tmp_path / "fresh2" / name).read_bytes()


def test_undecodable_files_are_skipped_and_counted_in_one_warning(kept, tmp_path, caplog):
    photos = tmp_path / "photos"
    shutil.copytree(kept["photos"], photos)
    for n in range(5):
        (photos / f"broken{n}.jpg").write_bytes(b"not a jpeg")
    assert _index(dict(kept, photos=photos), tmp_path / "index") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["skipped 5 file(s) that could not be decoded: broken0.jpg, "
                        "broken1.jpg, broken2.jpg and 2 more"]  # fmt: skip
    assert json.loads((tmp_path / "index" / "catalogue.json").read_text())["count"] == PHOTOS


def _other_model(kept: dict, path: Path) -> Path:
    """The kept model with one weight changed: another model."""
    other = read_model(kept["model"])
    state = dict(other.state)
    name = next(k for k in state if k.startswith("head."))
    state[name] = state[name] + 1
    write_model(path, KeptModel(dict(other.meta, weights_sha256=state_sha256(state)), state))
    return path


def _one_line_exit_2(capsys, argv: list[str], says: str) -> None:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and says in err, err


def test_bad_input_is_one_line_exit_2_and_nothing_written(kept, tmp_path, capsys):
    (tmp_path / "text.pt").write_text("hello")
    data = kept["model"].read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    torch.save({"weight": torch.ones(2)}, tmp_path / "state_dict.pt")
    out = tmp_path / "out"
    for bad, says in [("text.pt", "is not a model saved by"), ("truncated.pt", "truncated"),
                      ("state_dict.pt", "no `dml-harness embedding model` header")]:  # fmt: skip
        _one_line_exit_2(capsys, ["export", str(tmp_path / bad), "--format", "onnx", "--out",
                                  str(out / "m.onnx")], says)  # fmt: skip
        _one_line_exit_2(capsys, ["index", str(tmp_path / bad), "--images",
                                  str(kept["photos"]), "--out", str(out)], says)  # fmt: skip
    _one_line_exit_2(capsys, ["export", str(kept["model"]), "--format", "tflite", "--out",
                              str(out / "m")], "invalid choice: 'tflite'")  # fmt: skip
    (tmp_path / "empty").mkdir()
    _one_line_exit_2(capsys, ["index", str(kept["model"]), "--images", str(tmp_path / "empty"),
                              "--out", str(out)], "holds no images")  # fmt: skip
    _one_line_exit_2(capsys, ["index", str(kept["model"]), "--images", str(kept["photos"]),
                              "--out", str(out), "--kind", "hnsw:Q=3"], "hnsw parameter")  # fmt: skip
    assert not out.exists()
    index = tmp_path / "index"
    assert _index(kept, index) == 0
    stamp = {p.name: p.read_bytes() for p in index.iterdir()}
    other = _other_model(kept, tmp_path / "other.model.pt")
    _one_line_exit_2(capsys, ["index", str(other), "--images", str(kept["photos"]), "--out",
                              str(index)], "was made by another model")  # fmt: skip
    query = kept["photos"] / image_files(kept["photos"])[0]
    _one_line_exit_2(capsys, ["search", str(index), str(query), "--model", str(other)],
                     "was made by another model")  # fmt: skip
    (tmp_path / "query.jpg").write_bytes(b"\xff\xd8 not really")
    _one_line_exit_2(capsys, ["search", str(index), str(tmp_path / "query.jpg"), "--html",
                              str(tmp_path / "page.html")], "cannot decode")  # fmt: skip
    assert {p.name: p.read_bytes() for p in index.iterdir()} == stamp
    assert not (tmp_path / "page.html").exists()


def test_a_finished_run_is_not_rerun_for_its_model(kept, caplog):
    result = kept["result"]
    model_file = kept["model"]
    before = result.read_bytes()
    hidden = model_file.with_name("hidden.pt")
    model_file.rename(hidden)
    try:
        assert main(["run", "--protocol", str(kept["root"] / "tiny_photos.yaml"), "--method",
                     "arcface", "--seeds", "0", "--max-steps", "4", "--save-model",
                     "--results-dir", str(kept["root"] / "results")]) == 0  # fmt: skip
        assert result.read_bytes() == before and not model_file.exists()
        assert any("without a saved model" in r.getMessage() and "--force" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
    finally:
        hidden.rename(model_file)


def test_rerank_scores_saved_runs_and_resumes(kept, tmp_path, capsys):
    out = tmp_path / "reranking"
    argv = ["-q", "rerank", "--results-dir", str(kept["root"] / "results"), "--protocols",
            "tiny_photos", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("1 run(s) scored")
    record = json.loads((out / "tiny_photos" / "arcface" / "reranked-seed0.json").read_text())
    assert record["matches_run"] and record["rows"] == len(kept["paths"])
    assert set(record["metrics"]) == {"none", "k_reciprocal:k1=20,k2=6,lambda=0.3",
                                      "aqe_dba:alpha=3,n=2"}  # fmt: skip
    # the same numbers as `evaluate DIR --rerank` gives for the run's saved embeddings
    assert main(["evaluate", str(kept["saved"]), "--rerank", "k_reciprocal", "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    for name, value in record["metrics"]["k_reciprocal:k1=20,k2=6,lambda=0.3"].items():
        assert evaluated[name] == pytest.approx(value, abs=1e-12), name
    assert "## tiny_photos (v1, hash " in (out / "RERANKING.md").read_text()
    assert main(argv) == 0 and capsys.readouterr().out.startswith("0 run(s) scored")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_embeds_photos_as_the_cpu_does(kept):
    files = image_files(kept["photos"])
    cpu = embed_files(load_model(kept["model"]), kept["photos"], files, progress=False)
    gpu = embed_files(load_model(kept["model"]), kept["photos"], files, progress=False,
                      device=torch.device("cuda"))  # fmt: skip
    assert gpu.files == cpu.files and cosine_gap(gpu.vectors, cpu.vectors) < 1e-4


def test_a_missing_model_or_index_is_named_with_a_command_that_runs(tmp_path, capsys):
    """MODEL that does not exist is said to be missing (not "no saved model beside it"); a
    folder that is not an index names `python -m harness index ...` into it."""
    for missing in ("seed0.json", "seed0.model.pt"):
        for argv in (["index", str(tmp_path / missing), "--images", str(tmp_path), "--out",
                      str(tmp_path / "out")], ["export", str(tmp_path / missing), "--format",
                      "onnx", "--out", str(tmp_path / "m.onnx")]):  # fmt: skip
            _one_line_exit_2(capsys, argv, f"{tmp_path / missing} does not exist; give a run's")
    capsys.readouterr()
    assert main(["index", str(tmp_path / "seed0.json"), "--images", str(tmp_path), "--out",
                 str(tmp_path / "out")]) == 2  # fmt: skip
    assert "no saved model beside it" not in capsys.readouterr().err
    _one_line_exit_2(capsys, ["search", str(tmp_path), str(tmp_path / "q.jpg")],
                     f"make one with `python -m harness index MODEL --images FOLDER --out "
                     f"{tmp_path}`")  # fmt: skip
    assert not (tmp_path / "out").exists()
