"""From the verdict to a model in use: the whole trained network kept beside a run
(`run --save-model`: KeptModel, read back by load_model), its export to ONNX or TorchScript
with a parity check (export_model), a catalogue of a photo folder embedded by it and
searched (build_or_update, read_catalogue, search), and the faiss index under the catalogue
(IndexSpec, VectorIndex: flat, HNSW, IVF-PQ)."""

from harness.deploy.catalogue import (
    Catalogue,
    Hit,
    Update,
    build_or_update,
    read_catalogue,
    search,
)
from harness.deploy.export import FORMATS, export_model, read_metadata, run_exported
from harness.deploy.images import embed_files, image_files, preprocess
from harness.deploy.index_spec import KINDS, IndexSpec, removes_in_place
from harness.deploy.model import (
    Embedder,
    KeptModel,
    LoadedModel,
    keep_model,
    load_model,
    read_model,
    write_model,
)
from harness.deploy.vectors import VectorIndex, build_index, load_index

__all__ = [
    "FORMATS",
    "KINDS",
    "Catalogue",
    "Embedder",
    "Hit",
    "IndexSpec",
    "KeptModel",
    "LoadedModel",
    "Update",
    "VectorIndex",
    "build_index",
    "build_or_update",
    "embed_files",
    "export_model",
    "image_files",
    "keep_model",
    "load_index",
    "load_model",
    "preprocess",
    "read_catalogue",
    "read_metadata",
    "read_model",
    "removes_in_place",
    "run_exported",
    "search",
    "write_model",
]
