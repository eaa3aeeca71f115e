"""Training: the model builder, the ONE training step, the loop and its resumable state, the
shared build-train-validate path of runs and tuning trials (`fit`), and torchrun's
collectives. No branch here knows which method it trains."""

from harness.train.distributed import (
    SyncBatchNorm,
    average_gradients,
    check_same_step,
    convert_batchnorm,
    gather,
    gather_embedded,
)
from harness.train.features import with_cached_features
from harness.train.fit import train_model
from harness.train.loop import (
    LOSS_READBACK_STEPS,
    MAX_EMPTY_STEPS,
    EpochHooks,
    Training,
    check_compile,
    compiled,
    run_feeder,
    start_training,
    total_steps,
    train,
    train_augmentation,
)
from harness.train.model import (
    Model,
    build_method,
    build_model,
    build_seeded_backbone,
    seed_everything,
)
from harness.train.state import (
    Checkpoint,
    TrainingState,
    TrainStats,
    load_checkpoint,
    lr_factor,
    make_optimizer,
    run_sampler,
    save_checkpoint,
)
from harness.train.step import (
    StepResult,
    TrainingSet,
    TrainingStep,
    detach_outputs,
    parameter_groups,
    trainable_modules,
)

__all__ = [
    "Checkpoint",
    "EpochHooks",
    "Training",
    "TrainingSet",
    "train_augmentation",
    "LOSS_READBACK_STEPS",
    "MAX_EMPTY_STEPS",
    "Model",
    "StepResult",
    "SyncBatchNorm",
    "TrainStats",
    "TrainingState",
    "TrainingStep",
    "average_gradients",
    "build_method",
    "build_model",
    "build_seeded_backbone",
    "check_compile",
    "check_same_step",
    "compiled",
    "convert_batchnorm",
    "detach_outputs",
    "gather",
    "gather_embedded",
    "load_checkpoint",
    "lr_factor",
    "make_optimizer",
    "parameter_groups",
    "run_feeder",
    "run_sampler",
    "save_checkpoint",
    "seed_everything",
    "start_training",
    "total_steps",
    "train",
    "train_model",
    "with_cached_features",
    "trainable_modules",
]
