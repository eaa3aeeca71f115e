"""`data verify` (a dataset on disk: the papers' against their published counts, the real-photo
sets file by file against their shipped manifests, yours against what a run needs), `data
fetch` (a real-photo set built from its public source) and `data download` (CUB-200-2011)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.parsing import SubcommandParser
from harness.core import HarnessError, load_protocol
from harness.data import download, verify, verify_own
from harness.data.photo_sets import SETS, manifest
from harness.data.rebuild import open_data

PAPERS = ("cub200", "cars196", "sop", "inshop", "vehicleid")
OWN = ("folder", "csv")  # the datasets you bring without code
MADE = ("glyphs", "omniglot")  # generated in code, or checked by their own loader


def add_parser(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="check datasets on disk, or fetch them from their source")
    dsub = data.add_subparsers(dest="data_command", required=True, parser_class=SubcommandParser)
    check = dsub.add_parser("verify", help="check a dataset on disk: a paper's against the "
                            "published counts, a real-photo set file by file against its "
                            "manifest, your folder / csv against what a run needs")  # fmt: skip
    check.add_argument(
        "--dataset",
        required=True,
        choices=[*SETS, *PAPERS, *OWN, *MADE],
        help="the dataset's name, as a protocol's dataset.name gives it",
    )
    check.add_argument("--data-root", type=Path, help="the folder holding it (a real-photo set: "
                       "default ../shared/data/NAME, then the user data folder)")  # fmt: skip
    check.add_argument("--quick", action="store_true", help="check files exist, do not decode")
    check.add_argument("--protocol", help="folder / csv: the protocol to check against (its "
                       "sampler's K and its dataset.params; default: the default protocol's K)")  # fmt: skip
    fetch = dsub.add_parser("fetch", help="build a real-photo dataset from its public source, "
                            "checking every file against the shipped manifest")  # fmt: skip
    fetch.add_argument("name", choices=list(SETS), help="the dataset")
    fetch.add_argument("--data-root", type=Path, help="where to build it (default: the user "
                       "data folder, $DML_HARNESS_DATA or ~/.local/share/dml-harness, /NAME)")  # fmt: skip
    fetch.add_argument("--from", dest="source", metavar="URL_OR_FILE", help="the source "
                       "repository's archive at the pinned commit, from a mirror or a file "
                       "already downloaded (default: its GitHub archive)")  # fmt: skip
    fetch.add_argument("--force", action="store_true", help="build it again even if present")
    download_ = dsub.add_parser("download", help="fetch a paper dataset that has a public URL")
    download_.add_argument("--dataset", required=True, choices=PAPERS,
                           help="the paper dataset to download")  # fmt: skip
    download_.add_argument("--data-root", required=True, type=Path,
                           help="the folder to download it into")  # fmt: skip
    data.set_defaults(handler=cmd_data)


def cmd_data(args: argparse.Namespace) -> int:
    if args.data_command == "fetch":
        return _fetch(args)
    if args.data_command == "download":
        print(f"saved {download(args.dataset, args.data_root)}")
        args.quick, args.protocol = True, None  # then check what was extracted
    if args.dataset in SETS:
        return _verify_set(args.dataset, args.data_root)
    if args.dataset in MADE:
        return _verify_made(args)
    if args.data_root is None:
        raise HarnessError(f"data verify --dataset {args.dataset} needs --data-root DIR, the "
                           "folder holding it")  # fmt: skip
    if not args.data_root.is_dir():  # a typo, not a dataset that fails its counts (exit 1)
        raise HarnessError(f"--data-root {args.data_root} is not a directory; pass the folder "
                           f"that holds {args.dataset}")  # fmt: skip
    if args.dataset in OWN:
        protocol = load_protocol(args.protocol or "default")
        params = protocol.dataset.params if protocol.dataset.name == args.dataset else {}
        k = protocol.sampler.images_per_class
        ok, report = verify_own(args.dataset, args.data_root, k, params, decode=not args.quick)
    else:
        if args.protocol:
            raise HarnessError("--protocol applies to --dataset folder or csv only: drop it")
        ok, report = verify(args.dataset, args.data_root, decode=not args.quick)
    print(report)
    return 0 if ok else 1


def _verify_set(name: str, data_root: Path | None) -> int:
    """A real-photo set: every file against the manifest (a missing, extra or altered one is
    the one-line error of harness.data.photo_sets.verify)."""
    with open_data(name, data_root) as files:
        exact = files.provenance.get("exact", True)
        print(f"{name}: {files.path} ({files.kind}) holds the {len(manifest(name).expected)} "
              f"files of its manifest (sha256 {manifest(name).sha256[:16]}...)"
              + ("" if exact else f"; {len(files.provenance.get('differing', {}))} derived "
                 f"files differ from the published bytes (Pillow {files.provenance.get('pillow')})"
                 ": numbers made on it compare statistically"))  # fmt: skip
    print("OK")
    return 0


def _verify_made(args: argparse.Namespace) -> int:
    """glyphs: nothing on disk; omniglot: its loader's own checks, run as a run would."""
    from harness.data import DATASETS

    if args.dataset == "glyphs":
        print("glyphs: rendered from fonts the harness ships; nothing on disk to verify\nOK")
        return 0
    if args.data_root is None:
        raise HarnessError("data verify --dataset omniglot needs --data-root DIR, the folder "
                           "holding images_background_small1.zip (or another Omniglot archive)")  # fmt: skip
    from harness.core import default_cache_dir

    images = DATASETS.get("omniglot")(args.data_root, default_cache_dir() / "omniglot")
    print(f"omniglot: {images.source}\nOK")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from harness.data.photo_sets import find, verify
    from harness.data.rebuild import fetch

    spec = SETS[args.name]
    if args.data_root is None and not args.force and not args.source:
        shared = find(args.name, spec.shared_root)
        if shared is not None:  # the first place a run looks
            with verify(args.name, shared, f"fetch it into another folder with "
                        f"`{spec.fetch_command(spec.user_root)}`") as files:  # fmt: skip
                print(f"{args.name}: already in {files.path}, verified")
            return 0
    root = args.data_root if args.data_root is not None else spec.user_root
    with fetch(args.name, root, source=args.source, force=args.force) as files:
        print(f"{args.name}: {files.path} holds its {len(manifest(args.name).expected)} files, "
              "verified" + ("" if files.provenance.get("exact", True) else
                            " (some derived files differ from the published bytes: recorded)"))  # fmt: skip
    return 0
