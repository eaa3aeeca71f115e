"""The README's three-sentence verdict (harness.report.headline) on hand-made protocol
verdicts: one leader or several, gaps that shrink everywhere or not. Its committed text is
checked in tests/test_docs_numbers.py."""

from __future__ import annotations

from harness.report.headline import _gaps, _leaders
from harness.report.tuned_verdict import ProtocolVerdict


def verdict(name: str, best: str, gap_default: float, gap_tuned: float) -> ProtocolVerdict:
    return ProtocolVerdict(name, "map@r", best, [], 3, 0, 0, 0, gap_default, gap_tuned,
                           {20}, 5, [], [])  # fmt: skip


def test_several_leaders_and_gaps_that_shrink_everywhere():
    both = [verdict("birds", "circle", 2.7, 1.7), verdict("cars", "margin", 1.3, 0.9)]
    assert _leaders(both) == (
        "On 2 real-photo datasets with an ImageNet-pretrained network, each loss tuned with the "
        "same budget, no loss is best everywhere: circle leads on birds and margin on cars."
    )
    assert _gaps(both).startswith("Tuning narrows the gaps, as [the Reality Check](")
    assert "the leader is 1.7 and 0.9 [MAP@R](" in _gaps(both)
    assert _gaps(both).endswith("points ahead of the median loss on birds and cars, against "
                                "2.7 and 1.3 at the papers' defaults.")  # fmt: skip


def test_a_leader_of_several_datasets_is_named_once_with_its_datasets():
    four = [verdict("birds", "circle", 2.7, 1.7), verdict("cars", "margin", 1.3, 0.9),
            verdict("groceries", "hdc", 5.2, 3.6), verdict("plankton", "hdc", 2.0, 1.8)]  # fmt: skip
    assert _leaders(four).endswith("no loss is best everywhere: circle leads on birds, margin "
                                   "on cars and hdc on groceries and plankton.")  # fmt: skip


def test_one_leader_everywhere_and_a_gap_that_grows():
    same = [verdict("birds", "circle", 2.7, 1.7), verdict("cars", "circle", 0.9, 1.3)]
    assert _leaders(same).endswith("each loss tuned with the same budget, circle leads on all 2.")
    assert _gaps(same).startswith(
        "Tuning narrows the gaps on only 1 of 2 datasets, against what [the Reality Check]("
    )
