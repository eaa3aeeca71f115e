"""`compare A B`: is method A better than method B under a protocol? The difference of
their per-seed means with its 95% interval and p-value."""

from __future__ import annotations

import argparse
import difflib
import math
from pathlib import Path

from harness.cli.argtypes import add_plugin_option
from harness.core import (
    METHODS,
    SINGLE_METRICS,
    UNBOUNDED_METRICS,
    HarnessError,
    Protocol,
    closest,
    is_single_metric,
    load_methods,
    load_protocol,
    program_name,
)
from harness.records import load_results, reference_dir
from harness.stats import CONFIDENCE, Comparison, compare, protocol_rope, seed_probs, t_interval


def add_parser(sub: argparse._SubParsersAction) -> None:
    cmp = sub.add_parser("compare", help="is method A better than method B? (difference, CI, p)")
    cmp.add_argument("a", metavar="A", help="method (NAME+tuned for its tuned configuration)")
    cmp.add_argument("b", metavar="B", help="the method A is compared with (NAME or NAME+tuned)")
    cmp.add_argument("--protocol", default="default", help="protocol name or YAML path")
    cmp.add_argument("--metric", help="default: the protocol's main metric (evaluation.select_by)")
    cmp.add_argument(
        "--results-dir", default="results", help="the results folder (default: results)"
    )
    cmp.add_argument("--max-steps", type=int, help="compare runs capped at this --max-steps "
                     "(default: full runs only)")  # fmt: skip
    cmp.add_argument("--reference", nargs="?", const="", metavar="DIR",
                     help="also read the committed reference runs of the same protocol hash "
                     "from DIR (default: the clone's results/reference): a method you have not "
                     "run is taken from there; seeds pair whichever machine made them, as "
                     "everywhere")  # fmt: skip
    add_plugin_option(cmp)
    cmp.set_defaults(handler=cmd_compare)


def describe(c: Comparison, scale: float = 100.0) -> str:
    """A comparison in words: the difference with its interval, the test and its p-value (or
    why there is no test)."""
    if c.test == "none":
        return (f"difference {c.difference * scale:+.2f}; no test: a method has only one "
                "finished seed (run more seeds: --seeds 0,1,2)")  # fmt: skip
    lo, hi = (c.difference - c.half_width) * scale, (c.difference + c.half_width) * scale
    unit = " points" if scale == 100.0 else ""
    return (f"difference {c.difference * scale:+.2f}{unit}, {CONFIDENCE:.0%} CI "
            f"[{lo:+.2f}, {hi:+.2f}] ({c.test} test, n = {c.n}), p = {c.p:.3g}")  # fmt: skip


def cmd_compare(args: argparse.Namespace) -> int:

    from harness.records import per_seed
    from harness.report.machines import across_line, row_machines

    protocol = load_protocol(args.protocol)
    metric = args.metric or protocol.evaluation.select_by
    if not is_single_metric(metric):
        raise HarnessError(f"unknown metric {metric!r}{closest(metric, SINGLE_METRICS)}; known: "
                           f"recall@<k> (e.g. recall@1), {', '.join(SINGLE_METRICS)}")  # fmt: skip
    everything = [
        r for r in load_results(Path(args.results_dir)) if r.protocol.hash == protocol.hash
    ]
    runs = [r for r in everything if r.training.max_steps == args.max_steps]
    capped = sorted({r.training.max_steps for r in everything} - {None, args.max_steps})
    if args.reference is not None:
        return _with_reference(args, protocol, metric, runs)
    values = per_seed(runs, metric)
    for name in (args.a, args.b):
        split = sorted(n for n in values if n.startswith(f"{name}@"))
        if name not in values and split:
            raise HarnessError(
                f"the {protocol.name} runs of {name!r} differ in method version or "
                f"hyperparameters and are never averaged: compare one of {', '.join(split)}"
            )
        if name not in values:
            raise HarnessError(_no_runs(args, protocol, metric, name, values, capped))
    a, b = values[args.a], values[args.b]
    scale = 1.0 if metric in UNBOUNDED_METRICS else 100.0  # a ratio is shown as is
    cap = "" if args.max_steps is None else f", runs capped at {args.max_steps} steps"
    print(f"{metric} on {protocol.name} (protocol v{protocol.version}, hash {protocol.hash}{cap})")
    for name, v in ((args.a, a), (args.b, b)):
        mean, half = t_interval(list(v.values()))
        spread = "" if math.isnan(half) else f" ± {half * scale:.2f}"
        print(f"  {name}: {mean * scale:.2f}{spread} ({len(v)} seed{'s' * (len(v) != 1)}: "
              f"{', '.join(map(str, sorted(v)))})")  # fmt: skip
    print(f"  {args.a} − {args.b}: {describe(compare(a, b), scale)}")
    machines = row_machines(runs)
    _machines_note(args.a, args.b, across_line({n: machines[n] for n in (args.a, args.b)}))
    rope = protocol.evaluation.rope
    probs = seed_probs({s: scale * v for s, v in a.items()}, {s: scale * v for s, v in b.items()},
                       rope)  # fmt: skip
    if probs is not None:
        print(f"  P({args.a} worse · ≈ · better than {args.b}, ROPE ±{rope:g}): {probs.cell()} "
              f"(Bayesian correlated t-test over the {probs.n} seeds both ran)")  # fmt: skip
    return 0


def _machines_note(a: str, b: str, line: str) -> None:
    """Where the two rows come from different machines, say so, and that their seeds pair."""
    if line:
        print(f"  {a} and {b} were {line}")


def _no_runs(
    args: argparse.Namespace, protocol: Protocol, metric: str, name: str, values: dict,
    capped: list[int],
) -> str:  # fmt: skip
    """Why `name` cannot be compared, and a command that runs as printed: for a misspelt name
    the suggestion's (compare it when it has runs, else run it), with the --plugin files given."""
    load_methods()
    method = name.split("+")[0].split("@")[0]
    known = sorted(set(values) | set(METHODS.names()))
    close = [] if method in METHODS else difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    suggestion = close[0] if close else ""
    plugins = "".join(f" --plugin {p}" for p in getattr(args, "plugin", None) or [])
    head = (f"no finished {protocol.name} run of {name!r} reports {metric} under "
            f"{args.results_dir} (protocol hash {protocol.hash})"
            + (f" (did you mean {suggestion!r}?)" if suggestion else ""))  # fmt: skip
    if suggestion in values:
        pair = (suggestion, args.b) if name == args.a else (args.a, suggestion)
        return (f"{head}; compare it: `{program_name()} compare {pair[0]} {pair[1]} --protocol "
                f"{protocol.argument} --results-dir {args.results_dir}{plugins}`")  # fmt: skip
    method = (suggestion or method).split("+")[0].split("@")[0]
    tail = (f" (runs capped by --max-steps {', '.join(map(str, capped))} exist: pass compare "
            "the same --max-steps)" if capped else "")  # fmt: skip
    return (f"{head}; run `{program_name()} run --protocol {protocol.argument} --method {method}"
            f"{plugins}` first{_committed(args.results_dir, protocol.name)}{tail}")  # fmt: skip


def _committed(results_dir: str, protocol: str) -> str:
    """A hint at the committed reference's runs of `protocol`, when results_dir has some."""
    reference = reference_dir(results_dir)
    if reference is None or not any((reference / "runs" / protocol).glob("*/seed*.json")):
        return ""
    return f", or compare the committed reference's runs with --results-dir {reference}"


def _with_reference(args: argparse.Namespace, protocol: Protocol, metric: str,
                    runs: list) -> int:  # fmt: skip
    """compare --reference: A and B among your runs and the reference's of the same hash
    (yours first; a reference row of a name you also ran is `NAME (reference)`)."""
    from harness.report.beside import committed_reference, matching, rows, versus
    from harness.report.machines import across_line

    if args.max_steps is not None:
        raise HarnessError("--reference compares full runs only: drop --max-steps")
    reference = Path(args.reference) if args.reference else committed_reference()
    theirs = matching(reference, reference, protocol.name, {protocol.hash})
    table = rows(runs, theirs, metric)
    for name in (args.a, args.b):
        if name not in table:
            known = sorted(table)
            raise HarnessError(f"no finished {protocol.name} run of {name!r} under "
                               f"{args.results_dir} or {reference} (protocol hash "
                               f"{protocol.hash}){closest(name, known)}; rows: "
                               f"{', '.join(known) or 'none'}")  # fmt: skip
    a, b = table[args.a], table[args.b]
    scale = 1.0 if metric in UNBOUNDED_METRICS else 100.0
    rope = protocol_rope(protocol.content())
    print(f"{metric} on {protocol.name} (protocol v{protocol.version}, hash {protocol.hash})")
    for row in (a, b):
        mean, half = t_interval(list(row.values.values()))
        spread = "" if math.isnan(half) else f" ± {half * scale:.2f}"
        print(f"  {row.name}: {mean * scale:.2f}{spread} ({row.source}, "
              f"{len(row.values)} seeds, made on {row.described})")  # fmt: skip
    comparison, probs = versus(a, b, rope, scale)
    print(f"  {a.name} − {b.name}: {describe(comparison, scale)}")
    _machines_note(a.name, b.name, across_line({r.name: frozenset({r.described}) for r in (a, b)}))
    if probs is not None:
        print(f"  P({a.name} worse · ≈ · better than {b.name}, ROPE ±{rope:g}): {probs.cell()}")
    return 0
