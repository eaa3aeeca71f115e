"""The bad-input corpus: each case must end in exactly one line `error: ...` that says what is
wrong (and usually how to fix it), exit status 2, and no traceback. Cases run in-process
through the CLI's main(); tests/harness/test_cli.py checks a few of them as real processes."""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]
SMOKE = yaml.safe_load((REPO / "protocols" / "smoke.yaml").read_text())
PNG_1PX = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010800000000"
    "3a7e9b550000000a49444154789c63f80f00010101001e2e1c340000000049454e44ae426082"
)


def protocol(
    tmp: Path, change: Callable[[dict], None] | None = None, text: str | None = None
) -> str:
    data = yaml.safe_load(yaml.safe_dump(SMOKE))
    if change:
        change(data)
    path = tmp / "p.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data))
    return str(path)


def setkey(path: str, value) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value

    return change


def delkey(key: str) -> Callable[[dict], None]:
    return lambda data: data.pop(key)


def run_with(change=None, text=None, extra=()):
    def args(tmp: Path) -> list[str]:
        return ["run", "--all", "--protocol", protocol(tmp, change, text),
                "--results-dir", str(tmp / "results"), *extra]  # fmt: skip

    return args


def validate_with(change):
    """`validate` on the smoke protocol with one change: it rejects what `run` rejects before
    training (an ok from validate and a refusal from run is the defect these cases catch)."""
    return lambda tmp: ["validate", protocol(tmp, change)]


def fixed_protocol(change, *extra: str):
    """run with the changed smoke protocol and the given method options."""

    def args(tmp: Path) -> list[str]:
        return ["run", "--protocol", protocol(tmp, change), "--results-dir", str(tmp / "results"),
                *extra]  # fmt: skip

    return args


def omniglot_zip(tmp: Path, files: dict[str, bytes]) -> Path:
    root = tmp / "omni"
    root.mkdir()
    with zipfile.ZipFile(root / "images_background_small1.zip", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return root


def omniglot_run(files: dict[str, bytes]):
    def args(tmp: Path) -> list[str]:
        root = omniglot_zip(tmp, files)
        return ["run", "--method", "untrained", "--protocol", "omniglot", "--data-root",
                str(root), "--results-dir", str(tmp / "results")]  # fmt: skip

    return args


def arrays(**named: np.ndarray):
    """evaluate with .npy files written from the given arrays (e=..., l=..., q=..., ql=...)."""

    def args(tmp: Path) -> list[str]:
        flags = {"e": "--embeddings", "l": "--labels", "q": "--query-embeddings",
                 "ql": "--query-labels"}  # fmt: skip
        out = ["evaluate"]
        for key, value in named.items():
            path = tmp / f"{key}.npy"
            np.save(path, value)
            out += [flags[key], str(path)]
        return out

    return args


def fixed(*argv: str):
    return lambda tmp: list(argv)


def misnamed_search(tmp: Path) -> list[str]:
    """tune with a plugin method whose search space names a hyperparameter it lacks."""
    from test_plugins import LOSS  # a plugin method with one hyperparameter, margin

    plugin = tmp / "misnamed.py"
    plugin.write_text(
        LOSS.replace("NAME", "misnamed").replace('{"margin": Float', '{"margn": Float')
    )
    return ["tune", "--plugin", str(plugin), "--protocol", "tuning", "--method", "misnamed",
            "--trials", "2", "--results-dir", str(tmp / "r")]  # fmt: skip


def tuned_without_study(tmp: Path) -> list[str]:
    return ["run", "--protocol", "tuning", "--method", "contrastive", "--tuned",
            "--results-dir", str(tmp / "r")]  # fmt: skip


def corrupt_results(tmp: Path) -> list[str]:
    bad = tmp / "r" / "runs" / "smoke" / "contrastive" / "seed0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": 1, "status": "ok", ')
    return ["leaderboard", "--results-dir", str(tmp / "r")]


def malformed_result(change: Callable[[dict], None], command: str = "leaderboard"):
    """A finished smoke result, then one field damaged by hand."""

    def args(tmp: Path) -> list[str]:
        results = tmp / "r"
        assert main(["-q", "run", "--protocol", "smoke", "--method", "contrastive",
                     "--max-steps", "1", "--results-dir", str(results)]) == 0  # fmt: skip
        path = results / "runs" / "smoke" / "contrastive" / "seed0.json"
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))
        if command == "compare":
            return ["compare", "contrastive", "contrastive", "--protocol", "smoke",
                    "--results-dir", str(results)]  # fmt: skip
        return ["leaderboard", "--results-dir", str(results)]

    return args


def smoke_seeds(seeds: str):
    return lambda tmp: ["run", "--all", "--protocol", "smoke", "--seeds", seeds,
                        "--results-dir", str(tmp / "results")]  # fmt: skip


def bad_tuning(text: str):
    def args(tmp: Path) -> list[str]:
        shutil.copytree(REPO / "results" / "reference" / "runs" / "default" / "untrained",
                        tmp / "r" / "runs" / "default" / "untrained")  # fmt: skip
        (tmp / "r" / "tuning" / "tuning").mkdir(parents=True)
        (tmp / "r" / "tuning" / "tuning" / "contrastive.yaml").write_text(text)
        return ["leaderboard", "--results-dir", str(tmp / "r")]

    return args


def bad_cost(change: Callable[[dict], None]):
    """The committed default cost record, one field damaged, beside a result."""

    def args(tmp: Path) -> list[str]:
        shutil.copytree(REPO / "results" / "reference" / "runs" / "default" / "untrained",
                        tmp / "r" / "runs" / "default" / "untrained")  # fmt: skip
        record = json.loads((REPO / "results" / "reference" / "cost" / "default.json").read_text())
        change(record)
        (tmp / "r" / "cost").mkdir()
        (tmp / "r" / "cost" / "default.json").write_text(json.dumps(record))
        return ["leaderboard", "--results-dir", str(tmp / "r")]

    return args


def empty_results(tmp: Path) -> list[str]:
    (tmp / "empty").mkdir()
    return ["leaderboard", "--results-dir", str(tmp / "empty")]


E = np.zeros((4, 2), dtype=np.float32)
L = np.array([0, 0, 1, 1])
CASES = {
    # names: methods, protocols, datasets, backbones
    "unknown method": (fixed("run", "--method", "tripplet", "--protocol", "smoke"), "did you mean 'triplet'"),
    "unknown protocol": (fixed("run", "--all", "--protocol", "defualt"), "did you mean 'default'"),
    "protocol file missing": (fixed("run", "--all", "--protocol", "/no/such/p.yaml"), "does not exist"),
    "unknown dataset": (run_with(setkey("dataset.name", "glyph")), "did you mean 'glyphs'"),
    "unknown dataset param": (run_with(setkey("dataset.params.num_clases", 3)), "did you mean 'num_classes'"),
    "unknown backbone": (run_with(setkey("backbone.name", "resnet19")), "unknown backbone 'resnet19'"),
    "unknown backbone param": (run_with(setkey("backbone.params.widht", 3)), "bad backbone.params"),
    "override for unknown method": (run_with(setkey("methods.contrastve", {})), "did you mean 'contrastive'"),
    "unknown hyperparameter": (run_with(setkey("methods.contrastive", {"margn": 1})), "did you mean 'margin'"),
    "hyperparameter a string": (run_with(setkey("methods.contrastive", {"margin": "fast"})), "methods.contrastive.margin: method contrastive takes a number for margin, got str 'fast'"),
    "hyperparameter a list": (run_with(setkey("methods.proxy_anchor", {"alpha": [1, 2]})), "methods.proxy_anchor.alpha: method proxy_anchor takes a number for alpha, got list [1, 2]"),
    "hyperparameter a bool": (run_with(setkey("methods.contrastive", {"margin": True})), "takes a number for margin, got bool True"),
    "hyperparameter of a method not run": (fixed_protocol(setkey("methods.triplet", {"margin": "x"}), "--method", "contrastive"), "methods.triplet.margin"),
    "protocol name leaves the results folder": (run_with(setkey("name", "../../escape")), "name must start with a letter or digit"),
    "protocol name with a slash": (run_with(setkey("name", "a/b")), "(it names the results folder), got 'a/b'"),
    "protocol path a directory": (lambda tmp: ["run", "--all", "--protocol", str(tmp)], "is a directory, not a protocol file: pass a protocol's .yaml file"),
    # validate: what run rejects before training, validate rejects with the same line
    "validate: unknown dataset param": (validate_with(setkey("dataset.params.foo", 1)), "dataset.params: glyphs has no parameter 'foo'"),
    "validate: unknown dataset": (validate_with(setkey("dataset.name", "glyph")), "did you mean 'glyphs'"),
    "validate: unknown backbone": (validate_with(setkey("backbone.name", "conv5")), "backbone.name: unknown backbone 'conv5' (did you mean 'conv4'?)"),
    "validate: unknown backbone param": (validate_with(setkey("backbone.params.widht", 3)), "bad backbone.params: backbone conv4 has no parameter 'widht'"),
    "validate: override for unknown method": (validate_with(setkey("methods.contrastiv", {})), "methods: unknown method 'contrastiv' (did you mean 'contrastive'?)"),
    "validate: unknown hyperparameter": (validate_with(setkey("methods.contrastive", {"margn": 1})), "did you mean 'margin'"),
    "validate: hyperparameter a string": (validate_with(setkey("methods.contrastive", {"margin": "fast"})), "takes a number for margin, got str 'fast'"),
    "validate: hyperparameter a list": (validate_with(setkey("methods.proxy_anchor", {"alpha": [1, 2]})), "takes a number for alpha, got list [1, 2]"),
    "validate: protocol name": (validate_with(setkey("name", "../../escape")), "name must start with a letter or digit"),
    "validate: a directory": (lambda tmp: ["validate", str(tmp)], "is a directory, not a protocol file"),
    # YAML keys, types and ranges
    "misspelt top-level key": (run_with(setkey("embeding_dim", 8)), "did you mean 'embedding_dim'"),
    "misspelt nested key": (run_with(setkey("sampler.images_per_clas", 4)), "did you mean 'images_per_class'"),
    "batch_size instead of P x K": (run_with(setkey("sampler.batch_size", 16)), "unknown key 'batch_size'"),
    "missing required key": (run_with(delkey("sampler")), "missing required key 'sampler'"),
    "wrong type": (run_with(setkey("embedding_dim", "sixteen")), "expected int"),
    "bool for an int": (run_with(setkey("backbone.input_size", True)), "expected int"),
    "list expected": (run_with(setkey("seeds", 0)), "expected a list"),
    "embedding dim 0": (run_with(setkey("embedding_dim", 0)), "embedding_dim must be >= 1"),
    "negative K": (run_with(setkey("sampler.images_per_class", -4)), "images_per_class (K) must be at least 2"),
    "K larger than the smallest class": (run_with(setkey("sampler.images_per_class", 9)), "fewer than images_per_class=9"),
    "P larger than the classes": (run_with(setkey("sampler.classes_per_batch", 40)), "lower sampler.classes_per_batch"),
    "train fraction out of range": (run_with(setkey("split.train_fraction", 1.0)), "train_fraction must be in (0, 1)"),
    "both epochs and steps": (run_with(setkey("budget", {"epochs": 1, "steps": 1})), "exactly one of epochs or steps"),
    "no budget": (run_with(setkey("budget", {})), "exactly one of epochs or steps"),
    "negative lr": (run_with(setkey("optimizer.lr", -0.1)), "lr must be positive"),
    "unknown metric": (run_with(setkey("evaluation.metrics", ["recall@1", "mapr"])), "did you mean 'map@r'"),
    "infinite lr": (run_with(setkey("optimizer.lr", float("inf"))), "lr must be positive and finite"),
    "negative gamma": (run_with(setkey("schedule.gamma", -3.0)), "gamma (the step schedule's lr factor) must be in (0, 1]"),
    "negative step_epochs": (run_with(setkey("schedule.step_epochs", -5)), "step_epochs must be >= 0"),
    "no metrics": (run_with(setkey("evaluation.metrics", [])), "metrics is empty"),
    "repeated recall k": (run_with(setkey("evaluation.recall_ks", [1, 1, 4])), "recall_ks has a repeated k"),
    "select_by recall@K": (run_with(setkey("evaluation.select_by", "recall@K")), "select_by must be recall@<k> (e.g. recall@1)"),
    "one validation class": (run_with(setkey("split.validation_fraction", 0.1)), "each part needs at least 2 classes"),
    "unknown optimizer": (run_with(setkey("optimizer.name", "rmsprop")), "adam, adamw or sgd"),
    "schema version": (run_with(setkey("schema", 2)), "schema 2 is not supported"),
    "malformed YAML with line": (run_with(text="name: x\nsampler: {a: 1,\n  b: [\n"), "p.yaml:"),
    "YAML not a mapping": (run_with(text="- just\n- a list\n"), "must be a YAML mapping"),
    "too many glyph classes": (run_with(setkey("dataset.params.num_classes", 99999)), "num_classes"),
    "empty dataset (no classes)": (run_with(setkey("dataset.params.num_classes", 0)), "num_classes"),
    # data on disk
    "missing data root": (fixed("run", "--method", "untrained", "--protocol", "omniglot"), "--data-root"),
    "data root not a directory": (fixed("run", "--all", "--protocol", "smoke", "--data-root", "/no/dir"), "is not a directory"),
    "archive missing in data root": (lambda tmp: ["run", "--method", "untrained", "--protocol", "omniglot", "--data-root", str(tmp)], "images_background_small1"),
    "archive with no images": (omniglot_run({"images_background_small1/README": b"x"}), "images_background_small1"),
    "truncated image": (omniglot_run({"images_background_small1/Alpha/character01/0101_01.png": PNG_1PX[:30]}), "character01/0101_01.png"),
    "archive not a zip": (lambda tmp: (tmp / "images_background_small1.zip").write_bytes(b"no zip") and ["run", "--method", "untrained", "--protocol", "omniglot", "--data-root", str(tmp)], "images_background_small1.zip"),
    # results
    "unreadable results file": (corrupt_results, "unreadable result file"),
    "leaderboard over empty folder": (empty_results, "no run results"),
    "result training null": (malformed_result(lambda d: d.update(training=None)), "seed0.json is a malformed schema-2 run result (training: expected a mapping"),
    "result metrics a string": (malformed_result(lambda d: d.update(metrics="oops")), "(metrics: expected a mapping, got 'oops')"),
    "result metric null": (malformed_result(lambda d: d["metrics"].update({"map@r": None})), "metrics['map@r']: expected a number, got None"),
    "result seed a string": (malformed_result(lambda d: d.update(seed="1"), "compare"), "seed: expected an integer, got '1'"),
    "result ok without metrics": (malformed_result(lambda d: d.pop("metrics"), "compare"), "status ok without metrics"),
    "cost protocol not a mapping": (bad_cost(lambda d: d.update(protocol=3)), "default.json (protocol: missing or of the wrong type)"),
    "cost methods not a list": (bad_cost(lambda d: d.update(methods={"a": 1})), "default.json (methods: missing or of the wrong type)"),
    "tuning file not YAML": (bad_tuning("study: [unclosed\n"), "contrastive.yaml is unreadable"),
    "tuning study not a mapping": (bad_tuning("study: 3\n"), "contrastive.yaml is unreadable (study: not a mapping)"),
    # evaluate
    "mismatched counts": (arrays(e=E, l=np.array([0, 0, 1])), "4"),
    "NaN in embeddings": (arrays(e=np.array([[0.0, np.nan], [1, 1], [2, 2], [3, 3]], dtype=np.float32), l=L), "NaN"),
    "3-D embeddings": (arrays(e=np.zeros((4, 2, 2), dtype=np.float32), l=L), "2-D"),
    "2-D labels": (arrays(e=E, l=np.zeros((4, 2), dtype=np.int64)), "1-D"),
    "query dims differ": (arrays(e=E, l=L, q=np.zeros((2, 3), dtype=np.float32), ql=np.array([0, 1])), "dimension"),
    "query without labels": (arrays(e=E, l=L, q=E), "--query-labels"),
    "embeddings file missing": (fixed("evaluate", "--embeddings", "/no/e.npy", "--labels", "/no/l.npy"), "does not exist"),
    "not an npy file": (lambda tmp: (tmp / "e.npy").write_text("hello") and ["evaluate", "--embeddings", str(tmp / "e.npy"), "--labels", str(tmp / "e.npy")], "not a readable .npy"),
    # flags
    "seeds not integers": (fixed("run", "--all", "--seeds", "0,one"), "comma-separated integers"),
    "seed negative": (smoke_seeds("0,-1"), "integers from 0 to 4294967295, got -1"),
    "seed too large": (smoke_seeds(str(2**32)), "got 4294967296"),
    "seeds empty": (smoke_seeds(","), "at least one seed"),
    "seed twice": (smoke_seeds("0,1,0"), "seed 0 is listed twice"),
    "protocol seed negative": (run_with(setkey("seeds", [0, -3])), "seeds must be integers from 0"),
    "protocol seed twice": (run_with(setkey("seeds", [2, 2])), "seed 2 is listed twice"),
    "max steps zero": (fixed("run", "--all", "--max-steps", "0"), "positive integer"),
    # tune (issue 55's bad inputs)
    "tune trials zero": (fixed("tune", "--protocol", "tuning", "--method", "contrastive", "--trials", "0"), "expected a positive integer, got '0'"),
    "tune search names a missing hyperparameter": (misnamed_search, "search space names 'margn', which is not one of its hyperparameters (margin)"),
    "run tuned without a finished study": (tuned_without_study, "tune --protocol tuning --method contrastive"),
    "cuda without a GPU": (fixed("run", "--all", "--protocol", "smoke", "--device", "cuda"), "no CUDA GPU"),
    "unknown command": (fixed("trian"), "invalid choice"),
    "check update without reason": (fixed("check", "--update"), "--reason"),
    "check baseline seeds without update": (fixed("check", "--baseline-seeds", "5"), "goes with --update"),
    "check unknown mode": (fixed("check", "--mode", "fuzzy"), "invalid choice"),
    "check too few baseline seeds": (fixed("check", "--update", "--reason", "r", "--baseline-seeds", "2"), "at least 3"),
    "check old baseline file": (lambda tmp: (tmp / "regression.json").write_text('{"methods": {}}') and ["check", "--baselines", str(tmp)], "format-1 baseline"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_one_line_error(name: str, tmp_path: Path, capsys, monkeypatch):
    make_args, fragment = CASES[name]
    if name == "cuda without a GPU":
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = make_args(tmp_path)
    try:
        code = main(["-q", *args])
    except SystemExit as exc:  # argparse
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]
    # nothing half-written: no result files from a run that failed on bad input
    assert not list((tmp_path / "results").rglob("seed*.json"))


def test_corpus_is_large_enough():
    assert len(CASES) >= 30
