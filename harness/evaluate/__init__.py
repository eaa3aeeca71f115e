"""Evaluation: embed a split with the trained model, then score it with the harness's metric
definitions (`metrics`, one chunked pass over the distances), ranked by Euclidean distance
or by the method's learned scorer; a run's test embeddings saved beside its result (`saved`),
what it ranked (`ranked`: the grid of `show` draws from it) and its metrics again under each
re-ranking (`reranked`, for `rerank`)."""

from harness.evaluate.embedding import embed, embed_parts
from harness.evaluate.metrics import (
    MetricOptions,
    MetricReport,
    compute_metrics,
    compute_report,
    lda_score,
)
from harness.evaluate.neighbours import (
    AVERAGE_PRECISION,
    neighbour_count,
    per_query_values,
    top_neighbours,
)
from harness.evaluate.saved import (
    SavedEmbeddings,
    file_sha256,
    from_evaluation,
    load_embeddings,
    write_embeddings,
)
from harness.evaluate.score import (
    HISTOGRAM_BINS,
    Evaluation,
    distance_histogram,
    evaluate,
    selection_score,
)
from harness.evaluate.scoring import (
    CountedScorer,
    check_rerank,
    ranking_scorer,
    rerank,
    retrieval_record,
)

__all__ = [
    "AVERAGE_PRECISION",
    "HISTOGRAM_BINS",
    "CountedScorer",
    "Evaluation",
    "MetricOptions",
    "MetricReport",
    "compute_metrics",
    "compute_report",
    "distance_histogram",
    "embed",
    "embed_parts",
    "evaluate",
    "lda_score",
    "neighbour_count",
    "per_query_values",
    "top_neighbours",
    "check_rerank",
    "ranking_scorer",
    "rerank",
    "retrieval_record",
    "selection_score",
    "SavedEmbeddings",
    "file_sha256",
    "from_evaluation",
    "load_embeddings",
    "write_embeddings",
]
