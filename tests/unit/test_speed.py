"""The rule that scales the suite's timing bounds by the machine's slowness (tests/speed.py)."""

from __future__ import annotations

import pytest

from tests import speed


def test_the_ci_machine_keeps_its_bounds_as_written() -> None:
    assert speed.scaled(4.0, 0.5, ceiling=9.0) == 4.0  # a faster machine never tightens them
    assert speed.scaled(4.0, 1.0, ceiling=9.0) == 4.0


def test_a_slower_machine_gets_a_longer_bound_up_to_the_failure_it_guards() -> None:
    assert speed.scaled(4.0, 1.5, ceiling=9.0) == 6.0
    assert speed.scaled(4.0, 20.0, ceiling=9.0) == 9.0
    assert speed.scaled(1.0, 1000.0, ceiling=1000.0) == speed.MAX_FACTOR


def test_a_ceiling_below_the_bound_is_a_mistake_in_the_test() -> None:
    with pytest.raises(ValueError, match=r"ceiling 3 s is below the bound 4\.0 s"):
        speed.scaled(4.0, 1.0, ceiling=3)


def test_the_measurement_is_taken_once_and_is_at_least_one() -> None:
    first = speed.measured()
    assert speed.measured() is first
    assert speed.MAX_FACTOR >= first[0] >= 1.0
    assert first[1] > 0
