"""A benchmark harness for deep metric learning: one fixed protocol, many methods, honest numbers.

This module is the public API for method authors: everything a method file needs, the same
for the built-in methods (`harness.methods`, the clone's `methods/` folder) and for a method
written outside the package. It stays stable while the packages below it move.

The packages, from the top of the pipeline down (each imports only the ones below it; the
import-linter contracts in pyproject.toml hold that):

- `cli`: argument parsing and printing;
- `report`: results -> leaderboard, verdicts, figures, the regression check;
- `tune`, `cost`: Optuna studies on validation classes; what a method costs;
- `sweep`: run specifications, the skip/lock/archive policy, engines (local, Ray);
- `train`: model builder, the one training step, the loop and its state, torchrun;
- `evaluate`: embed, then the metrics (one chunked pass);
- `backbones`, `data`, `records`: networks; datasets, splits, sampler, augmentation and
  the feeding pipeline; result records and their provenance;
- `core`: protocol, registries, errors, the method contract, the tuple types, the run context.
"""

import importlib.abc
import importlib.util
import sys
from pathlib import Path

from harness.core import (
    FAMILIES,
    LR_MULTIPLIER,
    METHODS,
    Batch,
    Choice,
    Diagnostics,
    Embedded,
    EmbeddingHead,
    Float,
    HarnessError,
    Int,
    Method,
    MethodContext,
    MethodSpec,
    Mined,
    Miner,
    Pairs,
    Quadruplets,
    Scorer,
    SearchSpace,
    Triplets,
    all_pairs,
    closest,
    euclidean_score,
    register_method,
    sample_pairs,
)

__version__ = "0.1.0"

__all__ = [
    "FAMILIES",
    "LR_MULTIPLIER",
    "METHODS",
    "Batch",
    "Choice",
    "Diagnostics",
    "Embedded",
    "EmbeddingHead",
    "Float",
    "HarnessError",
    "Int",
    "Method",
    "MethodContext",
    "MethodSpec",
    "Mined",
    "Miner",
    "Pairs",
    "Quadruplets",
    "Scorer",
    "SearchSpace",
    "Triplets",
    "__version__",
    "all_pairs",
    "closest",
    "euclidean_score",
    "register_method",
    "sample_pairs",
]


class _CloneMethods(importlib.abc.MetaPathFinder):
    """`harness.methods` in a clone: the built-in methods live in the clone's top-level
    `methods/` folder, which the wheel ships as `harness/methods/` (pyproject's package-dir),
    so they import as `harness.methods` from a clone and from an installed wheel alike."""

    folder = Path(__file__).resolve().parent.parent / "methods"

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name != "harness.methods" or not (self.folder / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(
            name, self.folder / "__init__.py", submodule_search_locations=[str(self.folder)]
        )


if not (Path(__file__).resolve().parent / "methods").is_dir():
    sys.meta_path.append(_CloneMethods())
