"""`report`: the results as a static HTML report (<results-dir>/report/index.html): the
leaderboard with sortable tables, a page per protocol and method, and the cost page."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.core import load_methods


def add_parser(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="write the results as a static HTML report "
                            "(<results-dir>/report/index.html, open it in a browser)")  # fmt: skip
    report.add_argument(
        "--results-dir", default="results", help="the results folder (default: results)"
    )
    report.add_argument("--out", type=Path, help="the folder to write (default: "
                        "<results-dir>/report; a report there is replaced)")  # fmt: skip
    report.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report import write_report

    load_methods()  # the figures group methods by the family their registry entry declares

    print(write_report(Path(args.results_dir), args.out))
    return 0
