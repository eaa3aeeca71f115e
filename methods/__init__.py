"""Method adapters, one module per method. This tuple is the registry: one line per method."""

import importlib

MODULES = (
    "untrained",
    "contrastive",
    "triplet",
    "lifted_structure",
    "pddm",
    "npairs",
    "histogram",
    "binomial_deviance",
    "triplet_global",
    "hdc",
    "quadruplet_selection",
    "proxy_anchor",
    "proxy_nca",
    "multi_similarity",
    "arcface",
    "normalized_softmax",
    "soft_triple",
    "circle",
    "supcon",
    "margin",
    "_pml",  # the pml:<LossClass>[+<MinerClass>] names (imported by the PML methods anyway)
)

for _name in MODULES:
    importlib.import_module(f"methods.{_name}")
