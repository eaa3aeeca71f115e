"""Data: datasets (each module registers one builder; importing this package registers them
all), the class-disjoint splits, the P x K sampler, the protocol's augmentation, the data a
protocol's runs share (`prepare`), and the pipeline that feeds the training step."""

from harness.data import (  # noqa: F401  (one line per dataset: registers it)
    cars196,
    cub100,
    cub200,
    folder,
    glyphs,
    inshop,
    omniglot,
    photo_zip,
    sop,
    table,
    vehicleid,
)
from harness.data.augment import EvalView, TrainPipeline, for_test
from harness.data.base import DATASETS, LabelledImages, needs_data_root, register_dataset
from harness.data.fetch import download
from harness.data.lazy import LazyImages
from harness.data.pipeline import Augment, Feeder, default_workers, load_batch, worker_death
from harness.data.prepare import (
    PreparedData,
    check_data_root,
    check_dataset,
    check_trainable,
    contiguous,
    decoded_by,
    on_device,
    prepare_data,
    resize,
)
from harness.data.sampler import PKSampler
from harness.data.splits import Split, split_classes
from harness.data.verification import verify, verify_own

__all__ = [
    "DATASETS",
    "Augment",
    "EvalView",
    "Feeder",
    "LabelledImages",
    "LazyImages",
    "PKSampler",
    "PreparedData",
    "Split",
    "TrainPipeline",
    "check_data_root",
    "check_dataset",
    "check_trainable",
    "contiguous",
    "decoded_by",
    "default_workers",
    "download",
    "for_test",
    "load_batch",
    "needs_data_root",
    "on_device",
    "prepare_data",
    "register_dataset",
    "resize",
    "split_classes",
    "verify",
    "verify_own",
    "worker_death",
]
