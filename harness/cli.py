"""Command line: run, ls, evaluate, leaderboard, validate, cost, check, data.

User errors print one line `error: ...` on stderr and exit with status 2; Ctrl-C stops with a
line saying how to resume (finished runs are kept and skipped on the next run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from harness.argtypes import int_list, nonnegative_int, positive_int, seed_list
from harness.cost import command as cost_command
from harness.errors import HarnessError

log = logging.getLogger("harness")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump), status 2, like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def _add_global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """-q and -v, accepted before or after the subcommand. The subcommands' copies default to
    SUPPRESS, so that leaving them out after the subcommand keeps what was given before it."""
    group = parser.add_argument_group("global options")
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="warnings and errors only: no progress bars or per-run lines")  # fmt: skip
    group.add_argument("-v", "--verbose", action="store_true", default=default,
                       help="debug logging from the harness and the methods")  # fmt: skip


class SubcommandParser(Parser):
    """A subcommand's parser: it takes the global options too (`run ... -q`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        _add_global_options(self, argparse.SUPPRESS)


def program_name() -> str:
    """`dml-harness` when started by the console script, else `python -m harness`."""
    return "dml-harness" if Path(sys.argv[0]).stem == "dml-harness" else "python -m harness"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=program_name(), description=__doc__.splitlines()[0])
    _add_global_options(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=SubcommandParser)

    _add_run_parser(sub)

    ls = sub.add_parser("ls", help="list methods, protocols and datasets")
    ls.add_argument("--json", action="store_true")

    ev = sub.add_parser("evaluate", help="score embeddings you bring with the harness's metrics")
    ev.add_argument("--embeddings", required=True, type=Path, help="[N, D] .npy")
    ev.add_argument("--labels", required=True, type=Path, help="[N] .npy")
    ev.add_argument("--query-embeddings", type=Path, help="[Q, D] .npy (else all-vs-all)")
    ev.add_argument("--query-labels", type=Path, help="[Q] .npy")
    ev.add_argument("--recall-ks", type=int_list, default=[1, 2, 4, 8])
    ev.add_argument(
        "--clustering", default="harness", choices=["harness", "faiss"],
        help="k-means convention for nmi and f1: harness (k-means++ start, up to 100 iterations;"
        " default) or faiss (the published tables' faiss k-means, 20 iterations; needs faiss)",
    )  # fmt: skip
    ev.add_argument("--json", action="store_true")

    lb = sub.add_parser("leaderboard", help="regenerate results/LEADERBOARD.md")
    lb.add_argument("--results-dir", default="results")

    cost_command.add_parser(sub)

    ck = sub.add_parser("check", help="CI regression check of every method's metrics")
    ck.add_argument("--protocol", default="regression")
    ck.add_argument("--methods", help="NAME[,NAME...] (default: every registered method)")
    ck.add_argument(
        "--baselines", type=Path, help="folder of baseline files (default: results/baselines)"
    )
    ck.add_argument("--update", action="store_true", help="rewrite the baselines from this run")
    ck.add_argument("--reason", help="why the baselines change (required with --update)")
    ck.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ck.add_argument(
        "--mode", default="auto", choices=["auto", "exact", "statistical"],
        help="auto: exact on the baseline's machine fingerprint, statistical elsewhere",
    )  # fmt: skip
    ck.add_argument(
        "--baseline-seeds", type=positive_int, default=None,
        help="with --update: how many seeds (0..N-1) the baseline records (default 20)",
    )  # fmt: skip

    val = sub.add_parser("validate", help="check protocol files as `run` does before training "
                         "(names, types, datasets, backbones, methods and hyperparameters)")  # fmt: skip
    val.add_argument("paths", nargs="*", help="default: every shipped protocol")

    add_data_parser(sub)
    from harness import tune, verdicts

    verdicts.add_parser(sub)
    tune.add_parser(sub)
    return parser


def _add_run_parser(sub: argparse._SubParsersAction) -> None:
    """The `run` subcommand's options."""
    run = sub.add_parser("run", help="train and evaluate methods under a protocol")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every registered method")
    which.add_argument("--method", help="NAME[,NAME...]")
    run.add_argument("--protocol", default="default", help="protocol name or YAML path")
    run.add_argument("--seeds", type=seed_list, help="override the protocol's seeds, e.g. 0,1,2")
    run.add_argument("--data-root", help="folder holding the dataset's files")
    run.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    run.add_argument("--max-steps", type=positive_int, help="cap training steps (smoke runs)")
    run.add_argument("--results-dir", default="results", help="default: results")
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
    run.add_argument("--engine", default="local", choices=["local", "ray"],
                     help="local: one run after another in this process (default); ray: each "
                     "run a Ray task (needs the ray extra)")  # fmt: skip
    run.add_argument("--address", help="with --engine ray: auto, HOST:PORT or ray://... of an "
                     "existing cluster (default: start a local Ray on this machine)")  # fmt: skip
    run.add_argument("--cpus-per-run", type=positive_int,
                     help="with --engine ray: CPUs per task, also its torch threads (default 1)")  # fmt: skip
    run.add_argument("--gpus-per-run", type=float,
                     help="with --engine ray: GPUs per task (default 0)")  # fmt: skip


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    """`data verify` and `data download` for the papers' datasets."""
    names = ["cub200", "cars196", "sop", "inshop", "vehicleid"]
    data = sub.add_parser("data", help="check (or fetch) the papers' datasets on disk")
    dsub = data.add_subparsers(dest="data_command", required=True, parser_class=SubcommandParser)
    verify = dsub.add_parser("verify", help="check a dataset against the published counts")
    verify.add_argument("--dataset", required=True, choices=names)
    verify.add_argument("--data-root", required=True, type=Path)
    verify.add_argument("--quick", action="store_true", help="check files exist, do not decode")
    download = dsub.add_parser("download", help="fetch a dataset that has a public URL")
    download.add_argument("--dataset", required=True, choices=names)
    download.add_argument("--data-root", required=True, type=Path)


def cmd_data(args: argparse.Namespace) -> int:
    if args.data_command == "download":
        from harness.data.download import download

        print(f"saved {download(args.dataset, args.data_root)}")
        args.quick = True  # then check what was extracted
    from harness.data.verify import verify

    if not args.data_root.is_dir():  # a typo, not a dataset that fails its counts (exit 1)
        raise HarnessError(f"--data-root {args.data_root} is not a directory; pass the folder "
                           f"that holds {args.dataset}")  # fmt: skip
    ok, report = verify(args.dataset, args.data_root, decode=not args.quick)
    print(report)
    return 0 if ok else 1


def _load_methods() -> None:
    """Register every method (importing the `methods` package registers them): the one place
    the CLI does it, for the commands that need the registry."""
    import methods  # noqa: F401


def cmd_run(args: argparse.Namespace) -> int:
    _load_methods()
    from harness.leaderboard import write_leaderboard
    from harness.method import METHODS
    from harness.protocol import load_protocol
    from harness.results import result_paths
    from harness.runner import plan, sweep

    ray_only = [flag for flag, value in (("--address", args.address), ("--cpus-per-run",
                args.cpus_per_run), ("--gpus-per-run", args.gpus_per_run)) if value is not None]  # fmt: skip
    if ray_only and args.engine != "ray":  # else the runs would quietly stay on this machine
        raise HarnessError(f"{', '.join(ray_only)} only apply to --engine ray: add --engine ray "
                           "or drop them")  # fmt: skip
    protocol = load_protocol(args.protocol)
    if args.precision and args.precision != protocol.precision:
        protocol = dataclasses.replace(protocol, precision=args.precision)
        log.info("precision %s instead of the protocol's: hash %s", args.precision, protocol.hash)
    names = (
        METHODS.names() if args.all else [m.strip() for m in args.method.split(",") if m.strip()]
    )
    if not names:
        raise HarnessError(f"--method {args.method!r} names no method: give NAME[,NAME...] "
                           "(`python -m harness ls` lists them) or --all")  # fmt: skip
    specs = plan(
        protocol,
        names,
        args.seeds,
        data_root=args.data_root,
        device=args.device,
        max_steps=args.max_steps,
        results_dir=args.results_dir,
        force=args.force,
        weights=args.weights,
        workers=args.workers,
        decoder=args.decoder,
        compile=args.compile,
        tuned=args.tuned,
    )
    here = _join_torchrun(args)
    log.info(
        "protocol %s v%d (%s): %d runs", protocol.name, protocol.version, protocol.hash, len(specs)
    )
    if args.engine == "ray" and here.active:
        raise HarnessError("--engine ray runs whole runs as tasks; do not launch it with torchrun")
    if args.compile and args.address is None:  # runs train on this machine: check it up front
        from harness.devices import resolve_device
        from harness.train import check_compile

        check_compile(resolve_device(args.device))
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.engine == "ray":
            from harness.engines import sweep_ray

            counts = sweep_ray(specs, args.address, args.cpus_per_run or 1,
                               args.gpus_per_run or 0.0, progress=not args.quiet)  # fmt: skip
        else:
            counts = sweep(specs, progress=not args.quiet)
    except KeyboardInterrupt as exc:
        print(
            "\ninterrupted: finished runs and the last epoch checkpoint are saved; run the "
            "same command again to resume",
            file=sys.stderr,
        )
        return 143 if isinstance(exc, Terminated) else 130  # 128 + SIGTERM, 128 + SIGINT
    finally:
        signal.signal(signal.SIGTERM, previous)
    if here.active:
        import torch.distributed

        torch.distributed.destroy_process_group()
        if not here.is_main:  # rank 0 reports and writes the leaderboard
            return _sweep_status(counts)
    # every run may have crashed before writing a first result: then there is no leaderboard
    path = write_leaderboard(Path(args.results_dir)) if result_paths(args.results_dir) else None
    print(f"runs: {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; leaderboard: "
          f"{path or 'none (no results yet)'}")  # fmt: skip
    return _sweep_status(counts)


def _sweep_status(counts: dict[str, int]) -> int:
    """1 when a run failed (NaN, empty miner) or crashed (a Ray task that raised), else 0."""
    return 1 if counts.get("failed", 0) + counts.get("error", 0) > 0 else 0


def _join_torchrun(args: argparse.Namespace):  # -> harness.distributed.Dist
    """Under torchrun: join the process group (NCCL on CUDA, one GPU per local rank; gloo on
    the CPU); ranks other than 0 log warnings only. Elsewhere: one process."""
    from harness import distributed

    if not distributed.launched():
        return distributed.SINGLE
    import torch

    from harness.devices import resolve_device

    device = resolve_device(args.device)
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        args.device = f"cuda:{local}"
    here = distributed.init_from_env(device)
    if not here.is_main:
        logging.getLogger("harness").setLevel(logging.WARNING)
        args.quiet = True
    log.info("torchrun: %d processes (%s); each embeds 1/%d of every batch",
             here.world_size, here.backend, here.world_size)  # fmt: skip
    return here


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is; the exit status says which it was (143, not 130)."""


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM stops a sweep like Ctrl-C: cleanly, resumable."""
    raise Terminated


def cmd_ls(args: argparse.Namespace) -> int:
    _load_methods()
    from harness.data import DATASETS
    from harness.method import METHODS
    from harness.protocol import load_protocol, protocol_names

    listing = {
        "methods": [
            {"name": n, "version": METHODS.get(n).version, "paper": METHODS.get(n).paper,
             "family": METHODS.get(n).family, "needs_coarse_labels": METHODS.get(n).needs_coarse_labels,
             "hyperparameters": METHODS.get(n).defaults(), "summary": METHODS.get(n).summary}
            for n in METHODS.names()
        ],
        "protocols": [],
        "datasets": DATASETS.names(),
        "method_prefixes": METHODS.prefixes(),
    }  # fmt: skip
    from harness.shipped import PROTOCOL_DIR

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
    for kind in ("methods", "protocols"):
        print(f"{kind}:")
        for item in listing[kind]:
            extra = item.get("summary") or item.get("description") or ""
            print(f"  {item['name']:<{width}}  {extra}")
    print("datasets:\n  " + "\n  ".join(listing["datasets"]))
    for prefix, names in listing["method_prefixes"].items():
        print(f"{prefix}: methods (--method {prefix}:<Class>[+<Class>]):\n  " + " ".join(names))
    return 0


def _load_npy(path: Path, what: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise HarnessError(f"{what} file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{what} file {path} is not a readable .npy array ({exc})") from None


def cmd_evaluate(args: argparse.Namespace) -> int:
    from harness.metrics import compute_metrics

    if (args.query_embeddings is None) != (args.query_labels is None):
        raise HarnessError("give both --query-embeddings and --query-labels, or neither")
    gallery = _load_npy(args.embeddings, "--embeddings")
    gallery_labels = _load_npy(args.labels, "--labels")
    options = {"recall_ks": tuple(args.recall_ks), "kmeans_convention": args.clustering}
    if args.query_embeddings is None:
        metrics = compute_metrics(gallery, gallery_labels, **options)
    else:
        metrics = compute_metrics(
            _load_npy(args.query_embeddings, "--query-embeddings"),
            _load_npy(args.query_labels, "--query-labels"),
            gallery,
            gallery_labels,
            **options,
        )
    if args.json:
        print(json.dumps(metrics))
    else:
        for name, value in metrics.items():
            print(f"{name:<14} {value:.4f}")
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    _load_methods()  # the figures group methods by the family their registry entry declares
    from harness.leaderboard import write_leaderboard

    print(write_leaderboard(Path(args.results_dir)))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    _load_methods()
    from harness.check import BASELINE_DIR, BASELINE_SEEDS, check

    if args.update and not args.reason:
        raise HarnessError("--update needs --reason TEXT saying why the baselines change")
    if args.reason and not args.update:
        raise HarnessError("--reason goes with --update")
    if args.baseline_seeds is not None and not args.update:
        raise HarnessError("--baseline-seeds goes with --update")
    names = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    start = time.perf_counter()
    passed, report = check(
        args.protocol, names, args.baselines or BASELINE_DIR,
        args.reason if args.update else None, args.device, mode=args.mode,
        baseline_seeds=args.baseline_seeds or BASELINE_SEEDS,
    )  # fmt: skip
    print(report)
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0 if passed else 1


def cmd_validate(args: argparse.Namespace) -> int:
    """Each protocol parsed and given the checks `run` makes before its first run that need no
    data (harness.preflight: dataset, backbone, methods and their hyperparameters)."""
    _load_methods()
    from harness.preflight import check_protocol
    from harness.protocol import PROTOCOL_DIR, load_protocol

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


COMMANDS = {
    "run": cmd_run,
    "ls": cmd_ls,
    "evaluate": cmd_evaluate,
    "leaderboard": cmd_leaderboard,
    "check": cmd_check,
    "cost": lambda args: _late("harness.cost.command", "cmd_cost", args),
    "validate": cmd_validate,
    "data": cmd_data,
    "compare": lambda args: _late("harness.verdicts", "cmd_compare", args),
    "tune": lambda args: _late("harness.tune", "cmd_tune", args),
}


def _late(module: str, name: str, args: argparse.Namespace) -> int:
    """A command whose module is imported only when it runs."""
    import importlib

    return getattr(importlib.import_module(module), name)(args)


def _os_problem(exc: OSError) -> str:
    """One line for a file system error: what failed, on which path, and the way out."""
    where = f" {exc.filename}" if exc.filename else ""
    return (f"cannot use{where}: {exc.strerror or exc}; check that the folder exists, is a "
            "folder and is writable (e.g. pass another --results-dir or set DML_HARNESS_CACHE)"
            "; -v shows where it happened")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quiet and args.verbose:
        print("error: -q and -v contradict each other: give one of them", file=sys.stderr)
        return 2
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
    try:
        return COMMANDS[args.command](args)
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
