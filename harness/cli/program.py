"""Command line: train, compare, tune and deploy deep metric learning methods under protocols.

User errors print one line `error: ...` on stderr and exit with status 2; Ctrl-C stops with a
line saying how to resume (finished runs are kept and skipped on the next run). Each command's
module adds its parser and sets its handler; this module dispatches and turns errors into
lines.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from harness import __version__
from harness.cli import check, compare, cost, deploy, info, report, rerank, run, show, tune
from harness.cli.parsing import SubcommandParser, add_global_options, top_parser
from harness.core import HarnessError, plugins_loaded
from harness.data.photo_sets import FETCH_ENV

# in the order `--help` lists them
COMMAND_MODULES = (run, info, show, report, cost, check, compare, tune, deploy, rerank)


def build_parser() -> argparse.ArgumentParser:
    """The program's parser; its description names every command (what `--help` lists)."""
    parser = top_parser(__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_global_options(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=SubcommandParser)
    for module in COMMAND_MODULES:
        module.add_parser(sub)
    parser.description = (f"{__doc__.splitlines()[0]} Commands: {', '.join(sub.choices)}; "
                          f"`{parser.prog} COMMAND --help` says what each takes.")  # fmt: skip
    return parser


def _os_problem(exc: OSError) -> str:
    """One line for a file system error: what failed, on which path, and the way out."""
    where = f" {exc.filename}" if exc.filename else ""
    return (f"cannot use{where}: {exc.strerror or exc}; check that the folder exists, is a "
            "folder and is writable (e.g. pass another --results-dir or set DML_HARNESS_CACHE)"
            "; -v shows where it happened")  # fmt: skip


def _configure_logging(args: argparse.Namespace) -> None:
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    if args.verbose:  # only our loggers: matplotlib's and PIL's debug output is noise here
        for name in ("harness", "methods"):
            logging.getLogger(name).setLevel(logging.DEBUG)
    logging.getLogger("faiss").setLevel(logging.WARNING)  # its loader logs CPU probing at INFO
    for name in ("onnxscript", "onnx_ir", "torch.onnx"):  # `export`: each graph rewrite at INFO
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quiet and args.verbose:
        print("error: -q and -v contradict each other: give one of them", file=sys.stderr)
        return 2
    _configure_logging(args)
    if getattr(args, "fetch", False):  # read in the worker processes too
        os.environ[FETCH_ENV] = "1"
    try:
        with plugins_loaded(getattr(args, "plugin", None) or []):
            return args.handler(args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head` closed the pipe: nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:  # an unwritable results folder or cache, a full disk
        if args.verbose:
            raise
        print(f"error: {_os_problem(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
