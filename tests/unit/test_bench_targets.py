"""A bench's target verdict says whether the run decided it: a ratio whose bootstrap interval
reaches across the target was met (or missed) by the median alone."""

from __future__ import annotations

from bench.common import at_least_target, at_most_target, target_lines, target_md


def test_a_ratio_whose_interval_stays_under_the_ceiling_is_met_and_decided() -> None:
    verdict = at_most_target("cold/raw <= 0.80", 0.70, 0.80, [0.66, 0.74])

    assert verdict["met"] is True
    assert verdict["decided"] is True
    assert target_lines(verdict) == [
        "target cold/raw <= 0.80: MET (0.700; bootstrap95 0.660–0.740, all on this side)"
    ]


def test_a_median_under_the_ceiling_with_an_interval_across_it_is_not_decided() -> None:
    verdict = at_most_target("cold/raw <= 0.80", 0.79, 0.80, [0.76, 0.83])

    assert verdict["met"] is True
    assert verdict["decided"] is False
    (line,) = target_lines(verdict)
    assert line.endswith("reaches across it: this run does not decide it)")
    assert "does not decide it" in target_md(verdict)[-1]


def test_a_ratio_whose_interval_stays_over_the_ceiling_is_decided_as_missed() -> None:
    verdict = at_most_target("cold/raw <= 0.80", 0.90, 0.80, [0.85, 0.95])

    assert (verdict["met"], verdict["decided"]) == (False, True)


def test_an_at_least_target_reads_the_interval_the_same_way() -> None:
    assert at_least_target("jobs >= 1.0", 1.4, 1.0, [1.2, 1.6])["decided"] is True
    across = at_least_target("jobs >= 1.0", 1.05, 1.0, [0.95, 1.15])
    assert (across["met"], across["decided"]) == (True, False)


def test_without_an_interval_the_verdict_is_the_medians_alone() -> None:
    verdict = at_most_target("x <= 1", 0.5, 1.0)

    assert "decided" not in verdict
    assert target_lines(verdict) == ["target x <= 1: MET (0.500)"]
    assert at_most_target("x <= 1", None, 1.0)["met"] is None
