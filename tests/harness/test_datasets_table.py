"""The leaderboard's datasets table (harness.report.datasets_table) on a hand-worked example:
two pretrained protocols, one tuned and one not, and a from-scratch one that has no row."""

from __future__ import annotations

from harness.records import RunResult
from harness.report.datasets_table import dataset_row, datasets_section

SPLIT = {"train_classes": 3, "validation_classes": 0, "test_classes": 4, "train_images": 30,
         "validation_images": 0, "test_images": 1200}  # fmt: skip


def result(protocol: str, method: str, seed: int, value: float, tuned: bool = False,
           pretrained: bool = True, dataset: str = "plankton") -> RunResult:  # fmt: skip
    record = {
        "schema": 2, "status": "ok", "seed": seed,
        "protocol": {"name": protocol, "version": 1, "hash": protocol,
                     "content": {"backbone": {"pretrained": "imagenet" if pretrained else "none"}}},
        "method": {"name": method, "version": 1, "hyperparameters": {"x": 2 if tuned else 1}},
        "training": {"max_steps": None, "steps": 0 if method == "untrained" else 10},
        "metrics": {"map@r": value}, "split": SPLIT,
        "dataset": {"name": dataset, "source": dataset},
    }  # fmt: skip
    if tuned:
        record["tuning"] = {"trials": 20}
    return RunResult.from_json(record)


def protocol(name: str, values: dict[str, list[float]], tuned: dict[str, list[float]],
             **kw) -> list[RunResult]:  # fmt: skip
    out = [result(name, m, s, v, **kw) for m, vs in values.items() for s, v in enumerate(vs)]
    return out + [result(name, m, s, v, True, **kw) for m, vs in tuned.items()
                  for s, v in enumerate(vs)]  # fmt: skip


def test_the_best_tuned_method_and_its_gain_over_zero_shot_are_worked_by_hand():
    # zero-shot 0.40; a: 0.42 at its default, 0.50 tuned; b: 0.46, never tuned
    runs = protocol("p", {"untrained": [0.40, 0.40], "a": [0.41, 0.43], "b": [0.45, 0.47]},
                    {"a": [0.49, 0.51]})  # fmt: skip
    row = dataset_row("p", runs)
    assert row is not None
    assert (row["best"], round(row["best_value"], 6), round(row["zero_shot"], 6)) == (
        "a",
        50.0,
        40.0,
    )
    assert (row["train"], row["test"], row["photos"], row["tuned"]) == (3, 4, 1230, True)
    assert row["domain"].startswith("plankton")


def test_rows_run_from_the_smallest_gain_and_an_untuned_protocol_says_defaults():
    groups = {
        "big": protocol("big", {"untrained": [0.10, 0.10], "a": [0.30, 0.30]}, {"a": [0.35, 0.35]},
                        dataset="cars196_mini"),
        "small": protocol("small", {"untrained": [0.60, 0.60], "a": [0.61, 0.61]}, {},
                          dataset="caltech101"),
        "scratch": protocol("scratch", {"untrained": [0.1, 0.1], "a": [0.2, 0.2]}, {},
                            pretrained=False),
    }  # fmt: skip
    lines = datasets_section(groups).splitlines()
    table = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert [line.split(" | ")[0] for line in table] == ["| small", "| big"]
    assert table[0].endswith("| 60.0 | 61.0 (a) (*defaults*) | +1.0 |")
    assert table[1].endswith("| 10.0 | 35.0 (a) | +25.0 |")
    assert "`caltech101` | everyday objects" in table[0]
    assert datasets_section({"scratch": groups["scratch"]}) == ""
