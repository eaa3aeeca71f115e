"""Reporting: results -> the leaderboard (regenerated from results, never edited), the static
HTML report, verdicts (intervals and significance), the figures at a glance (critical-difference
diagram, ranks across protocols, forest plots), other figures, the cost tables, and CI's
regression check."""

from harness.report.cost_tables import (
    consistency_line,
    cost_rows,
    cost_section,
    cost_table,
    devices_section,
    devices_table,
    overhead_line,
)
from harness.report.figures import by_family, cost_figure, distance_histograms, training_curve
from harness.report.forest import Forest, dumbbells, forest
from harness.report.glance import Glance, draw_glance, glance_section
from harness.report.html import write_report
from harness.report.leaderboard import render, write_leaderboard
from harness.report.ranks import Block, RankTest, protocol_blocks, rank_test
from harness.report.reference import reference_section
from harness.report.regression import BASELINE_DIR, BASELINE_SEEDS, check, update_baselines
from harness.report.retrieval import RetrievalRow, RowChoice, draw_retrieval_grid, select_rows
from harness.report.verdicts import against_best, describe, per_seed, row_names

__all__ = [
    "Block",
    "Forest",
    "Glance",
    "RankTest",
    "draw_glance",
    "dumbbells",
    "forest",
    "glance_section",
    "protocol_blocks",
    "rank_test",
    "RetrievalRow",
    "RowChoice",
    "draw_retrieval_grid",
    "select_rows",
    "BASELINE_DIR",
    "BASELINE_SEEDS",
    "against_best",
    "by_family",
    "check",
    "cost_figure",
    "consistency_line",
    "cost_rows",
    "cost_section",
    "cost_table",
    "describe",
    "devices_section",
    "devices_table",
    "distance_histograms",
    "overhead_line",
    "per_seed",
    "reference_section",
    "render",
    "row_names",
    "training_curve",
    "update_baselines",
    "write_leaderboard",
    "write_report",
]
