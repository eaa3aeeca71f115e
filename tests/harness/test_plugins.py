"""Methods from outside the package: `--plugin PATH_OR_MODULE` and the `dml_harness.methods`
entry points. Both go through register_method's checks; each result records the method's
source (a file's sha256, a distribution's version), and a changed file is a changed run.
docs/own-loss.md's walk-through runs as written in tests/test_own_loss.py; the entry point of
a really installed distribution in tests/test_packaging.py."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import harness.core.plugins as plugins
from harness.cli import main
from harness.core import METHODS, PLUGINS_ENV, HarnessError, load_plugin, unload_plugin

REPO = Path(__file__).resolve().parents[2]

LOSS = '''\
"""Cosine margin (a test plugin): positive pairs to cosine 1, negatives below a margin."""
import torch
from harness import EmbeddingHead, Float, Method, all_pairs, register_method


class CosineMargin(torch.nn.Module):
    def __init__(self, margin: float) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, out, batch, pairs):
        cos = (out.embedding[pairs.first] * out.embedding[pairs.second]).sum(1)
        return torch.where(pairs.positive, 1 - cos, (cos - self.margin).clamp(min=0)).mean()


@register_method("NAME", family="pairs", version=1, search={"margin": Float(0.0, 0.8)})
def build(ctx, *, margin: float = 0.4):
    head = EmbeddingHead(ctx.feature_dim, ctx.embedding_dim)
    return Method(head, CosineMargin(margin), miner=lambda out, batch: all_pairs(batch.labels))
'''


def plugin_file(folder: Path, name: str = "plug_margin", text: str = LOSS) -> Path:
    path = folder / f"{name}.py"
    path.write_text(text.replace("NAME", name))
    return path


def one_line_error(capsys: pytest.CaptureFixture, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_a_file_plugin_registers_with_its_path_and_sha256_and_unloads(tmp_path):
    path = plugin_file(tmp_path)
    try:
        assert load_plugin(str(path)) == ["plug_margin"]
        spec = METHODS.get("plug_margin")
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        assert spec.source == {"plugin": "file", "path": str(path.resolve()), "sha256": sha}
        assert spec.summary.startswith("Cosine margin (a test plugin)")
        assert spec.defaults() == {"margin": 0.4} and set(spec.search) == {"margin"}
        assert load_plugin(str(path)) == ["plug_margin"]  # same content: not imported again
        assert METHODS.get("contrastive").source is None  # the built-in ones
    finally:
        unload_plugin(str(path))
    assert "plug_margin" not in METHODS


def test_ls_shows_where_each_method_comes_from_and_the_command_leaves_no_trace(tmp_path, capsys):
    path = plugin_file(tmp_path)
    assert main(["ls", "--plugin", str(path), "--json"]) == 0
    listing = {m["name"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    assert (
        listing["plug_margin"]["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    )
    assert listing["contrastive"]["source"] == {"builtin": "harness.methods"}
    assert main(["ls", "--plugin", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the listing wraps long lines
    assert f"from plugin file {path.resolve()}" in text
    assert "plug_margin" not in METHODS and PLUGINS_ENV not in os.environ  # the next command


BROKEN = {
    "raises on import": (LOSS.replace("import torch", "import torch\n1 / 0"),
                         ["failed to import: ZeroDivisionError", "plug_margin.py:3"]),
    "bad signature": (LOSS.replace("def build(ctx, *, margin: float = 0.4)",
                                   "def build(ctx, margin)").replace(
                                       ', search={"margin": Float(0.0, 0.8)}', ""),
                      ["build(ctx, margin) has 2 positional parameters", "keyword-only"]),
    "a default outside its search range": (LOSS.replace("Float(0.0, 0.8)", "Float(0.5, 0.8)"),
                                           ["margin=0.4 lies outside its search range"]),
    "a name that exists": (LOSS.replace('"NAME"', '"contrastive"'),
                           ["method 'contrastive' from plugin file", "already registered by "
                            "built-in (harness.methods)"]),
    "registers nothing": ("x = 1\n", ["registers no method"]),
    "a name that leaves the results folder": (
        LOSS.replace('"NAME"', '"../../escaped"'),
        ["method name '../../escaped' from plugin file", "/plug_margin.py is not allowed: a "
         "method name must start with a letter or digit", "rename it in register_method"]),
    "a name with a space and '<'": (LOSS.replace('"NAME"', '"my <loss>"'),
                                    ["method name 'my <loss>' from plugin file"]),
    "a name that reads as a tuned run": (LOSS.replace('"NAME"', '"contrastive+tuned"'),
                                         ["method name 'contrastive+tuned' from plugin file"]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_plugin_is_one_line_before_any_training(case, tmp_path, capsys):
    text, expected = BROKEN[case]
    path = plugin_file(tmp_path, text=text)
    results = tmp_path / "results"
    (results / "runs").mkdir(parents=True)
    (results / "runs" / "kept.json").write_text("{}")
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    code = main(["run", "--protocol", "smoke", "--method", "contrastive", "--plugin", str(path),
                 "--results-dir", str(results)])  # fmt: skip
    err = one_line_error(capsys, code)
    assert f"plugin {path.resolve()}" in err
    for words in expected:
        assert words in err
    assert sorted(p.relative_to(results) for p in results.rglob("*")) == before
    assert "plug_margin" not in METHODS and "contrastive" in METHODS  # nothing half-registered


def test_a_plugin_method_named_to_escape_never_writes_outside_the_results(tmp_path, capsys):
    """Issue #40's case: `../../escaped` trained, and its result went to <results>/../../."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    path = plugin_file(tmp_path / "a" / "b", text=LOSS.replace('"NAME"', '"../../escaped"'))
    results = tmp_path / "a" / "b" / "results"
    code = main(["run", "--protocol", "smoke", "--method", "../../escaped", "--plugin", str(path),
                 "--results-dir", str(results), "--max-steps", "1"])  # fmt: skip
    err = one_line_error(capsys, code)
    assert f"plugin {path.resolve()}: method name '../../escaped' from plugin file" in err
    assert not results.exists() and not list(tmp_path.rglob("seed0.json"))


@pytest.mark.parametrize("plugin", ["no_such_file.py", "no_such_module_anywhere"])
def test_a_plugin_that_is_not_there_is_one_line(plugin, tmp_path, capsys):
    err = one_line_error(capsys, main(["ls", "--plugin", str(plugin)]))
    assert f"--plugin {plugin}: no such file" in err


def test_a_changed_plugin_file_is_a_changed_run(tmp_path, capsys):
    path = plugin_file(tmp_path)
    results = tmp_path / "results"
    args = ["-q", "run", "--protocol", "smoke", "--method", "plug_margin", "--plugin", str(path),
            "--results-dir", str(results)]  # fmt: skip
    assert main(args) == 0
    result = results / "runs" / "smoke" / "plug_margin" / "seed0.json"
    first = json.loads(result.read_text())
    assert first["status"] == "ok" and first["method"]["source"]["plugin"] == "file"
    assert main(args) == 0
    assert "skipped 1" in capsys.readouterr().out  # the same file: the same run
    path.write_text(path.read_text() + "# an edit\n")
    assert main(args) == 0
    second = json.loads(result.read_text())
    assert second["method"]["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert second["method"]["source"]["sha256"] != first["method"]["source"]["sha256"]
    (archived,) = (results / "archive").rglob("seed0*.json")
    assert json.loads(archived.read_text())["method"]["source"] == first["method"]["source"]
    board = (results / "LEADERBOARD.md").read_text()
    assert "| plug_margin" in board
    sha = second["method"]["source"]["sha256"][:12]
    assert f"Not built in: `plug_margin` from plugin file {path.resolve()}, sha256 `{sha}`" in board


def test_a_built_in_result_records_no_source(tmp_path):
    from harness.records import MethodInfo

    info = MethodInfo("contrastive", 2, "p", {"margin": 1.0})
    assert "source" not in info.to_json()  # the committed results stay byte for byte
    sourced = MethodInfo("x", 1, "", {}, {"plugin": "file", "path": "/a.py", "sha256": "f"})
    assert MethodInfo.from_json(sourced.to_json()) == sourced
    moved = MethodInfo("x", 1, "", {}, {"plugin": "file", "path": "/b.py", "sha256": "f"})
    assert moved.source_identity() == sourced.source_identity()  # where it lies: not the code


def installed_distribution(site: Path, dist: str, version: str, module: str, code: str,
                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A distribution on sys.path as pip leaves one (a module and its dist-info folder) whose
    entry point in the group dml_harness.methods names the module; entry points not yet read."""
    site.mkdir()
    (site / f"{module}.py").write_text(code)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[dml_harness.methods]\n{module} = {module}\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", [])


def test_entry_points_of_installed_distributions_load_with_their_name_and_version(
    tmp_path, monkeypatch
):
    code = LOSS.replace("NAME", "ep_margin")
    installed_distribution(tmp_path / "site", "ep-margin", "0.3.1", "ep_margin", code, monkeypatch)
    try:
        plugins.load_methods()
        assert METHODS.get("ep_margin").source == {
            "distribution": "ep-margin", "version": "0.3.1", "entry_point": "ep_margin = ep_margin"
        }  # fmt: skip
    finally:
        METHODS.remove("ep_margin")
        sys.modules.pop("ep_margin", None)


def test_a_broken_entry_point_names_its_distribution(tmp_path, monkeypatch):
    code = "raise RuntimeError('no GPU here')\n"
    installed_distribution(tmp_path / "site", "broken-ep", "1.0", "broken_ep", code, monkeypatch)
    assert any(ep.name == "broken_ep" for ep in importlib.metadata.entry_points(
        group="dml_harness.methods"))  # fmt: skip
    with pytest.raises(HarnessError, match=r"entry point 'broken_ep = broken_ep' of broken-ep "
                       r"failed to import: RuntimeError: no GPU here"):  # fmt: skip
        plugins.load_methods()
    sys.modules.pop("broken_ep", None)


@pytest.mark.slow
def test_tune_takes_a_plugin_method(tmp_path, capsys):
    data = yaml.safe_load((REPO / "protocols" / "learning.yaml").read_text())
    data["name"], data["split"]["validation_fraction"] = "learning_val", 0.25
    protocol = tmp_path / "learning_val.yaml"
    protocol.write_text(yaml.safe_dump(data))
    path = plugin_file(tmp_path)
    results = tmp_path / "results"
    assert main(["-q", "tune", "--protocol", str(protocol), "--method", "plug_margin",
                 "--trials", "2", "--max-steps", "2", "--plugin", str(path),
                 "--results-dir", str(results)]) == 0  # fmt: skip
    (study,) = (results / "tuning" / "learning_val").glob("plug_margin*.yaml")
    assert "margin" in study.read_text()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_ray_workers_load_the_commands_plugins(tmp_path):
    """A real process with a fresh local Ray: its workers import the file from
    DML_HARNESS_PLUGINS (the runtime environment), and the result records its source."""
    pytest.importorskip("ray")
    path = plugin_file(tmp_path)
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(PLUGINS_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "-q", "run", "--protocol", "smoke", "--method",
         "plug_margin", "--plugin", str(path), "--engine", "ray", "--results-dir", str(results)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((results / "runs" / "smoke" / "plug_margin" / "seed0.json").read_text())
    assert record["status"] == "ok"
    assert record["method"]["source"]["path"] == str(path.resolve())


def test_the_public_api_is_what_the_built_in_methods_import():
    """Every method file imports the harness through `from harness import ...` only, and
    every name it imports is in harness.__all__ (import-linter forbids the packages below;
    this catches a name the public API lost)."""
    import harness

    names = set()
    for file in (REPO / "methods").glob("*.py"):
        text = file.read_text()
        assert "from harness." not in text and "import harness." not in text, file
        for block in text.split("from harness import ")[1:]:
            block = block.split(")")[0] if block.startswith("(") else block.split("\n")[0]
            names |= {n.strip() for n in block.strip("( \n").replace("\n", ",").split(",")}
    names.discard("")
    assert names <= set(harness.__all__), names - set(harness.__all__)
    assert {"register_method", "Method", "MethodContext", "EmbeddingHead", "Embedded", "Batch",
            "Pairs", "Triplets", "Quadruplets", "all_pairs", "Float", "Int",
            "Choice"} <= set(harness.__all__)  # fmt: skip


def test_a_kept_plugin_model_is_exported_indexed_and_searched_with_its_plugin(tmp_path, capsys):
    """`run --plugin ... --save-model` records the plugin (its path and sha256) in the model;
    export, index and search rebuild the method with the same --plugin (or a copy of the same
    file elsewhere, or DML_HARNESS_PLUGINS), say which --plugin is missing without it, and
    refuse, in one line, a plugin whose file changed since the model was kept."""
    from harness.deploy import read_model
    from tests.test_own_data import image_folder, protocol

    photos = image_folder(tmp_path / "photos")
    plugin = plugin_file(tmp_path, "cosine_margin")
    assert main(["-q", "run", "--protocol", protocol(tmp_path, "folder"), "--method",
                 "cosine_margin", "--plugin", str(plugin), "--max-steps", "2", "--workers", "0",
                 "--data-root", str(photos), "--results-dir", str(tmp_path / "results"),
                 "--save-model"]) == 0  # fmt: skip
    model = tmp_path / "results" / "runs" / "own" / "cosine_margin" / "seed0.model.pt"
    sha = hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert read_model(model).meta["method"]["source"] == {
        "plugin": "file", "path": str(plugin.resolve()), "sha256": sha}  # fmt: skip
    index, query = tmp_path / "index", str(photos / "class1" / "0.png")
    uses = {"export": ["export", str(model), "--format", "torchscript", "--out",
                       str(tmp_path / "m.pt")],
            "index": ["-q", "index", str(model), "--images", str(photos), "--out", str(index),
                      "--engine", "torch"]}  # fmt: skip
    for argv in uses.values():
        code = main(argv)
        assert f"which is not loaded: pass --plugin {plugin.resolve()}" in one_line_error(
            capsys, code)  # fmt: skip
        assert main([*argv, "--plugin", str(plugin)]) == 0
    capsys.readouterr()
    assert main(["search", str(index), query, "-k", "1", "--json", "--plugin", str(plugin)]) == 0
    assert json.loads(capsys.readouterr().out)["queries"][0]["results"][0]["path"] == "class1/0.png"
    copy = tmp_path / "elsewhere" / "cosine_margin.py"
    copy.parent.mkdir()
    copy.write_bytes(plugin.read_bytes())  # the same code elsewhere is the same method
    assert main([*uses["export"], "--plugin", str(copy)]) == 0
    os.environ[PLUGINS_ENV] = str(plugin)
    try:
        assert main(uses["export"]) == 0  # the processes' variable loads it too
    finally:
        os.environ.pop(PLUGINS_ENV)
        unload_plugin(str(plugin))
    plugin.write_text(plugin.read_text() + "# an edit\n")
    now = hashlib.sha256(plugin.read_bytes()).hexdigest()
    for argv in (uses["export"], uses["index"], ["search", str(index), query]):
        err = one_line_error(capsys, main([*argv, "--plugin", str(plugin)]))
        assert (f"plugin file {plugin.resolve()} changed since the model was kept (sha256 "
                f"{sha[:12]} then, {now[:12]} now)") in err  # fmt: skip
        assert "restore it as it was, or keep the model again with `python -m harness run " \
            f"--protocol PROTOCOL.yaml --method cosine_margin --seeds 0 --plugin " \
            f"{plugin.resolve()} --save-model --force`" in err  # fmt: skip
    assert "cosine_margin" not in METHODS


def test_the_tune_hint_of_a_plugin_method_carries_its_plugin(tmp_path, capsys):
    """`run --tuned` without a tuned configuration names the `tune` command that makes one,
    with the method's --plugin (and the protocol as `run` was given it), so it runs as printed."""
    path = plugin_file(tmp_path)
    err = one_line_error(capsys, main(["run", "--protocol", "tuning", "--method", "plug_margin",
                                       "--tuned", "--plugin", str(path), "--results-dir",
                                       str(tmp_path / "results")]))  # fmt: skip
    assert (f"run `python -m harness tune --protocol tuning --method plug_margin --plugin "
            f"{path.resolve()}` first") in err  # fmt: skip
