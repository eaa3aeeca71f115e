"""The `cost` command: its options, and what it measures and writes (the measuring is in
the rest of `harness.cost`). torch is imported only when the command runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cli.argtypes import add_aliased, add_fetch_option, add_plugin_option, positive_int
from harness.core import METHODS, HarnessError, load_methods, load_protocol, resolve_device
from harness.cost import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_REPEATS,
    DEFAULT_ROUNDS,
    DEFAULT_STEPS,
    CostOptions,
    cost_context,
    devices_path,
    figure_path,
    measure_cost,
    measure_devices,
    measure_pipeline,
    parse_batch_sizes,
    parse_counts,
    parse_workers,
    replace_record,
    save_cost,
)
from harness.data import check_data_root
from harness.sweep import check_protocol

if TYPE_CHECKING:
    from harness.core import Protocol


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `cost` subcommand: how mining and loss cost grow with the batch size."""
    cost = sub.add_parser("cost", help="measure how mining and loss cost grow with the batch size")
    which = cost.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every registered method (default)")
    add_aliased(which, "--method", "--methods", dest="methods", help="NAME[,NAME...]")
    cost.add_argument("--protocol", default="default", help="protocol name or YAML path")
    cost.add_argument(
        "--batch-sizes",
        default=",".join(map(str, DEFAULT_BATCH_SIZES)),
        help="comma-separated multiples of the protocol's K (default: %(default)s)",
    )
    cost.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS,
                      help="timed calls per batch size, at most (default: %(default)s)")  # fmt: skip
    cost.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS,
                      help="training steps timed per method and round for throughput "
                      "(default: %(default)s)")  # fmt: skip
    cost.add_argument("--rounds", type=positive_int, default=DEFAULT_ROUNDS,
                      help="throughput: interleaved rounds, every method timed once per round, "
                      "the fastest round of each kept (default: %(default)s)")  # fmt: skip
    cost.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                      help="auto (default): cuda when a GPU is visible, else cpu")  # fmt: skip
    cost.add_argument("--data-root", help="folder holding the dataset's files")
    cost.add_argument("--results-dir", default="results", help="default: results")
    cost.add_argument("--no-overhead", action="store_true",
                      help="skip the harness-versus-bare-loop comparison")  # fmt: skip
    cost.add_argument(
        "--overhead-method", metavar="NAME",
        help="the method the harness-versus-bare-loop comparison trains; one of the methods "
        "measured (default: the first of them whose throughput was measured)",
    )  # fmt: skip
    cost.add_argument("--overhead-breakdown", action="store_true",
                      help="also time each piece of the harness's bookkeeping alone")  # fmt: skip
    cost.add_argument(
        "--devices", metavar="N[,N...]",
        help="instead: scaling across devices, the training step of one method (--methods "
        "NAME) under torchrun on each number of processes, 1 included",
    )  # fmt: skip
    cost.add_argument("--threads-per-process", type=positive_int,
                      help="--devices on the CPU: torch threads per process (default: the "
                      "cores / the largest N)")  # fmt: skip
    cost.add_argument("--pipeline", action="store_true",
                      help="instead: the data pipeline's images/s per worker count (--workers) "
                      "and the data-wait share of a training step")  # fmt: skip
    cost.add_argument("--workers", metavar="N[,N...]",
                      help="--pipeline: worker counts (default: 1, 2, 4, ... up to the cores)")  # fmt: skip
    cost.add_argument("--decoder", choices=["pil", "torch"], default="pil",
                      help="--pipeline: who decodes the files: PIL in the workers (default) or "
                      "torchvision on the device (nvJPEG on CUDA; the workers only read them)")  # fmt: skip
    cost.add_argument("--json", action="store_true", help="print the per-method list as JSON")
    add_plugin_option(cost)
    add_fetch_option(cost)
    cost.set_defaults(handler=cmd_cost)
    return cost


def _cost_methods(args: argparse.Namespace, protocol: Protocol) -> list[str]:
    """The methods --methods names (default: every registered one), each checked against the
    registry and the protocol's overrides before anything is measured."""

    if getattr(args, "methods", None):
        names = list(dict.fromkeys(m.strip() for m in args.methods.split(",") if m.strip()))
        if not names:
            raise HarnessError("--methods: give at least one method name")
    else:
        names = METHODS.names()
    check_protocol(protocol, names)  # what run and validate check, before any measurement
    asked = getattr(args, "overhead_method", None)
    if asked is not None and asked not in names:
        METHODS.get(asked)  # an unknown name: "did you mean"
        raise HarnessError(
            f"--overhead-method {asked} is not among the methods measured; add it to --methods"
        )
    return names


def cmd_cost(args: argparse.Namespace) -> int:
    """`python -m harness cost`: measure, write results/cost/<protocol>.json and the figure,
    print the table (or, with --json, the list of per-method objects). Returns the exit
    status: 1 when a method failed, else 0."""
    from harness.report import consistency_line, cost_figure, cost_table, overhead_line

    protocol = load_protocol(args.protocol)
    if protocol.features.cached:
        raise HarnessError(f"protocol {protocol.name} trains on a frozen trunk's cached outputs "
                           "(features:), which cost does not time: measure the methods under "
                           "a protocol that trains on images (e.g. default, birds_gpu)")  # fmt: skip
    check_data_root(protocol, args.data_root)  # before anything is measured
    if args.pipeline:
        return _cost_pipeline(args, protocol)
    sizes = parse_batch_sizes(args.batch_sizes, protocol.sampler.images_per_class)
    load_methods()

    names = _cost_methods(args, protocol)
    if args.devices is not None:
        return _cost_devices(args, protocol, names)
    options = CostOptions(
        sizes, repeats=args.repeats, steps=args.steps, rounds=args.rounds,
        overhead=not args.no_overhead,
        breakdown=args.overhead_breakdown, overhead_on=getattr(args, "overhead_method", None),
    )  # fmt: skip
    ctx = cost_context(protocol, resolve_device(args.device), args.data_root)
    record = measure_cost(ctx, names, options)
    results_dir = Path(args.results_dir)
    # with the file's other methods when comparable, else archiving it; under the file's lock
    written, path, figure = save_cost(
        record, results_dir, lambda r: cost_figure(r, figure_path(results_dir, protocol.name))
    )
    if args.json:  # the rows measured now, as written (with their `measured`)
        rows = {e["method"]: e for e in written["methods"]}
        print(json.dumps([rows[e["method"]] for e in record["methods"]], indent=2))
    else:
        print(cost_table(record))
        print()
        print(consistency_line(record))
        print(overhead_line(record))
        kept = len(written["methods"]) - len(record["methods"])
        merged = f" (and {kept} earlier method row(s) kept)" if kept else ""
        print(f"written: {path}{merged}, {figure} ({record['seconds']:.0f} s)")
    return 1 if any(e["status"] == "failed" for e in record["methods"]) else 0


def _cost_devices(args: argparse.Namespace, protocol: Protocol, names: list[str]) -> int:
    """`cost --devices`: write results/cost/devices/<protocol>.json and print its table."""
    from harness.report import devices_table

    if len(names) != 1 or not args.methods:
        raise HarnessError("--devices measures one method: name it with --methods NAME")
    counts = parse_counts(args.devices, protocol.sampler.batch_size)
    record = measure_devices(protocol, names[0], counts, device=args.device, steps=args.steps,
                             threads_per_rank=args.threads_per_process,
                             data_root=args.data_root)  # fmt: skip
    path = devices_path(Path(args.results_dir), protocol.name)
    replace_record(path, record, Path(args.results_dir))
    if args.json:
        print(json.dumps(record["rows"], indent=2))
    else:
        print(devices_table(record))
        print(f"written: {path} ({record['seconds']:.0f} s)")
    return 0


def _cost_pipeline(args: argparse.Namespace, protocol: Protocol) -> int:
    """`cost --pipeline`: write results/cost/pipeline/<protocol>.json and print it."""
    load_methods()

    counts = parse_workers(args.workers)
    asked = [m.strip() for m in (args.methods or "").split(",") if m.strip()]
    if len(asked) > 1:
        raise HarnessError("--pipeline trains one method for the data-wait share: give one name "
                           "to --methods (or none)")  # fmt: skip
    ctx = cost_context(protocol, resolve_device(args.device), args.data_root, args.decoder)
    record = measure_pipeline(ctx, counts, steps=args.steps, method=asked[0] if asked else None,
                              rounds=args.rounds)  # fmt: skip
    path = Path(args.results_dir) / "cost" / "pipeline" / f"{protocol.name}.json"
    replace_record(path, record, Path(args.results_dir))
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    for row in record["pipeline"]:
        print(f"{row['workers']} worker(s): {row['images_per_second']:.0f} images/s decoded and "
              f"augmented, {row['speedup']:.2f}x the first count "
              f"({record['load_size'] or 'original'} -> {record['input_size']} px, "
              f"decoder {record['decoder']})")  # fmt: skip
    t = record["training"]
    print(f"data-wait share of a training step: {record['data_wait_share'] * 100:.1f}% "
          f"({t['backbone']}, {t['backbone_weights']} weights, {t['workers']} workers, "
          f"{t['step_ms']:.0f} ms per step)")  # fmt: skip
    print(f"written: {path} ({record['seconds']:.0f} s)")
    return 0
