"""From the verdict to a model in use: `export` a kept model (`run --save-model`) to ONNX or
TorchScript, `index` a folder of photos with it, and `search` that index with photos.

Bad input (a file that is not a kept model, an index made by another model, a query that
cannot be decoded, an empty folder, an unknown format or index kind) is one line and exit 2,
and nothing is written."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.backbones.engine import ENGINES
from harness.cli.argtypes import add_aliased, add_kept_plugin_option, positive_int
from harness.core import HarnessError, program_name, resolve_device
from harness.deploy import (
    FORMATS,
    KINDS,
    Hit,
    build_or_update,
    export_model,
    load_model,
    read_catalogue,
    search,
)
from harness.records import model_path


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `export`, `index` and `search` subcommands' options."""
    ex = sub.add_parser("export", help="write a kept model (run --save-model) as ONNX or "
                        "TorchScript, to embed images without the harness")  # fmt: skip
    ex.add_argument("model", type=Path, metavar="MODEL",
                    help="a run's seed<k>.model.pt, or its seed<k>.json beside it")  # fmt: skip
    ex.add_argument("--format", required=True, choices=FORMATS,
                    help="onnx (onnxruntime and other ONNX runtimes) or torchscript (torch.jit."
                    "load, no harness needed); the preprocessing is recorded inside")  # fmt: skip
    ex.add_argument("--out", required=True, type=Path, metavar="FILE",
                    help="the file to write (e.g. model.onnx); its embeddings are checked "
                    "against the harness's before the command succeeds")  # fmt: skip
    add_kept_plugin_option(ex)
    ex.set_defaults(handler=cmd_export)
    ix = sub.add_parser("index", help="embed a folder of photos with a kept model and build "
                        "(or update) a searchable index")  # fmt: skip
    ix.add_argument("model", type=Path, metavar="MODEL",
                    help="a run's seed<k>.model.pt, or its seed<k>.json beside it")  # fmt: skip
    ix.add_argument("--images", required=True, type=Path, metavar="FOLDER",
                    help="the folder of photos to index (every image file under it; files that "
                    "cannot be decoded are skipped and counted)")  # fmt: skip
    ix.add_argument("--out", required=True, type=Path, metavar="INDEX_DIR",
                    help="the index's folder: created, or updated (only new, changed and "
                    "removed photos are embedded again) when it holds an index of FOLDER")  # fmt: skip
    ix.add_argument("--kind", metavar="KIND[:k=v,...]",
                    help=f"the faiss index: {', '.join(KINDS)} (default flat, exact; hnsw or "
                    "ivfpq past a million photos, e.g. hnsw:M=32 or ivfpq:nlist=1024,m=64); an "
                    "existing index keeps its own unless given")  # fmt: skip
    ix.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="where the network embeds the photos: auto (default: cuda when a GPU "
                    "is visible, else cpu)")  # fmt: skip
    add_engine_options(ix)
    add_kept_plugin_option(ix)
    ix.set_defaults(handler=cmd_index)
    se = sub.add_parser("search", help="the nearest indexed photos to each query photo")
    se.add_argument("index", type=Path, metavar="INDEX_DIR",
                    help="an index that `index MODEL --images FOLDER --out INDEX_DIR` wrote")  # fmt: skip
    se.add_argument("images", type=Path, nargs="+", metavar="IMAGE",
                    help="one or more query photos (any file PIL decodes)")  # fmt: skip
    add_aliased(
        se,
        "--k",
        "-k",
        dest="k",
        type=positive_int,
        default=10,
        help="results per query (default 10)",
    )
    se.add_argument("--model", type=Path, help="the kept model (default: the one the index "
                    "records; it must be the same weights)")  # fmt: skip
    se.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_engine_options(se)
    se.add_argument("--html", type=Path, metavar="PAGE",
                    help="also write an HTML page: each query and its results as a grid")  # fmt: skip
    add_kept_plugin_option(se)
    se.set_defaults(handler=cmd_search)


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """`--engine` and `--threads`: what runs the kept network forward (index, search)."""
    parser.add_argument("--engine", default="auto", choices=["auto", *ENGINES],
                        help="auto (default): onnxruntime on a CPU where it is installed, "
                        "torch otherwise and on a GPU")  # fmt: skip
    parser.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="the engine's threads (default: torch's, one per core)",
    )


def model_file(path: Path) -> Path:
    """MODEL as given: a model file, or a run's result file (its model beside it)."""
    if not path.exists():
        raise HarnessError(f"{path} does not exist; give a run's seed<k>.model.pt or its "
                           "seed<k>.json (under <results-dir>/runs/<protocol>/<method>/, kept by "
                           f"`{program_name()} run --method NAME --save-model`)")  # fmt: skip
    if path.suffix == ".json":
        beside = model_path(path)
        if not beside.is_file():
            raise HarnessError(f"{path} has no saved model beside it ({beside.name}); rerun "
                               f"the run with `{program_name()} run ... --save-model --force`")  # fmt: skip
        return beside
    return path


def cmd_export(args: argparse.Namespace) -> int:
    model = load_model(model_file(args.model))
    parity = export_model(model, args.format, args.out)
    print(f"wrote {args.out} ({args.format}; {model.meta['method']['name']}, protocol "
          f"{model.meta['provenance']['protocol']['name']}); its embeddings match the "
          f"harness's to 1 - cosine {parity['max_one_minus_cosine']:.1e}")  # fmt: skip
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    model = load_model(model_file(args.model))
    device = resolve_device(args.device)
    update = build_or_update(model, args.images, args.out, args.kind, progress=not args.quiet,
                             device=device, engine=args.engine, threads=args.threads)  # fmt: skip
    skipped = f", {update.skipped} skipped (not decodable)" if update.skipped else ""
    if not update.written:
        print(f"{args.out}: up to date ({update.total} photos{skipped}); nothing written")
        return 0
    print(f"{args.out}: {update.total} photos ({update.added} embedded, {update.kept} kept, "
          f"{update.dropped} dropped{skipped})")  # fmt: skip
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    catalogue = read_catalogue(args.index)
    model = load_model(args.model or Path(catalogue.header["model"]["path"]))
    results = search(catalogue, model, args.images, args.k, args.engine, args.threads)
    folder = Path(catalogue.header["folder"])
    if args.html:
        from harness.deploy.search_page import write_search_page

        write_search_page(args.html, folder, args.images, results, catalogue.header)
    if args.json:
        print(json.dumps(_as_json(folder, args.images, results), indent=2))
        return 0
    for query, hits in zip(args.images, results, strict=True):
        print(f"{query}:")
        for hit in hits:
            print(f"  {hit.rank:>3}. {hit.distance:.4f}  {hit.path}")
    print(f"(paths under {folder}; Euclidean distance, smaller is closer)", file=sys.stderr)
    return 0


def _as_json(folder: Path, queries: list[Path], results: list[list[Hit]]) -> dict[str, Any]:
    return {"folder": str(folder), "distance": "euclidean", "queries": [
        {"query": str(q), "results": [{"rank": h.rank, "path": h.path, "file":
                                       str(folder / h.path), "distance": h.distance} for h in hits]}
        for q, hits in zip(queries, results, strict=True)]}  # fmt: skip
