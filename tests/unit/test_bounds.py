"""``SBXKIT_HOST_SLOWNESS``: what it accepts, the rule a bad value is refused by, and the bounds
it stretches (sbxkit/_model/bounds.py; the engine's side: tests/engine/test_host_slowness.py)."""

from __future__ import annotations

import pytest

from sbxkit._lifecycle.connect import launch_timeout_s, reply_timeout_s
from sbxkit._model.bounds import (
    LAUNCH_TIMEOUT_S,
    REPLY_TIMEOUT_S,
    SLOWNESS_ENV,
    parse_slowness,
    scaled,
)
from sbxkit._util.slowness import slowness_factor
from sbxkit.errors import SpecError


@pytest.mark.parametrize(
    ("raw", "factor"),
    [(None, 1.0), ("", 1.0), ("  ", 1.0), ("1", 1.0), ("2.5", 2.5), (" 20 ", 20.0), ("100", 100.0)],
)
def test_a_slowness_from_1_to_100_is_taken_and_unset_is_1(raw: str | None, factor: float) -> None:
    assert parse_slowness(raw) == factor
    assert slowness_factor(raw) == factor  # what the hand-off client reads without sbxkit.errors


@pytest.mark.parametrize("raw", ["fast", "0.99", "0", "-2", "100.5", "1e9", "inf", "nan", "2x"])
def test_anything_else_is_refused_naming_what_was_typed_and_the_rule(raw: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_slowness(raw)
    assert refused.value.field == SLOWNESS_ENV
    assert refused.value.rule.startswith("must be a number from 1 to 100")
    assert refused.value.rule.endswith(f"got {raw!r}")
    assert str(refused.value).startswith("SBXKIT_HOST_SLOWNESS: ")
    assert slowness_factor(raw) is None  # the hand-off declines it and the full path names it


def test_the_caller_s_bounds_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLOWNESS_ENV, raising=False)
    assert (launch_timeout_s(), reply_timeout_s()) == (LAUNCH_TIMEOUT_S, REPLY_TIMEOUT_S)
    monkeypatch.setenv(SLOWNESS_ENV, "4")
    assert (launch_timeout_s(), reply_timeout_s()) == (4 * LAUNCH_TIMEOUT_S, 4 * REPLY_TIMEOUT_S)
    monkeypatch.setenv(SLOWNESS_ENV, "slow")
    with pytest.raises(SpecError, match="got 'slow'"):
        launch_timeout_s()
    assert scaled(5.0, "3") == 15.0
