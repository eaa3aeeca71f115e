"""`run`: train and evaluate methods under a protocol, one result file per (method, seed), then
the leaderboard; under torchrun, one run on several processes.

With the default `--results-dir results` the runs, leaderboard, figures, checkpoints and
archive are the user's own (git ignores them); the committed reference results stay in
results/reference, untouched, and the leaderboard sets the two side by side. The last line
names both leaderboards."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

import torch.distributed

from harness.cli.argtypes import (
    add_fetch_option,
    add_plugin_option,
    add_tracker_options,
    nonnegative_int,
    positive_int,
    seed_list,
)
from harness.core import (
    METHODS,
    SINGLE,
    HarnessError,
    init_from_env,
    launched,
    leave,
    load_methods,
    load_protocol,
    program_name,
    resolve_device,
)
from harness.records import reference_dir, result_paths, tracking_config
from harness.sweep import RunSpec, not_applicable_on, plan, sweep, sweep_ray
from harness.train import check_compile

log = logging.getLogger("harness")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `run` subcommand's options."""
    run = sub.add_parser("run", help="train and evaluate methods under a protocol")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every registered method")
    which.add_argument("--method", help="NAME[,NAME...]")
    run.add_argument("--protocol", default="default", help="protocol name or YAML path")
    run.add_argument("--seeds", type=seed_list, help="override the protocol's seeds, e.g. 0,1,2")
    run.add_argument("--data-root", help="folder holding the dataset's files")
    run.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                     help="auto (default): cuda when a GPU is visible, else cpu")  # fmt: skip
    run.add_argument("--max-steps", type=positive_int, help="cap training steps (smoke runs)")
    run.add_argument("--results-dir", default="results",
                     help="default: results (yours, untracked; the committed reference results "
                     "stay in results/reference)")  # fmt: skip
    run.add_argument("--force", action="store_true", help="rerun even if a result exists")
    run.add_argument("--tuned", action="store_true", help="use the configuration `tune` found "
                     "(results-dir/tuning/<protocol>/<method>.yaml) instead of the paper's")  # fmt: skip
    run.add_argument(
        "--weights", help="local pretrained weights file (a state_dict saved with torch.save, "
        "or .safetensors) for a pretrained backbone, for machines that cannot download them",
    )  # fmt: skip
    run.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                     help="override the protocol's precision (part of the protocol's hash, so "
                     "the results record it)")  # fmt: skip
    run.add_argument("--workers", type=nonnegative_int, metavar="N",
                     help="processes that load and augment batches beside training (default: "
                     "0 for images in memory without augmentation, else the cores, at most 8); "
                     "results do not depend on it")  # fmt: skip
    run.add_argument("--decoder", choices=["pil", "torch"], default="pil",
                     help="who decodes image files: PIL in the workers (default) or torchvision "
                     "on the run's device (nvJPEG on CUDA; the workers only read the files); "
                     "recorded in each result")  # fmt: skip
    run.add_argument("--compile", action="store_true",
                     help="train the backbone through torch.compile (inductor: a C++ compiler on "
                     "the CPU, Triton on CUDA); not part of the hash: rounding differs from eager "
                     "by float-rounding amounts; recorded in each result")  # fmt: skip
    _add_keep_options(run)
    run.add_argument("--engine", default="local", choices=["local", "ray"],
                     help="local: one run after another in this process (default); ray: each "
                     "run a Ray task (needs the ray extra)")  # fmt: skip
    run.add_argument("--address", help="with --engine ray: auto, HOST:PORT or ray://... of an "
                     "existing cluster (default: start a local Ray on this machine)")  # fmt: skip
    run.add_argument("--cpus-per-run", type=positive_int,
                     help="with --engine ray: CPUs per task, also its torch threads (default 1)")  # fmt: skip
    run.add_argument("--gpus-per-run", type=float,
                     help="with --engine ray: GPUs per task (default 0)")  # fmt: skip
    add_tracker_options(run)
    add_plugin_option(run)
    add_fetch_option(run)
    run.set_defaults(handler=cmd_run)


def _add_keep_options(run: argparse.ArgumentParser) -> None:
    """What a run keeps besides its result: test embeddings, its model, or (--all-classes) a
    model trained on every class instead of a benchmark run."""
    run.add_argument("--save-embeddings", action="store_true",
                     help="also write each finished run's test embeddings, labels and "
                     "query/gallery flags (.npy) beside its result, for `evaluate DIR`; a "
                     "finished run without them is rerun")  # fmt: skip
    run.add_argument("--save-model", action="store_true",
                     help="also keep each finished run's embedding network beside its result "
                     "(seed<k>.model.pt: the whole network, a frozen trunk included, with its "
                     "preprocessing and provenance), for `export`, `index` and `search`; a "
                     "finished run without one is not rerun unless --force")  # fmt: skip
    run.add_argument("--all-classes", action="store_true",
                     help="train on every labelled class and keep the model for use (index, "
                     "search): not a benchmark run, no test metrics, never in the leaderboard; "
                     "one seed (the protocol's first) unless --seeds")  # fmt: skip


def cmd_run(args: argparse.Namespace) -> int:
    from harness.report import write_leaderboard

    load_methods()
    ray_only = [flag for flag, value in (("--address", args.address), ("--cpus-per-run",
                args.cpus_per_run), ("--gpus-per-run", args.gpus_per_run)) if value is not None]  # fmt: skip
    if ray_only and args.engine != "ray":  # else the runs would quietly stay on this machine
        raise HarnessError(f"{', '.join(ray_only)} only apply to --engine ray: add --engine ray "
                           "or drop them")  # fmt: skip
    if args.compile and args.address is None:  # runs train on this machine: check it up front
        check_compile(resolve_device(args.device))
    specs = _plan(args)
    if args.all_classes:
        return _fit(args, specs)
    here = _join_torchrun(args)
    if args.engine == "ray" and here.active:
        raise HarnessError("--engine ray runs whole runs as tasks; do not launch it with torchrun")
    try:
        counts = _sweep(args, specs)
    except KeyboardInterrupt as exc:
        print("\ninterrupted: finished runs and the last epoch checkpoint are saved; run the "
              "same command again to resume", file=sys.stderr)  # fmt: skip
        return 143 if isinstance(exc, Terminated) else 130  # 128 + SIGTERM, 128 + SIGINT
    if here.active:  # ranks other than 0 end here; rank 0 reports and writes the leaderboard
        leave(here, _sweep_status(counts))
    # every run may have crashed before writing a first result: then there is no leaderboard
    path = write_leaderboard(Path(args.results_dir)) if result_paths(args.results_dir) else None
    print(f"runs: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; leaderboard: "
          f"{path or 'none (no results yet)'}")  # fmt: skip
    reference = reference_dir(args.results_dir)
    if reference is not None and (reference / "LEADERBOARD.md").is_file():
        print(f"committed reference: {reference / 'LEADERBOARD.md'} (your runs never change "
              "it; your leaderboard compares the protocols both have)")  # fmt: skip
    return _sweep_status(counts)


def _plan(args: argparse.Namespace) -> list[RunSpec]:
    """The sweep the options ask for: the protocol (at --precision if given), the methods,
    the seeds, every option; bad input fails here, before any run."""
    tracking = tracking_config(args.tracker, args.tracker_uri, args.results_dir)
    protocol = load_protocol(args.protocol)
    if args.precision and args.precision != protocol.precision:
        protocol = dataclasses.replace(protocol, precision=args.precision)
        log.info("precision %s instead of the protocol's: hash %s", args.precision, protocol.hash)
    names = (
        METHODS.names() if args.all else [m.strip() for m in args.method.split(",") if m.strip()]
    )
    if not names:
        raise HarnessError(f"--method {args.method!r} names no method: give NAME[,NAME...] "
                           f"(`{program_name()} ls` lists them) or --all")  # fmt: skip
    if args.tuned:  # a method with nothing to tune has no tuned configuration: its default runs
        untunable = [m for m in names if m in METHODS and not METHODS.get(m).search]
        names = [m for m in names if m not in untunable]  # stand for it in the tuned table
        for name in untunable:
            print(f"{name}: no search space, no tuned run (its paper-default runs stand for it)")
        skipped = not_applicable_on(protocol, [m for m in names if m in METHODS], args.data_root)
        names = [m for m in names if m not in skipped]  # `tune` left it out
        for why in skipped.values():
            print(f"{why}: not applicable, no tuned run")
    specs = plan(
        protocol, names, args.seeds, data_root=args.data_root, device=args.device,
        max_steps=args.max_steps, results_dir=args.results_dir, force=args.force,
        weights=args.weights, workers=args.workers, decoder=args.decoder,
        compile=args.compile, tuned=args.tuned, save_embeddings=args.save_embeddings,
        save_model=args.save_model,
        tracking=tracking,
    )  # fmt: skip
    log.info(
        "protocol %s v%d (%s): %d runs", protocol.name, protocol.version, protocol.hash, len(specs)
    )
    return specs


def _sweep(args: argparse.Namespace, specs: list[RunSpec]) -> dict[str, int]:
    """The sweep's counts by status, run here or on Ray; SIGTERM stops it as Ctrl-C does
    (finished runs and the last epoch checkpoint are kept)."""
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        if args.engine == "ray":
            return sweep_ray(specs, args.address, args.cpus_per_run or 1,
                             args.gpus_per_run or 0.0, progress=not args.quiet)  # fmt: skip
        return sweep(specs, progress=not args.quiet)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sweep_status(counts: dict[str, int]) -> int:
    """1 when a run failed (NaN, empty miner) or crashed (a Ray task that raised), else 0."""
    return 1 if counts.get("failed", 0) + counts.get("error", 0) > 0 else 0


def _join_torchrun(args: argparse.Namespace):  # -> harness.core.Dist
    """Under torchrun: join the process group (NCCL on CUDA, one GPU per local rank; gloo on
    the CPU); ranks other than 0 log warnings only. Elsewhere: one process."""

    if not launched():
        return SINGLE
    device = resolve_device(args.device)
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        args.device = f"cuda:{local}"
    here = init_from_env(device)
    if not here.is_main:
        logging.getLogger("harness").setLevel(logging.WARNING)
        args.quiet = True
    log.info("torchrun: %d processes (%s); each embeds 1/%d of every batch",
             here.world_size, here.backend, here.world_size)  # fmt: skip
    return here


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is; the exit status says which it was (143, not 130)."""


def terminate(signum: int, frame: object) -> None:
    """SIGTERM stops a sweep like Ctrl-C: cleanly, resumable."""
    raise Terminated


def _fit(args: argparse.Namespace, specs: list[RunSpec]) -> int:
    """run --all-classes: one kept model per method (and seed), trained on every class."""
    from harness.sweep.fit import fit_all_classes, fitted_path

    clash = [flag for flag, on in (("--engine ray", args.engine == "ray"), ("--save-embeddings",
             args.save_embeddings), ("--max-steps", args.max_steps)) if on]  # fmt: skip
    if clash:
        raise HarnessError(f"--all-classes keeps a model for use and tests nothing: drop "
                           f"{', '.join(clash)}")  # fmt: skip
    if args.seeds is None:
        specs = [s for s in specs if s.seed == specs[0].seed]
    for spec in specs:
        path = fitted_path(args.results_dir, spec.parsed_protocol.name, spec.run_name, spec.seed)
        if path.is_file() and not args.force:
            print(f"{spec.method} seed {spec.seed}: {path} exists (pass --force to train it again)")
            continue
        print(f"{spec.method} seed {spec.seed}: trained on every class, kept as "
              f"{fit_all_classes(spec, progress=not args.quiet)}")  # fmt: skip
    return 0
