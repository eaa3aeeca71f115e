"""argparse as the harness's commands use it: one-line errors, and the global options -q and
-v accepted before or after the subcommand."""

from __future__ import annotations

import argparse
import sys

from harness.core import program_name


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump), status 2, like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments") and "--all-classes" in message:
            message += (": --all-classes belongs to `run` (it keeps a model trained on every "
                        "class, for use); tune and leaderboard work on benchmark runs")  # fmt: skip
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def add_global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """-q and -v, accepted before or after the subcommand. The subcommands' copies default to
    SUPPRESS, so that leaving them out after the subcommand keeps what was given before it."""
    group = parser.add_argument_group("global options")
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="warnings and errors only: no progress bars or per-run lines")  # fmt: skip
    group.add_argument("-v", "--verbose", action="store_true", default=default,
                       help="debug logging from the harness and the methods")  # fmt: skip


class SubcommandParser(Parser):
    """A subcommand's parser: it takes the global options too (`run ... -q`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        add_global_options(self, argparse.SUPPRESS)


def top_parser(description: str) -> Parser:
    """The program's parser, named as the user started it (dml-harness or python -m harness)."""
    return Parser(prog=program_name(), description=description)
