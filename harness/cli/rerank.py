"""`rerank`: does re-ranking change which method is best? Score the runs a results folder
saved embeddings for (`run --save-embeddings`) without and with each re-ranking, one record
per run (harness.evaluate.reranked), and write the table RERANKING.md from the records
(harness.report.reranked)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.argtypes import add_aliased
from harness.evaluate.reranked import DEFAULT_RERANKS, write_records
from harness.report.reranked import write_table


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `rerank` subcommand's options."""
    rr = sub.add_parser("rerank", help="score saved runs without and with each re-ranking "
                        "(k-reciprocal, aQE+DBA) and write the table")  # fmt: skip
    rr.add_argument("--results-dir", required=True, type=Path,
                    help="where the runs with saved embeddings are (its runs/<protocol>/...)")  # fmt: skip
    add_aliased(
        rr, "--protocol", "--protocols", dest="protocols", required=True, help="NAME[,NAME...]"
    )
    rr.add_argument("--rerank", action="append", metavar="NAME[:k=v,...]",
                    help=f"a re-ranking to compare (repeat; default: {', '.join(DEFAULT_RERANKS)}"
                    " at their papers' parameters)")  # fmt: skip
    rr.add_argument("--out", required=True, type=Path,
                    help="the records' folder; RERANKING.md is written there")  # fmt: skip
    rr.set_defaults(handler=cmd_rerank)


def cmd_rerank(args: argparse.Namespace) -> int:
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    reranks = args.rerank or list(DEFAULT_RERANKS)
    written = write_records(args.results_dir, args.out, protocols, reranks,
                            progress=not args.quiet)  # fmt: skip
    path = write_table(args.out, protocols)
    print(f"{len(written)} run(s) scored; table: {path}")
    return 0
