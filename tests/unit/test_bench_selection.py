"""``--order`` reorders a bench's contenders, ``--only`` runs just the named ones: a decision run
of one ratio (``bench pool --only cold,raw``) need not spend its time on the rest."""

from __future__ import annotations

import pytest

from bench.common import order_contenders
from bench.harness import Contender, StepTimings


def contender(key: str) -> Contender:
    async def once() -> StepTimings:
        return {}

    return Contender(key, key, key, once)


KEYS = ["pooled", "held", "cold", "raw"]


def keys(chosen: list[Contender]) -> list[str]:
    return [c.key for c in chosen]


def test_order_puts_the_named_first_and_keeps_the_rest_after() -> None:
    chosen = order_contenders([contender(k) for k in KEYS], "cold,raw", "pool")

    assert keys(chosen) == ["cold", "raw", "pooled", "held"]


def test_only_runs_the_named_alone_in_the_given_order() -> None:
    chosen = order_contenders([contender(k) for k in KEYS], None, "pool", only="raw,cold")

    assert keys(chosen) == ["raw", "cold"]


def test_only_decides_over_order() -> None:
    chosen = order_contenders([contender(k) for k in KEYS], "held", "pool", only="cold")

    assert keys(chosen) == ["cold"]


def test_an_unknown_key_is_refused_naming_the_flag() -> None:
    with pytest.raises(SystemExit, match=r"--only names unknown contenders \['warm'\]"):
        order_contenders([contender(k) for k in KEYS], None, "pool", only="cold,warm")
    with pytest.raises(SystemExit, match=r"--order names unknown contenders \['warm'\]"):
        order_contenders([contender(k) for k in KEYS], "warm", "pool")
