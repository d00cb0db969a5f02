"""A bench's target verdict says whether the run decided it: a median on the target's side
whose halves or bootstrap interval reach across the target met (or missed) it by the median
alone (``bench.common.ratio_target``, shared by pool, concurrent_cli, oneshot and supervised).
And bench pool's cold ratio beside the part of it sbxkit controls (``beyond_floor``)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.common import ratio_target, target_lines, target_md
from bench.harness import Contender, StepTimings
from bench.pool import beyond_floor, beyond_floor_lines


def measured(ratio: float, halves: tuple[float, float], interval: tuple[float, float]) -> Any:
    """What ``bench.harness.ratio_of_medians`` reports."""
    return {"ratio": ratio, "halves": list(halves), "bootstrap95": list(interval), "n": 30}


def test_a_ratio_whose_halves_and_interval_stay_under_the_ceiling_is_met_and_decided() -> None:
    verdict = ratio_target("cold/raw <= 0.80", measured(0.70, (0.69, 0.71), (0.66, 0.74)), 0.80)

    assert (verdict["met"], verdict["decided"]) == (True, True)
    assert target_lines(verdict) == ["target cold/raw <= 0.80: MET (0.700)"]


def test_a_median_under_the_ceiling_with_an_interval_across_it_is_not_decided() -> None:
    verdict = ratio_target("cold/raw <= 0.80", measured(0.79, (0.78, 0.79), (0.76, 0.83)), 0.80)

    assert (verdict["met"], verdict["decided"]) == (True, False)
    (line,) = target_lines(verdict)
    assert line.endswith("undecided: its halves or bootstrap interval reach across the target)")
    assert "undecided" in target_md(verdict)[-1]


def test_one_half_across_the_ceiling_leaves_it_undecided_too() -> None:
    verdict = ratio_target("cold/raw <= 0.80", measured(0.78, (0.77, 0.82), (0.76, 0.79)), 0.80)

    assert (verdict["met"], verdict["decided"]) == (True, False)


def test_a_ratio_wholly_over_the_ceiling_is_decided_as_missed() -> None:
    verdict = ratio_target("cold/raw <= 0.80", measured(0.90, (0.88, 0.91), (0.85, 0.95)), 0.80)

    assert (verdict["met"], verdict["decided"]) == (False, True)
    assert target_lines(verdict) == ["target cold/raw <= 0.80: NOT met (0.900)"]


def test_an_at_least_target_reads_its_side_the_other_way() -> None:
    above = ratio_target("jobs >= 1.0", measured(1.4, (1.3, 1.5), (1.2, 1.6)), 1.0, at_most=False)
    across = ratio_target(
        "jobs >= 1.0", measured(1.05, (1.0, 1.1), (0.95, 1.15)), 1.0, at_most=False
    )

    assert (above["met"], above["decided"]) == (True, True)
    assert (across["met"], across["decided"]) == (True, False)


def test_an_unmeasured_ratio_has_no_verdict_and_no_line() -> None:
    verdict = ratio_target("x <= 1", None, 1.0)

    assert (verdict["met"], verdict["decided"]) == (None, None)
    assert target_lines(verdict) == []


def floor_and_cold(rounds: int, beyond_s: float) -> list[Contender]:
    """The floor and a cold run ``beyond_s`` longer than the floor's create and start, in a
    daemon that slows round by round (both see the same slowness: they ran in one round)."""

    async def never() -> StepTimings:
        raise AssertionError("not run")

    raw, cold = Contender("raw", "raw", "", never), Contender("cold", "cold", "", never)
    for round_no in range(rounds):
        create, start = 0.010 + 0.0002 * round_no, 0.080 + 0.001 * round_no
        raw.record(create + start + 0.030, {"create": create, "start": start, "wait": 0.030})
        cold.record(create + start + beyond_s, {"create": create + beyond_s, "start": start})
    return [cold, raw]


def test_the_cold_runs_own_part_is_its_time_beyond_the_floors_create_and_start() -> None:
    """bench pool's ``beyond_floor``: what sbxkit controls of the cold ratio, in ms, whatever
    the daemon's speed, and the room the 0.80 target leaves it, round by round."""
    beyond = beyond_floor(floor_and_cold(41, 0.005), complete=True)

    assert beyond is not None
    took, room = beyond["sbxkit_ms"], beyond["room_ms"]
    assert took["median"] == pytest.approx(5.0)
    assert took["bootstrap95"] == pytest.approx([5.0, 5.0])
    # 0.80 × (create + start + 30 ms) − (create + start) at the median round (round 20: create
    # 14 ms, start 100 ms); it shrinks as the daemon slows while sbxkit's part stays 5 ms.
    assert room["median"] == pytest.approx(0.8 * 144.0 - 114.0)
    assert beyond_floor_lines(beyond) == [
        "cold beyond the floor's own create and start: 5.0 ms (bootstrap95 5.0–5.0); "
        "the room cold/raw <= 0.80 leaves: 1.2 ms"
    ]


def test_no_figure_without_both_contenders_in_every_round() -> None:
    cold, raw = floor_and_cold(5, 0.005)

    assert beyond_floor([cold, raw], complete=False) is None
    assert beyond_floor([cold], complete=True) is None
    assert beyond_floor_lines(None) == []
