"""Deploying a trained embedding: the vector index that `harness index` builds over a
catalogue's embeddings and `harness search` queries."""

from harness.deploy.vectors import (
    KINDS,
    IndexSpec,
    VectorIndex,
    build_index,
    load_index,
    removes_in_place,
)

__all__ = [
    "KINDS",
    "IndexSpec",
    "VectorIndex",
    "build_index",
    "load_index",
    "removes_in_place",
]
