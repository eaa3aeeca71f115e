"""What the command line says: `ls` prints whole method summaries and the default
hyperparameters, `--version` names the program, and every hint that tells the user a command
names the program as they started it (`dml-harness` when installed)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from harness import __version__
from harness.cli import main
from harness.core import METHODS, HarnessError, load_methods
from harness.core.method import docstring_summary

INSTALLED = "/venv/bin/dml-harness"


def test_a_summary_is_the_first_paragraph_not_the_first_line():
    doc = """Binomial deviance (Yi et al. 2014): softplus of the cosine similarity of every pair,
    negatives weighted by the cost C.

    Details that `ls` leaves out.
    """
    assert docstring_summary(doc) == (
        "Binomial deviance (Yi et al. 2014): softplus of the cosine similarity of every pair, "
        "negatives weighted by the cost C."
    )
    assert docstring_summary("One line.") == "One line." and docstring_summary("") == ""
    assert docstring_summary("\n  First.\n  \n  Second.") == "First."


def test_ls_prints_each_whole_summary_and_the_default_hyperparameters(capsys):
    load_methods()
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    text = " ".join(out.split())  # the entries are wrapped to the terminal
    for name in METHODS.names():
        spec = METHODS.get(name)
        doc = spec.build.__doc__ or inspect.getmodule(spec.build).__doc__ or ""
        assert spec.summary == docstring_summary(doc)
        assert f"{name} {spec.summary} hyperparameters: " in text, name
    # the sentence the first physical line used to cut
    assert "negatives weighted by the cost C, positive and negative pairs averaged separately." in (
        text
    )
    assert "contrastive Contrastive loss" in text and "hyperparameters: margin=1.0 " in text
    assert "hard_ratios=[1.0, 0.5, 0.2]" in text and "head_dim=null" in text
    assert "untrained The backbone's features" in text


def test_ls_json_keeps_its_keys(capsys):
    assert main(["ls", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {"methods", "protocols", "datasets", "method_prefixes"} <= set(listing)
    keys = {"name", "version", "paper", "family", "needs_coarse_labels", "hyperparameters",
            "summary"}  # fmt: skip
    assert all(keys <= set(m) for m in listing["methods"])
    binomial = next(m for m in listing["methods"] if m["name"] == "binomial_deviance")
    assert binomial["summary"].endswith("positive and negative pairs averaged separately.")


@pytest.mark.parametrize("argv0, name", [(INSTALLED, "dml-harness"),
                                         ("/clone/harness/__main__.py", "python -m harness")])  # fmt: skip
def test_version_names_the_program(monkeypatch, capsys, argv0: str, name: str):
    monkeypatch.setattr("sys.argv", [argv0, "--version"])
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"{name} {__version__}\n"


def error_of(args: list[str], capsys) -> str:
    """The one error line of a command that fails on bad input (exit 2)."""
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console script `dml-harness` started this process."""
    monkeypatch.setattr("sys.argv", [INSTALLED])


def assert_names_the_installed_program(message: str, command: str) -> None:
    assert f"`dml-harness {command}" in message and "python -m harness" not in message, message


def test_command_hints_name_the_installed_program(installed, tmp_path: Path, capsys):
    hint = error_of(["run", "--method", ",", "--results-dir", str(tmp_path)], capsys)
    assert_names_the_installed_program(hint, "ls`")
    hint = error_of(["leaderboard", "--results-dir", str(tmp_path / "none")], capsys)
    assert_names_the_installed_program(hint, "run`")
    hint = error_of(["check", "--protocol", "smoke", "--methods", "contrastive", "--baselines",
                     str(tmp_path)], capsys)  # fmt: skip
    assert_names_the_installed_program(hint, "check --protocol smoke --update --reason TEXT`")
    (tmp_path / "smoke.json").write_text(json.dumps({"format": 1}))
    hint = error_of(["check", "--protocol", "smoke", "--methods", "contrastive", "--baselines",
                     str(tmp_path)], capsys)  # fmt: skip
    assert_names_the_installed_program(hint, "check --update --reason TEXT`")
    hint = error_of(["run", "--protocol", "tuning", "--method", "contrastive", "--tuned",
                     "--results-dir", str(tmp_path)], capsys)  # fmt: skip
    assert_names_the_installed_program(hint, "tune --protocol tuning --method contrastive`")
    hint = error_of(["compare", "contrastive", "triplet", "--results-dir", str(tmp_path)], capsys)
    assert_names_the_installed_program(hint, "run --protocol default --method contrastive`")


def test_data_and_cost_hints_name_the_installed_program(installed, tmp_path: Path):
    from harness.cost.records import read_cost
    from harness.data.cub200 import listing
    from harness.data.lazy import open_rgb
    from harness.data.torch_decode import read
    from harness.sweep import read_tuning_file

    missing = tmp_path / "missing.jpg"
    for command, call in [
        ("data download --dataset cub200`", lambda: listing(tmp_path)),
        ("data verify`", lambda: open_rgb(missing)),
        ("data verify`", lambda: read([str(missing)], [None], 8, "cpu")),
        ("cost`", lambda: read_cost(tmp_path / "missing.json")),
        ("tune`", lambda: read_tuning_file(tmp_path / "missing.yaml")),
    ]:
        with pytest.raises(HarnessError) as raised:
            call()
        assert_names_the_installed_program(str(raised.value), command)


def test_a_clone_keeps_saying_python_m_harness(monkeypatch, tmp_path: Path, capsys):
    monkeypatch.setattr("sys.argv", ["/clone/harness/__main__.py"])
    hint = error_of(["leaderboard", "--results-dir", str(tmp_path / "none")], capsys)
    assert "`python -m harness run`" in hint
