"""How fast photos are embedded: the harness's feature cache and `index` against onnxruntime
alone on the same network and a bare decode loop, measured in one run on the same photos.

    python tests/benchmarks/embed_rate.py                  # writes results/reference/benchmarks/embed_rate.{json,md}
    python tests/benchmarks/embed_rate.py --photos 300 --out /tmp/embed

What it measures, on the `birds` protocol's data (cub100) with `features.engine: onnxruntime`:

* cache: the whole `birds` feature cache built from nothing (17,698 crops: four train views
  of each training photo and the test view of every photo), wall seconds of
  with_cached_features (the network's export and parity check included) and its loop's rate;
* trunk alone: onnxruntime's rate on the exported trunk, on batches of those crops made
  beforehand (no decoding, no augmentation);
* index: `harness index` over `--photos` JPEG files of cub100 with a model kept from a short
  arcface run (decoding, preprocessing and the faiss index included);
* embedder alone: onnxruntime's rate on the kept model's export, on those photos' input
  batches made beforehand;
* decode: a bare loop that decodes and resizes the same files as `index` does (open_photo,
  then the load size), one thread.

The ratios that matter: cache / trunk alone and index / embedder alone (the goal: 0.8 or
more). Nothing is asserted; the figures go to --out with the machine, the engine and the
versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=1000, help="files for index (default 1000)")
    parser.add_argument("--out", type=Path, default=REPO / "results/reference/benchmarks",
                        help="folder for embed_rate.json and .md")  # fmt: skip
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="embed-rate-"))
    os.environ["DML_HARNESS_CACHE"] = str(work / "cache")  # built from nothing

    import harness.methods  # noqa: F401
    import torch
    import yaml

    from harness.backbones.engine import _SESSIONS
    from harness.cli import main as cli
    from harness.core import RunContext, load_protocol
    from harness.data import for_test, prepare_data
    from harness.data.lazy import pixels
    from harness.data.photo_decode import open_photo
    from harness.deploy import load_model
    from harness.deploy.images import image_files, model_engine, preprocess
    from harness.records import machine_fingerprint
    from harness.train import features

    birds = yaml.safe_load((REPO / "protocols" / "birds.yaml").read_text())
    birds["name"], birds["features"]["engine"] = "birds_engine", "onnxruntime"
    protocol_file = work / "birds_engine.yaml"
    protocol_file.write_text(yaml.safe_dump(birds))
    protocol = load_protocol(str(protocol_file))
    ctx = RunContext(protocol, 0, torch.device("cpu"), progress=False)
    start = time.perf_counter()
    prepared = prepare_data(protocol, None)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    views = features.with_cached_features(ctx, prepared.data, prepared.split).images
    cache_wall = time.perf_counter() - start
    made_by = views.made_by
    crops = int(len(views.test) + views.train.shape[0] * views.train.shape[1])

    # the trunk alone, on the test crops made beforehand
    session = next(s for k, s in _SESSIONS.items() if "network-" in k)
    test_view = for_test(prepared.data.images, protocol.augmentation, protocol.backbone.input_size)
    batches = [features._loaded(test_view[s : s + 32]).numpy() for s in range(0, 1024, 32)]
    session.run(None, {"images": batches[0]})
    start = time.perf_counter()
    for batch in batches:
        session.run(None, {"images": batch})
    trunk_rate = 1024 / (time.perf_counter() - start)

    # a kept model, its index over JPEG files, and the same files alone
    results = work / "results"
    assert cli(["-q", "run", "--protocol", str(protocol_file), "--method", "arcface", "--seeds",
                "0", "--max-steps", "4", "--save-model", "--results-dir", str(results)]) == 0  # fmt: skip
    model_file = results / "runs" / "birds_engine" / "arcface" / "seed0.model.pt"
    photos = work / "photos"
    with zipfile.ZipFile(REPO.parent / "shared" / "data" / "cub100" / "cub100.zip") as z:
        names = sorted(n for n in z.namelist() if n.endswith(".jpg"))[: args.photos]
        for name in names:
            (photos / name).parent.mkdir(parents=True, exist_ok=True)
            (photos / name).write_bytes(z.read(name))
    start = time.perf_counter()
    assert cli(["-q", "index", str(model_file), "--images", str(photos), "--out",
                str(work / "index")]) == 0  # fmt: skip
    index_s = time.perf_counter() - start
    start = time.perf_counter()  # the same again: the export is cached now
    assert cli(["-q", "index", str(model_file), "--images", str(photos), "--out",
                str(work / "index2")]) == 0  # fmt: skip
    index_again_s = time.perf_counter() - start
    model = load_model(model_file)
    engine = model_engine(model)
    files = image_files(photos)
    start = time.perf_counter()
    inputs = [preprocess(photos / f, model.preprocessing) for f in files]
    preprocess_s = time.perf_counter() - start
    stacked = [torch.stack(inputs[s : s + 32]) for s in range(0, len(inputs), 32)]
    engine.run(stacked[0])
    start = time.perf_counter()
    for batch in stacked:
        engine.run(batch)
    embedder_rate = len(files) / (time.perf_counter() - start)
    start = time.perf_counter()
    for f in files:
        pixels(open_photo(photos / f, f), int(model.preprocessing["load_size"]))
    decode_rate = len(files) / (time.perf_counter() - start)

    figures = {
        "machine": machine_fingerprint(torch.device("cpu")),
        "platform": platform.platform(), "cores": os.cpu_count(),
        "engine": {k: made_by[k] for k in ("engine", "version", "threads")},
        "dataset_load_s": round(load_s, 1),
        "cache": {"crops": crops, "wall_s": round(cache_wall, 1),
                  "loop_s": made_by["seconds"], "rate": made_by["images_per_s"]},
        "trunk_alone_rate": round(trunk_rate, 1),
        "index": {"photos": len(files), "first_s": round(index_s, 2),
                  "again_s": round(index_again_s, 2),
                  "rate": round(len(files) / index_again_s, 1)},
        "embedder_alone_rate": round(embedder_rate, 1),
        "preprocess_rate": round(len(files) / preprocess_s, 1),
        "decode_rate": round(decode_rate, 1),
    }  # fmt: skip
    figures["ratios"] = {
        "cache_vs_trunk_alone": round(figures["cache"]["rate"] / trunk_rate, 2),
        "index_vs_embedder_alone": round(figures["index"]["rate"] / embedder_rate, 2),
        "decode_vs_embedder_alone": round(decode_rate / embedder_rate, 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embed_rate.json").write_text(json.dumps(figures, indent=1) + "\n")
    (args.out / "embed_rate.md").write_text(markdown(figures))
    print(markdown(figures))


def markdown(f: dict) -> str:
    c, i, r = f["cache"], f["index"], f["ratios"]
    e = f["engine"]
    return f"""# Photos embedded: the harness against onnxruntime alone

Measured by `python tests/benchmarks/embed_rate.py` in one run on {f["machine"].get("cpu_model", "?")}
({f["cores"]} cores, {f["platform"]}); engine {e["engine"]} {e["version"]}, {e["threads"]} threads.

| what | images | rate (img/s) | against onnxruntime alone |
|---|---|---|---|
| `birds` feature cache, decode and augmentation included (loop) | {c["crops"]:,} | {c["rate"]} | {r["cache_vs_trunk_alone"]}x |
| the trunk alone (onnxruntime, crops made beforehand) | 1,024 | {f["trunk_alone_rate"]} | 1 |
| `index`, decode and faiss included (second run) | {i["photos"]:,} | {i["rate"]} | {r["index_vs_embedder_alone"]}x |
| the kept model alone (onnxruntime, inputs made beforehand) | {i["photos"]:,} | {f["embedder_alone_rate"]} | 1 |
| decode and resize alone (one thread) | {i["photos"]:,} | {f["decode_rate"]} | {r["decode_vs_embedder_alone"]}x |

The whole `birds` cache from nothing: {c["wall_s"]} s (the loop {c["loop_s"]} s; the rest is
building the network, exporting it to ONNX once and checking it against torch); reading and
decoding cub100 before it: {f["dataset_load_s"]} s. `index` the first time: {i["first_s"]} s (the
kept model's export included), then {i["again_s"]} s.
"""


if __name__ == "__main__":
    main()
