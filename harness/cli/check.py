"""`check`: CI's regression check, every method's metrics on the small `regression` protocol
against the committed baselines (results/reference/baselines; harness.check).

It prints both machines, the mode, a one-line summary and only the rows that failed, changed
or improved; `--full` prints every row and the smallest drop each metric's test can see. Its
runs go to a temporary folder: only `--update` writes a file, the baseline."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness.cli.argtypes import add_aliased, add_fetch_option, add_plugin_option, positive_int
from harness.core import HarnessError, load_methods


def add_parser(sub: argparse._SubParsersAction) -> None:
    ck = sub.add_parser("check", help="CI regression check of every method's metrics")
    ck.add_argument("--protocol", default="regression",
                    help="protocol name or YAML path (default: regression)")  # fmt: skip
    add_aliased(
        ck,
        "--method",
        "--methods",
        dest="methods",
        help="NAME[,NAME...] (default: every registered method)",
    )
    ck.add_argument(
        "--baselines", type=Path,
        help="folder of baseline files (default: the clone's results/reference/baselines)",
    )  # fmt: skip
    ck.add_argument("--update", action="store_true", help="rewrite the baselines from this run")
    ck.add_argument("--reason", help="why the baselines change (required with --update)")
    ck.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto (default): cuda when a GPU is visible, else cpu")  # fmt: skip
    ck.add_argument(
        "--mode", default="auto", choices=["auto", "exact", "statistical"],
        help="auto (default): exact on the baseline's machine fingerprint; elsewhere a row whose "
        "numbers all reproduce passes as exact and the others are tested statistically. "
        "exact: every number must reproduce. statistical: every row by the t-test",
    )  # fmt: skip
    ck.add_argument(
        "--numerics", default="auto", choices=["auto", "pinned", "native"],
        help="auto (default): the runs pinned to processor-independent kernels wherever that "
        "holds (x86-64 with AVX2 and FMA, on the CPU), else native; --update needs pinned",
    )  # fmt: skip
    ck.add_argument("--full", action="store_true",
                    help="print every row and the detectable-drop table, not just the summary "
                    "and the rows that failed, changed or improved")  # fmt: skip
    ck.add_argument(
        "--baseline-seeds", type=positive_int, default=None,
        help="with --update: how many seeds (0..N-1) the baseline records (default 20)",
    )  # fmt: skip
    add_plugin_option(ck)
    add_fetch_option(ck)
    ck.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from harness.check import BASELINE_DIR, BASELINE_SEEDS, check, update_baselines

    load_methods()

    if args.update and not args.reason:
        raise HarnessError("--update needs --reason TEXT saying why the baselines change")
    if args.reason and not args.update:
        raise HarnessError("--reason goes with --update")
    if args.baseline_seeds is not None and not args.update:
        raise HarnessError("--baseline-seeds goes with --update")
    if args.full and args.update:
        raise HarnessError("--full shapes the check's report; --update prints none: drop --full")
    names = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    start = time.perf_counter()
    if args.update:
        passed, report = update_baselines(
            args.protocol, names, args.baselines or BASELINE_DIR, args.reason,
            device=args.device, baseline_seeds=args.baseline_seeds or BASELINE_SEEDS,
            numerics=args.numerics,
        )  # fmt: skip
    else:
        passed, report = check(args.protocol, names, args.baselines or BASELINE_DIR,
                               device=args.device, mode=args.mode, full=args.full,
                               numerics=args.numerics)  # fmt: skip
    print(report)
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0 if passed else 1
