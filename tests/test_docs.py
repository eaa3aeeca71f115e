"""The manual (docs/, mkdocs.yml) builds strictly and keeps up with the command line.

`mkdocs build --strict` fails on a broken link or anchor, a page left out of the navigation
and a docstring the API reference cannot read. The command line is read from the parser
itself, so a new subcommand or option without docs fails here: each must be named somewhere
in docs/, and in its own section of docs/commands.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli.program import build_parser

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
GLOBAL = {"--quiet", "--verbose", "--version", "--help"}  # every parser has them


def _docs_text() -> str:
    return "\n".join(p.read_text() for p in sorted(DOCS.rglob("*.md")))


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(`data verify`, its parser) for every subcommand, nested ones included."""
    if path:
        yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def _named(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def _sections(text: str) -> dict[str, str]:
    """docs/commands.md's `## ` sections by heading, each with its `### ` subsections."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


COMMANDS = dict(_commands(build_parser()))


def test_the_parser_walk_sees_every_command():
    assert {"run", "ls", "evaluate", "cost", "check", "data verify", "data download"} <= set(
        COMMANDS
    )
    assert {"--all", "--method", "--compile", "--engine"} <= _long_options(COMMANDS["run"])


def test_every_command_and_long_option_is_documented():
    text = _docs_text()
    missing = [f"python -m harness {name}" for name in COMMANDS if f"harness {name}" not in text]
    for name, parser in COMMANDS.items():
        missing += [f"{name} {o}" for o in sorted(_long_options(parser)) if not _named(o, text)]
    missing += [
        o for o in sorted(_long_options(build_parser()) - {"--help"}) if not _named(o, text)
    ]
    assert missing == [], f"not named anywhere in docs/: {missing}"


def test_each_command_has_a_section_naming_its_options():
    sections = _sections((DOCS / "commands.md").read_text())
    missing = []
    for name, parser in COMMANDS.items():
        if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            continue  # `data` itself: its subcommands have the sections
        where = [body for head, body in sections.items() if _named(name, head)]
        if not where:
            missing.append(f"no `## ...{name}...` section in docs/commands.md")
            continue
        body = "\n".join(where)
        missing += [f"{name} {o}" for o in sorted(_long_options(parser) - GLOBAL)
                    if not _named(o, body)]  # fmt: skip
    global_section = sections.get("Global options", "")
    missing += [f"global {o}" for o in sorted(GLOBAL - {"--help"}) if not _named(o, global_section)]
    assert missing == [], f"docs/commands.md does not name: {missing}"


def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -r requirements-test.txt)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
         "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    pages = {p.parent.relative_to(site).as_posix() for p in site.rglob("index.html")}
    expected = {"."} | {p.relative_to(DOCS).with_suffix("").as_posix()
                        for p in DOCS.rglob("*.md") if p.name != "index.md"}  # fmt: skip
    expected |= {p.parent.relative_to(DOCS).as_posix() for p in DOCS.rglob("index.md")}
    assert expected <= pages, sorted(expected - pages)
    reference = (site / "api" / "harness" / "index.html").read_text()
    for name in ("register_method", "MethodContext", "EmbeddingHead", "Pairs", "all_pairs"):
        assert f'id="harness.{name}"' in reference, name  # the public API is rendered


def test_the_help_lists_every_command_and_says_what_each_argument_is():
    """`--help` names all the commands, each summary is a whole phrase (none stops on a word
    like "how"), and every argument, positional or optional, has a line of help."""
    parser = build_parser()
    top = " ".join(parser.format_help().split())
    listed = top.split("Commands: ", 1)[1].split(";", 1)[0].split(", ")
    assert set(listed) == {name for name in COMMANDS if " " not in name}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for choice in sub._choices_actions:
        assert choice.help and choice.help.split()[-1] not in {"how", "of", "the", "a", "and"}
    silent = [f"{name} {a.option_strings or a.metavar or a.dest}"
              for name, p in COMMANDS.items() for a in p._actions
              if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
              and not a.help]  # fmt: skip
    assert silent == []
    for name, says in [("export", "--format {onnx,torchscript} onnx"), ("export", "--out FILE "
                       "the file"), ("index", "--images FOLDER the folder"), ("index", "--out "
                       "INDEX_DIR the index's folder"), ("search", "INDEX_DIR an index"),
                       ("search", "IMAGE one or more"), ("compare", "B the method A")]:  # fmt: skip
        assert says in " ".join(COMMANDS[name].format_help().split()), (name, says)


def test_one_option_has_one_spelling_and_the_old_spellings_still_work(capsys):
    from harness.cli import main

    spelled = {
        name: _long_options(COMMANDS[name]) for name in ("cost", "check", "rerank", "search")
    }
    assert {"--method", "--methods"} <= spelled["cost"] and {"--method", "--methods"} <= spelled[
        "check"
    ]
    assert {"--protocol", "--protocols"} <= spelled["rerank"] and "--k" in spelled["search"]
    assert "--k" in _long_options(COMMANDS["show"])
    parser = build_parser()
    for old, new, dest in (("--methods", "--method", "methods"), ("--protocols", "--protocol", "protocols"),
                           ("-k", "--k", "k")):  # fmt: skip
        command = {"methods": ["cost"], "protocols": ["rerank", "--results-dir", "r", "--out", "o"],
                   "k": ["search", "index", "q.jpg"]}[dest]  # fmt: skip
        value = "3" if dest == "k" else "a"
        old_args = parser.parse_args([*command, old, value])
        new_args = build_parser().parse_args([*command, new, value])
        assert getattr(old_args, dest) == getattr(new_args, dest) == (3 if dest == "k" else "a")
        with pytest.raises(SystemExit) as stopped:
            main([*command, old, value, new, value])
        assert stopped.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "two spellings of one option" in err[0], err
