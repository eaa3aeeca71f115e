"""`show RESULT_OR_FOLDER`: what the model retrieves, as a PNG grid: test queries (the worst
and the best by MAP@R, then random ones), each followed by its top-k retrieved images framed
green (same class) or red (another class), from a run saved with `run --save-embeddings`."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.argtypes import nonnegative_int, positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `show` subcommand's options."""
    show = sub.add_parser("show", help="what a run's model retrieves: a PNG grid of queries "
                          "and their top-k images (needs run --save-embeddings)")  # fmt: skip
    show.add_argument("path", type=Path, metavar="RESULT_OR_FOLDER",
                      help="a finished run's seed<k>.json or its seed<k>.embeddings folder")  # fmt: skip
    show.add_argument("--k", type=positive_int, default=8, help="retrieved images per query (8)")
    show.add_argument("--worst", type=nonnegative_int, default=4,
                      help="queries with the lowest MAP@R (4)")  # fmt: skip
    show.add_argument("--best", type=nonnegative_int, default=4,
                      help="queries with the highest MAP@R (4)")  # fmt: skip
    show.add_argument("--random", type=nonnegative_int, default=4,
                      help="random queries of the rest, drawn with --seed (4)")  # fmt: skip
    show.add_argument("--seed", type=nonnegative_int, default=0, help="the random rows' seed (0)")
    show.add_argument("--out", type=Path,
                      help="the PNG (default: beside the run, seed<k>.retrieval.png)")  # fmt: skip
    show.add_argument("--data-root", type=Path,
                      help="the run's dataset folder, as given to run (none for glyphs)")  # fmt: skip
    show.set_defaults(handler=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    """Draw the grid and print its path."""
    from harness.evaluate.retrieval_rows import RowChoice, folder_of
    from harness.report.retrieval import default_out, draw_retrieval_grid

    folder = folder_of(args.path)
    out = args.out if args.out is not None else default_out(folder)
    choice = RowChoice(k=args.k, worst=args.worst, best=args.best, random=args.random,
                       seed=args.seed)  # fmt: skip
    png = draw_retrieval_grid(folder, out, choice, data_root=args.data_root)
    print(png)
    return 0
