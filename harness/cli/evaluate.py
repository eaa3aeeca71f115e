"""`evaluate`: score embeddings with the harness's metric definitions: .npy files you bring
(`--embeddings`, `--labels`, optionally `--query-embeddings`, `--query-labels`), or a folder a
run saved (`run --save-embeddings`), scored as that run scored them.

What could mislead is said, one line each, on stderr and in `--json`'s `warnings`: query rows
identical to gallery rows (each finds its copy at distance 0), all-vs-all's rule that each item
is left out of its own gallery, a learned-scorer run ranked by Euclidean distance, and saved
files that differ from those their run recorded.

`--rerank NAME[:key=value,...]` ranks by a re-ranking of the Euclidean distances
(harness.evaluate.reranking: k_reciprocal, aqe_dba; docs/reranking.md) for the retrieval metrics;
a note says which ran and its seconds (`--json`: also `rerank` and `rerank_seconds`). A saved
folder whose run re-ranked (evaluation.rerank) is re-ranked the same way unless --rerank says
otherwise (`--rerank none`: the plain Euclidean ranking). A learned-scorer run with --rerank
re-ranks its Euclidean distances, with a warning: the learned scorer is not saved."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from harness.cli.argtypes import int_list
from harness.core import HarnessError, program_name
from harness.evaluate import MetricOptions, compute_metrics, file_sha256, load_embeddings
from harness.evaluate.metrics.clustering import faiss as KMEANS_FAISS
from harness.evaluate.reranking import Rerank, parse_rerank, reranked_metrics

DEFAULT_RECALL_KS = [1, 2, 4, 8]
FILE_OPTIONS = ("embeddings", "labels", "query_embeddings", "query_labels")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `evaluate` subcommand's options."""
    ev = sub.add_parser("evaluate", help="score embeddings you bring, or a folder a run saved "
                        "(run --save-embeddings), with the harness's metrics")  # fmt: skip
    ev.add_argument("folder", nargs="?", type=Path, metavar="DIR",
                    help="a seed<k>.embeddings folder written by run --save-embeddings")  # fmt: skip
    ev.add_argument("--embeddings", type=Path, help="[N, D] .npy (instead of DIR)")
    ev.add_argument("--labels", type=Path, help="[N] .npy")
    ev.add_argument("--query-embeddings", type=Path, help="[Q, D] .npy (else all-vs-all)")
    ev.add_argument("--query-labels", type=Path, help="[Q] .npy")
    ev.add_argument("--recall-ks", type=int_list,
                    help="the K of recall@K (default 1,2,4,8; for DIR, the run's)")  # fmt: skip
    ev.add_argument(
        "--clustering", choices=["harness", "faiss"],
        help="k-means convention for nmi and f1: faiss (the published tables' faiss k-means, 20"
        " iterations from a random start; the default for .npy files when faiss is installed)"
        " or harness (k-means++ start, up to 100 iterations: slower, a lower inertia); for"
        " DIR, the run's",
    )  # fmt: skip
    ev.add_argument("--euclidean", action="store_true",
                    help="DIR of a run that ranked by a learned scorer: rank its embeddings by "
                    "Euclidean distance anyway (not the run's numbers; the output says so)")  # fmt: skip
    ev.add_argument("--rerank", metavar="NAME[:key=value,...]",
                    help="rank by a re-ranking of the Euclidean distances: k_reciprocal "
                    "(k1=20,k2=6,lambda=0.3) or aqe_dba (alpha=3,n=2), e.g. "
                    "k_reciprocal:k1=20,k2=6; none for no re-ranking (for DIR, default: the "
                    "run's own); see docs/reranking.md")  # fmt: skip
    ev.add_argument("--json", action="store_true",
                    help="one JSON object: the metrics and a list of `warnings`")  # fmt: skip
    ev.set_defaults(handler=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Score a saved folder or the .npy files given, then print the metrics (one line each,
    or one JSON object) and, on stderr, a line for each thing that could mislead."""
    given = [f"--{name.replace('_', '-')}" for name in FILE_OPTIONS if getattr(args, name)]
    if args.folder is not None and given:
        raise HarnessError(f"give a folder (DIR) or {', '.join(given)}, not both")
    if args.folder is not None:
        metrics, notes, extra = _evaluate_folder(args)
    else:
        metrics, notes, extra = _evaluate_files(args)
    for note in notes:
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps({**metrics, **extra, "warnings": notes}))
    else:
        for name, value in metrics.items():
            print(f"{name:<14} {value:.4f}")
    return 0


Scored = tuple[dict[str, float], list[str], dict[str, Any]]  # metrics, notes, --json's extras


def _scored(rerank: Rerank | None, parts: tuple[Any, ...], ks: tuple[int, ...],
            names: list[str] | None, options: MetricOptions) -> Scored:  # fmt: skip
    """The metrics of `parts` (queries and labels, then the gallery and its labels, if any),
    re-ranked when `rerank` is given: then a note says which re-ranking ran and its seconds,
    and --json gets `rerank` and `rerank_seconds`."""
    if rerank is None:
        return compute_metrics(*parts, recall_ks=ks, metrics=names, options=options), [], {}
    metrics, seconds = reranked_metrics(*parts, rerank=rerank, recall_ks=ks, metrics=names,
                                        options=options)  # fmt: skip
    note = (f"note: retrieval metrics ranked by the re-ranking {rerank.text} ({seconds:.2f} s;"
            " docs/reranking.md); nmi, f1 and lda do not depend on the ranking")  # fmt: skip
    return metrics, [note], {"rerank": rerank.text, "rerank_seconds": round(seconds, 3)}


def _given_rerank(text: str) -> Rerank | None:
    """--rerank's re-ranking (None: none), its errors one line naming the option."""
    try:
        return parse_rerank(text)
    except HarnessError as exc:
        raise HarnessError(f"--rerank {text}: {exc}") from None


def _load_npy(path: Path, what: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise HarnessError(f"{what} file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{what} file {path} is not a readable .npy array ({exc})") from None


def _evaluate_files(args: argparse.Namespace) -> Scored:
    """The metrics of the .npy files given, all-vs-all or queries against the gallery."""
    if args.embeddings is None or args.labels is None:
        raise HarnessError(f"give a folder written by `{program_name()} run --save-embeddings`, "
                           "or --embeddings and --labels")  # fmt: skip
    if (args.query_embeddings is None) != (args.query_labels is None):
        raise HarnessError("give both --query-embeddings and --query-labels, or neither")
    if args.euclidean:
        raise HarnessError("--euclidean goes with a folder (DIR) of a run that ranked by a "
                           "learned scorer; .npy files are always ranked by Euclidean distance")  # fmt: skip
    rerank = None if args.rerank is None else _given_rerank(args.rerank)
    gallery = _load_npy(args.embeddings, "--embeddings")
    gallery_labels = _load_npy(args.labels, "--labels")
    ks = tuple(args.recall_ks or DEFAULT_RECALL_KS)
    convention = args.clustering or default_convention()
    options = MetricOptions(kmeans_convention=convention)
    said = [convention_note(convention, chosen=args.clustering is not None)]
    if args.query_embeddings is None:
        metrics, notes, extra = _scored(rerank, (gallery, gallery_labels), ks, None, options)
        return metrics, overlap_notes(gallery, None) + said + notes, extra
    query = (_load_npy(args.query_embeddings, "--query-embeddings"),
             _load_npy(args.query_labels, "--query-labels"))  # fmt: skip
    metrics, notes, extra = _scored(rerank, (*query, gallery, gallery_labels), ks, None, options)
    return metrics, overlap_notes(query[0], gallery) + said + notes, extra


def default_convention() -> str:
    """The k-means convention for .npy files: faiss's (20 iterations, as the published tables
    and the modern_* protocols count), or the harness's where faiss is not installed."""
    return "harness" if KMEANS_FAISS is None else "faiss"


def convention_note(convention: str, *, chosen: bool) -> str:
    """One line saying how nmi and f1 were clustered, and how to get the other convention."""
    if convention == "faiss":
        what = "faiss k-means (20 iterations from faiss's random start, seed 0; the published"
        other = " tables' convention); --clustering harness for a k-means++ start and up to 100"
        return f"note: nmi and f1 from {what}{other} iterations"
    why = "" if chosen else " (faiss is not installed)"
    return (f"note: nmi and f1 from the harness's k-means (k-means++ start, up to 100 "
            f"iterations){why}; --clustering faiss for the published tables' convention")  # fmt: skip


def _evaluate_folder(args: argparse.Namespace) -> Scored:
    """A saved folder's metrics, computed as its run computed them (its metrics, recall Ks,
    k-means convention and seed, and its re-ranking), unless --recall-ks, --clustering or
    --rerank says otherwise. A run that ranked by a learned scorer is refused unless
    --euclidean (or --rerank) asks for a ranking from Euclidean distances."""
    saved = load_embeddings(args.folder)
    rerank, notes = _folder_rerank(args, saved.meta)
    if saved.learned_scorer:
        if rerank is None and not args.euclidean:
            raise HarnessError(f"{args.folder}: {saved.meta.get('method')} ranked by its learned "
                               "scorer, which is not saved, so the run's metrics cannot be "
                               "recomputed; pass --euclidean to rank by Euclidean distance "
                               "instead (not the run's numbers)")  # fmt: skip
        ranked = "re-ranked from Euclidean distances" if rerank else "ranked by Euclidean distance"
        notes.append(f"warning: {ranked}, not by the run's learned scorer: these are not the "
                     "run's metrics")  # fmt: skip
    names = _meta(saved.meta, "metrics", list, args.folder)
    ks = _meta(saved.meta, "recall_ks", list, args.folder)
    if args.recall_ks:  # the user's Ks instead of the run's
        names = [n for n in names if not n.startswith("recall@")] + ["recall@K"]
        ks = args.recall_ks
    options = MetricOptions(
        seed=_meta(saved.meta, "kmeans_seed", int, args.folder),
        kmeans_convention=args.clustering or _meta(saved.meta, "clustering", str, args.folder),
    )
    query, query_labels, gallery, gallery_labels = saved.parts()
    parts = (query, query_labels) if gallery is None else (query, query_labels, gallery,
                                                           gallery_labels)  # fmt: skip
    metrics, said, extra = _scored(rerank, parts, tuple(ks), names, options)
    notes += overlap_notes(query, gallery) + said + changed_files(args.folder)
    return metrics, notes, extra


def _folder_rerank(
    args: argparse.Namespace, meta: dict[str, Any]
) -> tuple[Rerank | None, list[str]]:
    """The re-ranking for a saved folder: --rerank's, else the run's own (its protocol's
    evaluation.rerank, recorded in the folder's `ranking`), and a line when it is the run's,
    or when it differs from the run's (then these are not the run's metrics)."""
    recorded = (meta.get("ranking") or {}).get("rerank")  # canonical text, or absent: none
    if args.rerank is None:
        if recorded is None:
            return None, []
        note = (f"note: re-ranked as the run was (evaluation.rerank: {recorded}); --rerank "
                "none for the Euclidean ranking")  # fmt: skip
        return _given_rerank(recorded), [note]
    rerank = _given_rerank(args.rerank)
    if recorded is not None and (rerank is None or rerank.text != recorded):
        return rerank, [f"warning: the run re-ranked by {recorded}, not by --rerank "
                        f"{args.rerank}: these are not the run's metrics"]  # fmt: skip
    return rerank, []


def _meta(meta: dict[str, Any], key: str, kind: type, folder: Path) -> Any:
    """One metadata entry, of the type the run wrote."""
    value = meta.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise HarnessError(f"{folder}/embeddings.json: {key!r} is missing or not a {kind.__name__}"
                           "; rerun the run with --save-embeddings --force")  # fmt: skip
    return value


def overlap_notes(query: Any, gallery: Any | None) -> list[str]:
    """What a reader of the numbers should know about the rows: all-vs-all, that each item is
    left out of its own gallery; queries against a gallery, how many query rows are identical
    to a gallery row (each finds its copy at distance 0: recall@1 = 1.0 for nothing)."""
    if gallery is None:
        n = len(query)
        return [f"note: all-vs-all: each of the {n} items queries the other {n - 1}; it is "
                "excluded from its own gallery"]  # fmt: skip
    dtype = np.result_type(np.asarray(query).dtype, np.asarray(gallery).dtype)
    # + 0.0 makes -0.0 equal to 0.0; rows compare by their bytes
    rows = {row.tobytes() for row in np.ascontiguousarray(gallery, dtype=dtype) + 0.0}
    same = sum(row.tobytes() in rows for row in np.ascontiguousarray(query, dtype=dtype) + 0.0)
    if not same:
        return []
    return [f"warning: {same} of {len(query)} query rows are identical to a gallery row: each "
            "finds its copy at distance 0, which inflates recall@1; drop the copies from the "
            "gallery, or evaluate all-vs-all (each item excluded from its own gallery)"]  # fmt: skip


def changed_files(folder: Path) -> list[str]:
    """A line for each saved file whose sha256 differs from what its run's result recorded
    (the result beside the folder, when there is one)."""
    result = Path(folder).with_suffix(".json")
    try:
        recorded = json.loads(result.read_text(encoding="utf-8"))["embeddings"]["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []  # no result beside it (a copied folder): nothing to compare with
    changed = [name for name, sha in sorted(recorded.items())
               if not (Path(folder) / name).is_file() or file_sha256(Path(folder) / name) != sha]  # fmt: skip
    if not changed:
        return []
    return [f"warning: {', '.join(changed)} differ from the files {result.name} recorded "
            "(sha256): these may not be the run's numbers"]  # fmt: skip
