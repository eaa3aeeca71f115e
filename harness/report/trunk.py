"""The provenance lines of a leaderboard section: the one line for a protocol whose trunk is
frozen and cached (protocol `features:`): what never trains, how many views were cached and by
what key; and where each method that is not built in came from."""

from __future__ import annotations

from harness.core import describe_source
from harness.records import RunResult


def trunk_lines(group: list[RunResult]) -> list[str]:
    """[] unless the protocol freezes and caches a trunk."""
    content = group[0].protocol.content or {}
    features = content.get("features") or {}
    if not features.get("frozen_stages"):
        return []
    frozen = int(features["frozen_stages"])
    backbone = content.get("backbone") or {}
    shas = sorted({(r.backbone_weights or {}).get("sha256", "?")[:12] for r in group})
    return [
        f"Frozen, cached trunk: stages 0-{frozen - 1} of {backbone.get('name', '?')} "
        f"({backbone.get('pretrained', '?')} weights, sha256 {', '.join(shas)}...) never train; "
        f"their outputs were computed once, {features.get('train_views')} views of each "
        f"training image (the train augmentation, view seed {features.get('view_seed')}) and "
        "the test view of every image, and cached under the weights' sha256 and the hash of "
        f"the protocol's data, split, backbone, augmentation and features. Each run trains "
        f"stage {frozen} onwards and the method's head; heads on stages before {frozen} (HDC's "
        "shallower heads) learn on fixed features.",
        "",
    ]


def method_sources(runs: list[RunResult]) -> list[str]:
    """Where the methods that are not built in came from (a plugin file and its sha256, a
    distribution and its version), one line each."""
    found = {(r.method.name, tuple(sorted(r.method.source.items())))
             for r in runs if r.method.source}  # fmt: skip
    lines = []
    for name, items in sorted(found):
        source = dict(items)
        sha = f", sha256 `{source['sha256'][:12]}`" if source.get("sha256") else ""
        lines.append(f"Not built in: `{name}` from {describe_source(source)}{sha}.")
    return lines
