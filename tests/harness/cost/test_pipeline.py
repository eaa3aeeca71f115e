"""`cost --pipeline` on a generated CUB-200-2011 tree of realistic 500 x 375 JPEGs: images per
second for each worker count and the data-wait share of a training step, as one JSON object."""

from __future__ import annotations

import json

import pytest
import yaml
from jpeg_tree import cub_jpegs

from harness.cli import main
from harness.cost.pipeline import ROUNDS, whole_waves

PROTOCOL = {
    "schema": 1, "name": "cub_pipeline", "version": 1, "description": "pipeline test",
    "dataset": {"name": "cub200"}, "split": {"official": True},
    "backbone": {"name": "conv4", "input_size": 224, "pretrained": "none",
                 "params": {"width": 8}},
    # batches of 2 x 2: every image is a 500 x 375 JPEG decoded and cropped to 224 px, 5
    # rounds of 24 batches per worker count; the record's form does not depend on the size
    "embedding_dim": 16, "sampler": {"classes_per_batch": 2, "images_per_class": 2},
    "budget": {"epochs": 1}, "seeds": [0],
    "augmentation": {
        "load_size": 256,
        "train": [{"op": "random_resized_crop", "size": 224, "scale": [0.2, 1.0]},
                  {"op": "horizontal_flip"}],
        "test": [{"op": "center_crop", "size": 224}],
    },
}  # fmt: skip


@pytest.mark.slow
def test_cost_pipeline_reports_images_per_second_per_worker_count(tmp_path, capsys):
    root = cub_jpegs(tmp_path / "data", train_classes=12, test_classes=4, per_class=8)
    protocol = tmp_path / "cub_pipeline.yaml"
    protocol.write_text(yaml.safe_dump(PROTOCOL))
    args = ["cost", "--pipeline", "--protocol", str(protocol), "--data-root", str(root),
            "--workers", "0,1", "--steps", "2", "--results-dir", str(tmp_path), "--json"]  # fmt: skip
    assert main(["-q", *args]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [row["workers"] for row in record["pipeline"]] == [0, 1]
    assert [row["batches"] for row in record["pipeline"]] == [24, 24]
    for row in record["pipeline"]:
        assert row["images_per_second"] == max(row["rounds"]) > 0 and len(row["rounds"]) == ROUNDS
    slow, fast = record["pipeline"]
    assert slow["speedup"] == 1.0
    assert fast["speedup"] == round(fast["images_per_second"] / slow["images_per_second"], 2)
    assert 0 <= record["data_wait_share"] < 1
    assert record["training"]["workers"] == 1 and "random" in record["training"]["backbone_weights"]
    assert (record["load_size"], record["input_size"]) == (256, 224)
    assert record["augmentation"] == ["random_resized_crop", "horizontal_flip"]
    saved = json.loads((tmp_path / "cost/pipeline/cub_pipeline.json").read_text())
    assert saved["pipeline"] == record["pipeline"]


def test_bad_worker_counts_are_one_line_errors(capsys):
    assert main(["cost", "--pipeline", "--protocol", "smoke", "--workers", "two"]) == 2
    assert "--workers: expected comma-separated integers" in capsys.readouterr().err


def test_each_worker_count_is_timed_on_whole_waves_of_batches():
    """16 workers take two batch-times for 24 batches as for 32: 24 would read 25 % low."""
    assert [whole_waves(24, w) for w in (0, 1, 2, 4, 8, 16, 5)] == [24, 24, 24, 24, 24, 32, 25]
