"""argparse value types shared by the CLI's subcommands (cli.py and cost.py)."""

from __future__ import annotations

import argparse

from harness.core import seed_problem


def int_list(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def seed_list(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2], checked before any run: a bad seed would stop a sweep half-way."""
    seeds = int_list(text)
    problem = seed_problem(seeds)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem} (in {text!r})")
    return seeds


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    """`--plugin PATH_OR_MODULE`, repeatable: the commands that build methods take it."""
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="PATH_OR_MODULE",
        help="also load the methods of this .py file or importable module (repeatable; each "
        "result records the file's sha256); installed distributions' methods load without it",
    )  # fmt: skip


def add_kept_plugin_option(parser: argparse.ArgumentParser) -> None:
    """`--plugin`: the plugin a kept model's method came from (`run --plugin ... --save-model`);
    the model file names it but never runs it, and a plugin changed since is refused."""
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="PATH_OR_MODULE",
        help="the plugin (.py file or importable module) the kept model's method came from, as "
        "given to `run --plugin` (repeatable); one whose source changed since the model was "
        "kept is refused",
    )  # fmt: skip


def add_fetch_option(parser: argparse.ArgumentParser) -> None:
    """`--fetch`: the commands that read a real-photo dataset build it from its source when it
    is missing (as `data fetch NAME` does; the same as DML_HARNESS_FETCH=1)."""
    parser.add_argument(
        "--fetch", action="store_true",
        help="a real-photo dataset that is not on this machine is fetched from its public "
        "source first (printing its terms; the same as DML_HARNESS_FETCH=1)",
    )  # fmt: skip


def add_tracker_options(parser: argparse.ArgumentParser) -> None:
    """`--tracker` and `--tracker-uri`: the commands that train take them (run, tune)."""
    parser.add_argument(
        "--tracker", default="none", choices=["none", "tensorboard", "mlflow"],
        help="also report each run as it trains to TensorBoard or MLflow (needs the "
        "tensorboard or mlflow extra); not part of a run's identity (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--tracker-uri", metavar="URI",
        help="where the tracker writes: a TensorBoard log folder, or an MLflow tracking URI "
        "(http://host:5000, sqlite:///file.db, ...; a server is probed once, in seconds, before "
        "any run); default: <results-dir>/tracking/tensorboard "
        "or sqlite:///<results-dir>/tracking/mlflow/mlflow.db",
    )  # fmt: skip


class _Spelled(argparse.Action):
    """Stores the value as `store` does, and refuses one option given under both of its
    spellings (which one should win is a guess)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        seen = getattr(namespace, f"_spelled_{self.dest}", None)
        if seen is not None and seen != option_string:
            parser.error(f"{seen} and {option_string} are two spellings of one option: give "
                         f"{self.option_strings[0]} once")  # fmt: skip
        setattr(namespace, f"_spelled_{self.dest}", option_string)
        setattr(namespace, self.dest, values)


def add_aliased(parser: argparse.ArgumentParser, new: str, old: str, **kwargs: object) -> None:
    """`new`, the spelling every command shares, with `old` still accepted as an alias (the
    spelling this command had); both in one command line is a one-line error."""
    kwargs["help"] = f"{kwargs.get('help', '')} ({old}: this command's old spelling)".strip()
    parser.add_argument(new, old, action=_Spelled, **kwargs)  # type: ignore[arg-type]
