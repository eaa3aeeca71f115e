"""Reporting: results -> the leaderboard (regenerated from results, never edited), the static
HTML report, verdicts (intervals and significance), the figures at a glance (critical-difference
diagram, ranks across protocols, forest plots), other figures and the cost tables. The numbers
behind the verdicts and figures come from harness.stats; this package decides how they read."""

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
from harness.report.reference import reference_section
from harness.report.retrieval import draw_retrieval_grid
from harness.report.verdicts import against_best

__all__ = [
    "Forest",
    "Glance",
    "draw_glance",
    "dumbbells",
    "forest",
    "glance_section",
    "draw_retrieval_grid",
    "against_best",
    "by_family",
    "cost_figure",
    "consistency_line",
    "cost_rows",
    "cost_section",
    "cost_table",
    "devices_section",
    "devices_table",
    "distance_histograms",
    "overhead_line",
    "reference_section",
    "render",
    "training_curve",
    "write_leaderboard",
    "write_report",
]
