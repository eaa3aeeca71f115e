"""The bottom of the house: what every stage shares and nothing below it could own.

The protocol (strict, versioned, hashed YAML), the registries with their did-you-mean
errors, the user-facing errors, the method contract and the tuple types a miner returns, the
search-space types, the run context, and small shared mechanics (devices, the phase timer,
precision, where files are). Nothing here imports another harness package.
"""

from harness.core.augmentation import AugmentationSpec, OpSpec
from harness.core.context import RunContext
from harness.core.devices import resolve_device
from harness.core.dist import (
    COLLECTIVE_TIMEOUT,
    SINGLE,
    Dist,
    current,
    init_from_env,
    launched,
    leave,
)
from harness.core.errors import HarnessError, TrainingFailed, program_name
from harness.core.method import (
    FAMILIES,
    METHODS,
    EmbeddingHead,
    Method,
    MethodContext,
    MethodSpec,
    describe_source,
    family_of,
    protocol_hyperparameters,
    register_method,
)
from harness.core.metric_names import (
    CLUSTERING_METRICS,
    FAISS_AUTO_MIN_GALLERY,
    KMEANS_BACKENDS,
    KMEANS_CONVENTIONS,
    KNN_BACKENDS,
    METRIC_NAMES,
    RECALL_PATTERN,
    RETRIEVAL_METRICS,
    SINGLE_METRICS,
    UNBOUNDED_METRICS,
    is_single_metric,
)
from harness.core.names import NAME_PATTERN, is_plain_name, safe_folder
from harness.core.pair_auc import euclidean_score, sample_pairs
from harness.core.pairing import shared_seeds
from harness.core.paths import (
    PROTOCOL_DIR,
    REFERENCE_FILE,
    default_cache_dir,
    default_data_dir,
    file_sha256,
    source_tree,
)
from harness.core.plugins import (
    ENTRY_POINT_GROUP,
    PLUGINS_ENV,
    load_methods,
    load_plugin,
    plugin_option,
    plugins_loaded,
    unload_plugin,
)
from harness.core.precision import PRECISIONS, autocast, grad_scaler, to_float32
from harness.core.protocol import (
    BackboneSpec,
    Protocol,
    SplitSpec,
    load_protocol,
    parse_protocol,
    protocol_names,
)
from harness.core.reference import (
    CLAIMS_FILE,
    Claim,
    check_entry,
    dataset_counts,
    load_claims,
    paper_results,
)
from harness.core.registry import Registry, closest, keyword_names, registered
from harness.core.search import LR_MULTIPLIER, Choice, Float, Int, SearchSpace
from harness.core.seeds import SEED_LIMIT, seed_problem
from harness.core.timing import PhaseTimer
from harness.core.tuples import (
    Batch,
    Diagnostics,
    Embedded,
    Mined,
    Miner,
    Pairs,
    Quadruplets,
    Scorer,
    Triplets,
    all_pairs,
)

__all__ = [
    "CLAIMS_FILE",
    "Claim",
    "load_claims",
    "AugmentationSpec",
    "BackboneSpec",
    "Batch",
    "CLUSTERING_METRICS",
    "COLLECTIVE_TIMEOUT",
    "Choice",
    "Diagnostics",
    "Dist",
    "Embedded",
    "EmbeddingHead",
    "FAISS_AUTO_MIN_GALLERY",
    "FAMILIES",
    "Float",
    "HarnessError",
    "Int",
    "KMEANS_BACKENDS",
    "KMEANS_CONVENTIONS",
    "KNN_BACKENDS",
    "LR_MULTIPLIER",
    "METHODS",
    "METRIC_NAMES",
    "Method",
    "MethodContext",
    "MethodSpec",
    "Mined",
    "Miner",
    "OpSpec",
    "PRECISIONS",
    "PROTOCOL_DIR",
    "Pairs",
    "PhaseTimer",
    "Protocol",
    "Quadruplets",
    "RECALL_PATTERN",
    "REFERENCE_FILE",
    "RETRIEVAL_METRICS",
    "Registry",
    "RunContext",
    "SEED_LIMIT",
    "SINGLE",
    "SINGLE_METRICS",
    "Scorer",
    "SearchSpace",
    "SplitSpec",
    "TrainingFailed",
    "Triplets",
    "UNBOUNDED_METRICS",
    "all_pairs",
    "autocast",
    "check_entry",
    "closest",
    "current",
    "dataset_counts",
    "default_cache_dir",
    "default_data_dir",
    "file_sha256",
    "euclidean_score",
    "family_of",
    "grad_scaler",
    "init_from_env",
    "is_single_metric",
    "keyword_names",
    "launched",
    "leave",
    "load_methods",
    "describe_source",
    "ENTRY_POINT_GROUP",
    "PLUGINS_ENV",
    "load_plugin",
    "plugin_option",
    "plugins_loaded",
    "shared_seeds",
    "unload_plugin",
    "load_protocol",
    "paper_results",
    "parse_protocol",
    "protocol_hyperparameters",
    "program_name",
    "protocol_names",
    "registered",
    "register_method",
    "resolve_device",
    "safe_folder",
    "is_plain_name",
    "NAME_PATTERN",
    "sample_pairs",
    "seed_problem",
    "source_tree",
    "to_float32",
]
