"""Datasets: each module registers one builder; importing this package registers them all."""

from harness.data import glyphs, omniglot  # noqa: F401  (one line per dataset: registers it)
from harness.data.base import DATASETS, LabelledImages, default_cache_dir, register_dataset

__all__ = ["DATASETS", "LabelledImages", "default_cache_dir", "register_dataset"]
