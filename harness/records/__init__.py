"""Result records: one typed JSON file per run, written atomically, with its provenance.

`results` holds the records and their readers and writers, `provenance` where a number came
from (code version, packages, hardware, this machine's id), `fingerprint` what decides a
run's float rounding, `locks` the run locks that keep two processes off one result,
`tracking` the experiment trackers a run may also report to and `trackers` their two
implementations (TensorBoard, MLflow).
"""

from harness.records.fingerprint import describe, machine_fingerprint, package_versions
from harness.records.locks import run_lock
from harness.records.provenance import environment, machine_id
from harness.records.results import (
    DatasetInfo,
    Environment,
    MethodInfo,
    ProtocolInfo,
    ResultFormatError,
    RunResult,
    Selection,
    TrainingRecord,
    TupleCounts,
    archive,
    embeddings_dir,
    load_results,
    model_path,
    parse_result,
    read_result,
    reference_dir,
    result_path,
    result_paths,
    write_bytes_atomic,
    write_json_atomic,
    write_result,
    write_text_atomic,
)
from harness.records.trackers import open_tracker, tracking_config
from harness.records.tracking import (
    NO_TRACKING,
    TRACKERS,
    Tracker,
    TrackerConfig,
    child_config,
    metric_key,
)

__all__ = [
    "NO_TRACKING",
    "TRACKERS",
    "Tracker",
    "TrackerConfig",
    "child_config",
    "metric_key",
    "open_tracker",
    "tracking_config",
    "DatasetInfo",
    "Environment",
    "MethodInfo",
    "ProtocolInfo",
    "ResultFormatError",
    "RunResult",
    "Selection",
    "TrainingRecord",
    "TupleCounts",
    "archive",
    "embeddings_dir",
    "model_path",
    "describe",
    "environment",
    "load_results",
    "machine_fingerprint",
    "machine_id",
    "package_versions",
    "parse_result",
    "read_result",
    "reference_dir",
    "result_path",
    "result_paths",
    "run_lock",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_result",
    "write_text_atomic",
]
