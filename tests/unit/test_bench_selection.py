"""``--order`` reorders a bench's contenders, ``--only`` runs just the named ones: a decision run
of one ratio (``bench pool --only cold,raw``) need not spend its time on the rest. ``--shuffle``
draws each round's order afresh, so no contender always follows the same one (``bench pool``'s
default; ``--fixed-order`` keeps one)."""

from __future__ import annotations

import argparse
import itertools

import pytest
import trio

from bench.common import order_contenders
from bench.harness import Contender, StepTimings, run_interleaved
from bench.pool import DEFAULT_SHUFFLE_SEED, add_arguments


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


def recording(ran: list[str]) -> list[Contender]:
    def contender(key: str) -> Contender:
        async def once() -> StepTimings:
            ran.append(key)
            return {}

        return Contender(key, key, key, once)

    return [contender(k) for k in KEYS]


def rounds_run(shuffle: int | None, rounds: int = 400) -> list[tuple[str, ...]]:
    ran: list[str] = []
    trio.run(lambda: run_interleaved(recording(ran), rounds=rounds, warmup=0, shuffle=shuffle))
    return [tuple(ran[i : i + len(KEYS)]) for i in range(0, len(ran), len(KEYS))]


def test_without_shuffle_every_round_runs_in_the_given_order() -> None:
    assert set(rounds_run(None, 20)) == {tuple(KEYS)}


def test_shuffled_rounds_each_run_every_contender_once_and_vary_their_predecessors() -> None:
    rounds = rounds_run(7)
    assert all(sorted(order) == sorted(KEYS) for order in rounds)
    assert rounds == rounds_run(7)  # the seed decides: a run can be repeated
    assert rounds != rounds_run(8)
    # Within a round, how often each contender ran right after each other one: all 12 ordered
    # pairs of 4, each near the 100 that uniform draws give (3 neighbours a round, 400 rounds,
    # 12 pairs); a fixed order gives 3 pairs, 400 times each.
    follows = {pair: 0 for pair in itertools.permutations(KEYS, 2)}
    for order in rounds:
        for before, after in itertools.pairwise(order):
            follows[before, after] += 1
    assert min(follows.values()) > 60, follows
    assert max(follows.values()) < 140, follows


def test_bench_pool_shuffles_its_rounds_unless_told_to_keep_one_order() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    assert parser.parse_args([]).shuffle == DEFAULT_SHUFFLE_SEED
    assert parser.parse_args(["--shuffle", "5"]).shuffle == 5
    assert parser.parse_args(["--fixed-order"]).shuffle is None
