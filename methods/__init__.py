"""Method adapters, one module per method. This tuple is the registry: one line per method.

The package imports as `harness.methods` (the wheel ships this folder as harness/methods/; in
a clone, harness/__init__.py finds it here), never as a top-level `methods`: a second copy
under another name would register every method twice.
"""

import importlib

if __name__ != "harness.methods":
    raise ImportError(f"import the built-in methods as harness.methods, not {__name__}")

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
    importlib.import_module(f"{__name__}.{_name}")
