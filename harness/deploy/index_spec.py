"""Which vector index `harness index --index TEXT` builds, and with which parameters: the kind
(``flat``, ``hnsw`` or ``ivfpq``) and its own parameters, each checked against its range, read
from text and written back as the canonical text (harness.deploy.vectors builds the index).

Ranking is by squared Euclidean distance, ascending, as the evaluation ranks; on L2-normalised
embeddings that orders neighbours as cosine similarity does. Three kinds (``KINDS``):

* ``flat`` (the default): exact, every query against every vector; the reference the others
  are measured against, and fast enough for catalogues up to a few hundred thousand items
  (docs/search-scale.md gives the figures).
* ``hnsw``: a navigable graph (faiss IndexHNSWFlat) over the full float32 vectors; fast,
  approximate, and heavier than flat (the graph comes on top of the vectors). It cannot drop a
  vector from its graph: ``remove`` rebuilds the graph from the vectors it keeps (the index
  holds them exactly), so a removal costs a build; ``removes_in_place(kind)`` tells a caller.
* ``ivfpq``: an inverted file of product-quantised codes (faiss IndexIVFPQ): the vectors
  compressed to ``m`` bytes each (at ``nbits=8``), found through ``nprobe`` of ``nlist`` lists;
  its distances are approximations. It needs training: ``build_index`` trains it on the
  vectors it is given (at most ``TRAIN_PER_CENTROID`` per centroid, sampled with the fixed
  seed ``TRAIN_SEED``, which also seeds faiss's k-means), and vectors added later are encoded
  with that training.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.core import HarnessError, closest

KINDS = ("flat", "hnsw", "ivfpq")
# Each kind's parameters, in their canonical order, with the range each may take.
PARAMETERS: dict[str, dict[str, tuple[int, int]]] = {
    "flat": {},
    "hnsw": {"M": (4, 256), "ef_construction": (8, 4096), "ef_search": (1, 32768)},
    "ivfpq": {"nlist": (1, 1 << 20), "m": (1, 4096), "nbits": (1, 16), "nprobe": (1, 1 << 20)},
}
# What a built index can change without a rebuild, by kind.
SEARCH_PARAMETERS = {"hnsw": "ef_search", "ivfpq": "nprobe"}


@dataclass(frozen=True)
class IndexSpec:
    """An index's kind and parameters, as `harness index --index TEXT` takes them.

    The defaults suit about 1M x 512-d: HNSW with 32 links per node (64 on the base layer),
    faiss's efConstruction of 40 and 64 candidates per query; IVF-PQ with 1,024 lists
    (about sqrt(n)), 64 one-byte codes per vector (8 dimensions each at 512-d; ``m`` must
    divide the dimension) and 16 lists searched per query. Only the kind's own parameters
    may differ from their defaults. ``str(spec)`` is the canonical text, which ``parse``
    reads back to an equal spec.
    """

    kind: str = "flat"
    M: int = 32
    ef_construction: int = 40
    ef_search: int = 64
    nlist: int = 1024
    m: int = 64
    nbits: int = 8
    nprobe: int = 16

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise HarnessError(
                f"unknown index kind {self.kind!r}{closest(str(self.kind), KINDS)}: "
                f"choose one of {', '.join(KINDS)}"
            )
        own = PARAMETERS[self.kind]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "kind" or (field.name not in own and value == field.default):
                continue
            if field.name not in own:
                raise HarnessError(
                    f"{field.name} is not a {self.kind} parameter: {_takes(self.kind)}"
                )
            low, high = own[field.name]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise HarnessError(
                    f"{self.kind} parameter {field.name}={value!r} is out of range: "
                    f"use an integer from {low} to {high}"
                )
        if self.kind == "ivfpq" and self.nprobe > self.nlist:
            raise HarnessError(
                f"ivfpq nprobe={self.nprobe} exceeds nlist={self.nlist}: nprobe counts the "
                f"lists searched, so use at most {self.nlist}"
            )

    @classmethod
    def parse(cls, text: str) -> IndexSpec:
        """A spec from text like ``hnsw``, ``hnsw:M=32,ef_search=64`` or
        ``ivfpq:nlist=1024,m=64,nprobe=16``; parameters left out keep their defaults (but
        nprobe, left out, is at most nlist)."""
        kind, _, rest = text.strip().partition(":")
        kind = kind.strip()
        if not kind:
            raise HarnessError(
                f"index spec {text!r} names no kind: write one of {', '.join(KINDS)}, "
                "e.g. hnsw or hnsw:M=32,ef_search=64"
            )
        if kind not in KINDS:
            cls(kind=kind)  # raises the unknown-kind error
        values: dict[str, int] = {}
        for item in (part.strip() for part in rest.split(",")) if rest.strip() else ():
            name, value = _parameter(kind, item, text)
            if name in values:
                raise HarnessError(
                    f"{kind} parameter {name} is given twice in {text!r}: give it once"
                )
            values[name] = value
        if kind == "ivfpq" and "nprobe" not in values:  # a small nlist caps the default nprobe
            values["nprobe"] = min(cls.nprobe, values.get("nlist", cls.nlist))
        return cls(kind=kind, **values)

    def __str__(self) -> str:
        params = ",".join(f"{name}={getattr(self, name)}" for name in PARAMETERS[self.kind])
        return f"{self.kind}:{params}" if params else self.kind

    def check_dimension(self, dim: int) -> None:
        """Raise unless this spec can index ``dim``-dimensional vectors (IVF-PQ splits each
        vector into ``m`` equal sub-vectors, so ``m`` must divide the dimension)."""
        if self.kind == "ivfpq" and dim % self.m:
            divisors = [d for d in range(1, min(dim, 4096) + 1) if dim % d == 0]
            near = min(divisors, key=lambda d: (abs(d - self.m), -d))
            raise HarnessError(
                f"ivfpq m={self.m} does not divide the dimension {dim}: each vector is split "
                f"into m equal parts; use a divisor of {dim}, e.g. m={near}"
            )


def _takes(kind: str) -> str:
    names = list(PARAMETERS[kind])
    return f"{kind} takes {', '.join(names)}" if names else f"{kind} takes no parameters"


def _parameter(kind: str, item: str, text: str) -> tuple[str, int]:
    """One ``NAME=INTEGER`` of a spec's text, checked against the kind's parameter names."""
    name, equals, value = (part.strip() for part in item.partition("="))
    if not PARAMETERS[kind]:
        raise HarnessError(f"flat takes no parameters, got {item!r} in {text!r}: write just flat")
    if not equals or not name or not value:
        raise HarnessError(
            f"index parameter {item!r} in {text!r} is not NAME=INTEGER: write e.g. "
            f"{kind}:{next(iter(PARAMETERS[kind]))}=..."
        )
    if name not in PARAMETERS[kind]:
        hint = closest(name, PARAMETERS[kind], ignore_case=True)
        raise HarnessError(f"unknown {kind} parameter {name!r}{hint}: {_takes(kind)}")
    try:
        return name, int(value)
    except ValueError:
        raise HarnessError(
            f"{kind} parameter {name}={value!r} is not an integer: write e.g. "
            f"{name}={getattr(IndexSpec(), name)}"
        ) from None


def removes_in_place(kind: str) -> bool:
    """Whether ``VectorIndex.remove`` drops vectors in place (flat, ivfpq) or rebuilds the
    whole index from the vectors it keeps (hnsw: a removal costs a build)."""
    if kind not in KINDS:
        IndexSpec(kind=kind)  # raises the unknown-kind error
    return kind != "hnsw"
