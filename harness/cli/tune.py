"""`tune`: equal-budget Optuna studies on validation classes, one per method."""

from __future__ import annotations

from typing import Any

import yaml

from harness.cli.argtypes import (
    add_fetch_option,
    add_plugin_option,
    add_tracker_options,
    positive_int,
)
from harness.cli.run import terminate
from harness.core import METHODS, load_methods
from harness.records import tracking_config
from harness.tune import TuneOptions, tune


def add_parser(sub: Any) -> None:

    tn = sub.add_parser("tune", help="equal-budget Optuna tuning on validation classes")
    tn.add_argument("--protocol", required=True, help="protocol name or YAML path (needs "
                    "split.validation_fraction > 0)")  # fmt: skip
    which = tn.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every registered method (one with "
                       "no search space is named and skipped)")  # fmt: skip
    which.add_argument("--method", help="NAME[,NAME...]")
    tn.add_argument("--trials", type=positive_int, required=True, help="trials per method")
    tn.add_argument("--folds", type=positive_int, default=1,
                    help="class-disjoint folds of the training classes (default 1)")  # fmt: skip
    tn.add_argument("--storage", help="Optuna storage URL (default: an SQLite file under "
                    "<results-dir>/tuning/<protocol>/); share one to run several workers")  # fmt: skip
    tn.add_argument(
        "--results-dir", default="results", help="the results folder (default: results)"
    )
    tn.add_argument("--data-root", help="folder holding the dataset's files")
    tn.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto (default): cuda when a GPU is visible, else cpu")  # fmt: skip
    tn.add_argument("--max-steps", type=positive_int, help="cap each trial's steps (smoke)")
    tn.add_argument("--processes", type=positive_int, default=1, metavar="N",
                    help="with the local engine: N methods' studies side by side, each in a "
                    "process of its own with the cores shared out (default 1)")  # fmt: skip
    tn.add_argument("--engine", default="local", choices=["local", "ray"],
                    help="local: trials one after another here; ray: trials as Ray tasks")  # fmt: skip
    tn.add_argument("--address", help="with --engine ray: an existing cluster (default: local)")
    tn.add_argument("--cpus-per-trial", type=positive_int, default=1,
                    help="with --engine ray: CPUs (and torch threads) per trial")  # fmt: skip
    tn.add_argument("--gpus-per-trial", type=float, default=0.0,
                    help="with --engine ray: GPUs per trial")  # fmt: skip
    add_tracker_options(tn)
    add_plugin_option(tn)
    add_fetch_option(tn)
    tn.set_defaults(handler=cmd_tune)

    cal = sub.add_parser("calibrate", help="choose a protocol's settings on validation classes "
                         "(protocols/calibration/NAME.yaml) and record how they were chosen")  # fmt: skip
    cal.add_argument("calibration", help="calibration name (protocols/calibration/) or YAML path")
    cal.add_argument("--results-dir", default="results", help="the record goes to "
                     "<results-dir>/calibration/NAME.json and .md (default: results)")  # fmt: skip
    cal.add_argument("--data-root", help="folder holding the dataset's files")
    cal.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                     help="auto (default): cuda when a GPU is visible, else cpu")  # fmt: skip
    cal.add_argument("--max-steps", type=positive_int, help="cap each run's steps (smoke)")
    add_fetch_option(cal)
    cal.set_defaults(handler=cmd_calibrate)


def cmd_tune(args: Any) -> int:
    import signal
    import sys

    load_methods()

    asked = (
        METHODS.names() if args.all else [m.strip() for m in args.method.split(",") if m.strip()]
    )
    names = [m for m in asked if m not in METHODS or METHODS.get(m).search]  # unknown: tune says
    for name in asked:
        if name not in names:  # tuning it would run the same configuration trial after trial
            print(f"{name}: no search space, not tuned (its paper-default runs stand for it)")
    tracking = tracking_config(args.tracker, args.tracker_uri, args.results_dir)
    previous = signal.signal(signal.SIGTERM, terminate)  # SIGTERM stops like Ctrl-C
    try:
        options = TuneOptions(
            folds=args.folds, storage=args.storage, results_dir=args.results_dir,
            data_root=args.data_root, device=args.device, max_steps=args.max_steps,
            progress=not args.quiet, engine=args.engine, address=args.address,
            cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial,
            processes=args.processes, tracking=tracking,
        )  # fmt: skip
        written = tune(args.protocol, names, args.trials, options)
    except KeyboardInterrupt:
        print("\ninterrupted: finished trials are kept in the study (the interrupted one is "
              "recorded as failed); run the same command again to resume", file=sys.stderr)  # fmt: skip
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    for name, path in written.items():
        study = yaml.safe_load(path.read_text(encoding="utf-8"))["study"]
        print(f"{name}: best {study['best_value']:.4f} (trial {study['best_trial']}; paper "
              f"default {study['paper_default_value']}) of {study['trials']} trials -> {path}")  # fmt: skip
    return 0


def cmd_calibrate(args: Any) -> int:
    import sys

    from harness.tune.calibrate import calibrate, record_path

    load_methods()
    try:
        record = calibrate(args.calibration, args.results_dir, args.data_root, args.device,
                           args.max_steps, progress=not args.quiet)  # fmt: skip
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept in the record; run the same command again "
              "to resume", file=sys.stderr)  # fmt: skip
        return 130
    choice = record["choice"]
    path = record_path(args.results_dir, args.calibration.rsplit("/", 1)[-1].split(".")[0])
    for row in choice["candidates"][:5]:
        print(f"{row['candidate']}: reference mean {100 * row['mean_map@r']:.2f} MAP@R "
              f"({100 * row['gain_over_zero_shot']:+.2f} vs zero-shot), full sweep about "
              f"{row['sweep_minutes']:.0f} min")  # fmt: skip
    print(f"chosen: {choice['chosen'] or 'none fits the budget'}"
          f"{'' if choice['learns'] else ' (training does not beat zero-shot on validation)'}"
          f" -> {path}")  # fmt: skip
    return 0
