"""Equal-budget tuning on a real-photo protocol (issue 55): a protocol whose sweep trains on
every training class carves `tuning.validation_fraction` of them for its study, the test
classes are never embedded, and `run --tuned` trains the found configuration under the
protocol itself."""

from __future__ import annotations

import json
import re

import harness.methods  # noqa: F401  (registers the methods)
import numpy as np
import optuna
import pytest
import yaml
from PIL import Image
from test_birds import tiny_protocol
from test_photo_protocols import poisoned_folder

from harness.cli import main
from harness.core import load_protocol
from harness.tune import trial, tune
from harness.tune.options import TuneOptions
from harness.tune.study import tuning_view


def without_tuning(path) -> str:
    """The protocol file's text without its `tuning:` line (the photo protocols set one)."""
    return re.sub(r"^tuning: .*\n", "", path.read_text(), flags=re.M)


def photo_protocol(tmp_path, poisoned: bool = False):
    """Ten classes of coloured photos (3 train, 2 validate, 5 test), a frozen cached trunk and
    tuning.validation_fraction 0.4 (the split itself carves nothing)."""
    base = tiny_protocol(tmp_path, frozen=8)
    rng = np.random.default_rng(1)
    for c in range(6, 10):
        folder = tmp_path / "data" / f"class{c}"
        folder.mkdir(exist_ok=True)
        for i in range(4):
            pixels = (rng.random((72, 72, 3)) * 60 + c * 20).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    text = without_tuning(base) + "tuning: {validation_fraction: 0.4}\n"
    if poisoned:
        poisoned_folder("poisoned_folder_for_tuning")
        text = text.replace("{name: folder, params: {}}",
                            "{name: poisoned_folder_for_tuning, params: {}}")  # fmt: skip
    path = tmp_path / ("poisoned.yaml" if poisoned else "photos.yaml")
    path.write_text(text)
    return path


def trial_values(results_dir, protocol, method):
    storage = f"sqlite:///{results_dir / 'tuning' / protocol.name / 'studies.db'}"
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    return [round(t.value, 6) for t in study.trials]


@pytest.mark.slow
def test_a_photo_protocol_tunes_on_validation_classes_and_runs_tuned_under_itself(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DML_HARNESS_CACHE", str(tmp_path / "cache"))
    data = str(tmp_path / "data")
    clean, dirty = photo_protocol(tmp_path), photo_protocol(tmp_path, poisoned=True)
    protocol = load_protocol(str(clean))
    assert protocol.split.validation_fraction == 0
    assert tuning_view(protocol).split.validation_fraction == 0.4
    assert "tuning" not in protocol.content()  # how tune validates changes no run's hash
    found = {}
    for name, path in (("clean", clean), ("dirty", dirty)):
        options = TuneOptions(results_dir=str(tmp_path / name), data_root=data, device="cpu")
        overlays = tune(str(path), ["contrastive"], 3, options)
        found[name] = yaml.safe_load(overlays["contrastive"].read_text())
    clean_values = trial_values(tmp_path / "clean", protocol, "contrastive")
    dirty_values = trial_values(tmp_path / "dirty", load_protocol(str(dirty)), "contrastive")
    # the trials' data (prepared once, in memory) holds the 5 training classes only: the
    # trunk never embedded a test photo
    ((prepared, split),) = trial._PREPARED.values()
    assert len(np.unique(prepared.labels)) == 5 and len(split.test) == 0
    # the test classes (poisoned: one image repeated, labels shuffled) change no trial value
    assert clean_values == dirty_values and len(clean_values) == 3
    assert found["clean"]["hyperparameters"] == found["dirty"]["hyperparameters"]
    # the first trial is the paper default
    assert found["clean"]["study"]["paper_default_value"] == clean_values[0]
    # the overlay belongs to the protocol the tuned run trains under, and names its carve
    assert found["clean"]["protocol_hash"] == protocol.hash
    assert found["clean"]["study"]["validated_under"]["split"]["validation_fraction"] == 0.4
    assert main(["run", "--protocol", str(clean), "--method", "contrastive", "--tuned",
                 "--seeds", "0", "--data-root", data,
                 "--results-dir", str(tmp_path / "clean")]) == 0  # fmt: skip
    result = json.loads((tmp_path / "clean/runs" / protocol.name / "contrastive+tuned/seed0.json")
                        .read_text())  # fmt: skip
    assert result["protocol"]["hash"] == protocol.hash


def test_tuning_a_protocol_without_validation_classes_is_one_line(tmp_path, capsys):
    path = tiny_protocol(tmp_path, frozen=8)
    path.write_text(without_tuning(path))
    assert main(["tune", "--protocol", str(path), "--method", "contrastive", "--trials", "2",
                 "--data-root", str(tmp_path / "data"),
                 "--results-dir", str(tmp_path / "r")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "set tuning.validation_fraction" in err[0], err
    assert not (tmp_path / "r").exists()
