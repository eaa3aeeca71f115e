"""The small commands: `ls` (methods, protocols, datasets), `evaluate` (score embeddings you
bring or a run saved; its own module, harness.cli.evaluate), `leaderboard` (regenerate it
from results), `validate` (check protocol files as `run` does) and `data` (verify or fetch
datasets; its own module, harness.cli.data)."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from harness.cli import data, evaluate
from harness.cli.argtypes import add_plugin_option
from harness.core import (
    METHODS,
    PROTOCOL_DIR,
    HarnessError,
    describe_source,
    load_methods,
    load_protocol,
    protocol_names,
)
from harness.data import DATASETS
from harness.sweep import check_protocol

log = logging.getLogger("harness")


def add_parser(sub: argparse._SubParsersAction) -> None:
    ls = sub.add_parser("ls", help="list methods (summary and default hyperparameters), "
                        "protocols and datasets")  # fmt: skip
    ls.add_argument("--json", action="store_true", help="the same as JSON, for scripts")
    add_plugin_option(ls)
    ls.set_defaults(handler=cmd_ls)

    evaluate.add_parser(sub)

    lb = sub.add_parser("leaderboard", help="regenerate results/LEADERBOARD.md")
    lb.add_argument(
        "--results-dir", default="results", help="the results folder (default: results)"
    )
    lb.add_argument("--reference", nargs="?", const="", metavar="DIR",
                    help="add, per protocol hash of your runs, one table of your runs and the "
                    "committed reference runs of that hash from DIR (default: the clone's "
                    "results/reference), with vs best and P(worse · ≈ · better); no reference "
                    "run is made again")  # fmt: skip
    lb.set_defaults(handler=cmd_leaderboard)

    val = sub.add_parser("validate", help="check protocol files as `run` does before training "
                         "(names, types, datasets, backbones, methods and hyperparameters)")  # fmt: skip
    val.add_argument("paths", nargs="*", help="default: every shipped protocol")
    add_plugin_option(val)
    val.set_defaults(handler=cmd_validate)
    data.add_parser(sub)


def cmd_ls(args: argparse.Namespace) -> int:
    load_methods()

    listing = {
        "methods": [
            {"name": n, "version": METHODS.get(n).version, "paper": METHODS.get(n).paper,
             "family": METHODS.get(n).family, "needs_coarse_labels": METHODS.get(n).needs_coarse_labels,
             "hyperparameters": METHODS.get(n).defaults(), "summary": METHODS.get(n).summary,
             "source": METHODS.get(n).source or {"builtin": "harness.methods"}}
            for n in METHODS.names()
        ],
        "protocols": [],
        "datasets": DATASETS.names(),
        "method_prefixes": METHODS.prefixes(),
    }  # fmt: skip

    log.debug("shipped protocols from %s", PROTOCOL_DIR)
    for name in protocol_names():
        p = load_protocol(name)
        listing["protocols"].append(
            {"name": name, "version": p.version, "hash": p.hash, "dataset": p.dataset.name,
             "description": p.description}
        )  # fmt: skip
    if args.json:
        print(json.dumps(listing, indent=2))
        return 0
    width = max(len(item["name"]) for kind in ("methods", "protocols") for item in listing[kind])
    columns = max(shutil.get_terminal_size((100, 24)).columns, width + 40)
    for kind in ("methods", "protocols"):
        print(f"{kind}:")
        for item in listing[kind]:
            text = item.get("summary") or item.get("description") or ""
            print(_entry(item["name"], width, text, columns))
            if kind == "methods":
                print(_entry("", width, _hyperparameters(item["hyperparameters"]), columns))
                if "builtin" not in item["source"]:
                    print(_entry("", width, f"from {describe_source(item['source'])}", columns))
    print("datasets:\n  " + "\n  ".join(listing["datasets"]))
    for prefix, names in listing["method_prefixes"].items():
        print(f"{prefix}: methods (--method {prefix}:<Class>[+<Class>]):\n  " + " ".join(names))
    return 0


def _entry(name: str, width: int, text: str, columns: int) -> str:
    """`  name  text`, the text whole (never cut), wrapped under itself to the terminal."""
    first = f"  {name:<{width}}  "
    return textwrap.fill(text, columns, initial_indent=first, subsequent_indent=" " * len(first),
                         break_on_hyphens=False, break_long_words=False) or first.rstrip()  # fmt: skip


def _hyperparameters(defaults: dict[str, Any]) -> str:
    """A method's default hyperparameters as a protocol's `methods.<name>` would write them:
    `margin=1.0, hard_ratios=[1.0, 0.5, 0.2], head_dim=null`."""
    if not defaults:
        return "hyperparameters: none"
    return "hyperparameters: " + ", ".join(
        f"{k}={json.dumps(list(v) if isinstance(v, tuple) else v)}" for k, v in defaults.items()
    )


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from harness.report import write_leaderboard

    load_methods()  # the figures group methods by the family their registry entry declares

    from harness.report.beside import committed_reference

    reference = None
    if args.reference is not None:
        reference = Path(args.reference) if args.reference else committed_reference()
    print(write_leaderboard(Path(args.results_dir), reference))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Each protocol parsed and given the checks `run` makes before its first run that need no
    data (harness.sweep.preflight: dataset, backbone, methods and their hyperparameters)."""
    load_methods()

    paths = args.paths or [str(p) for p in sorted(PROTOCOL_DIR.glob("*.yaml"))]
    bad = 0
    for path in paths:
        try:
            p = load_protocol(path)
            check_protocol(p)
        except HarnessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            bad += 1
            continue
        print(f"ok  {path}  ({p.name} v{p.version}, hash {p.hash})")
    return 2 if bad else 0
