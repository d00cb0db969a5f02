"""The adaptive in-flight limit's rule (sbxkit/_consumers/pacing.py, pure): scripted CPU and
throughput only, so nothing here depends on the load of the machine that runs it."""

from __future__ import annotations

from collections.abc import Callable

import hypothesis.strategies as st
import pytest
from hypothesis import given

from sbxkit._consumers.pacing import (
    HOLD_WINDOWS,
    SATURATED,
    CpuTimes,
    Pacer,
    Window,
    busy_share,
    parse_proc_stat,
)

PARALLEL_CAP = 64

Curve = Callable[[int], Window]


def cpu_bound(knee: int, per_job: float = 10.0, contention: float = 0.02) -> Curve:
    """Cores saturated from ``knee`` jobs in flight on; past it throughput only falls a little
    (contention), below it it falls in proportion."""

    def window(limit: int) -> Window:
        throughput = per_job * min(limit, knee) * (1 - contention * max(0, limit - knee))
        return Window(busy=min(1.0, limit / knee), throughput=throughput)

    return window


def io_bound(limit: int) -> Window:
    """Jobs that wait: throughput in proportion to what is in flight, cores mostly idle."""
    return Window(busy=0.1 + 0.2 * limit / PARALLEL_CAP, throughput=5.0 * limit)


def climb(pacer: Pacer, curve: Curve, windows: int) -> list[int]:
    limits = []
    for _ in range(windows):
        limits.append(pacer.limit)
        pacer.observe(curve(pacer.limit))
    return limits


@pytest.mark.parametrize("knee", [2, 3, 4, 6, 12, 20, 40])
@pytest.mark.parametrize("start", [1, 8, 64])
def test_a_cpu_bound_batch_settles_near_the_knee_of_its_curve(knee: int, start: int) -> None:
    limits = climb(Pacer(start, floor=2, cap=PARALLEL_CAP), cpu_bound(knee), 60)
    settled = limits[-20:]
    # Within the rule's resolution: a tenth of throughput (TOLERANCE), one step either side.
    assert min(settled) >= max(2, int(knee * 0.8) - 1), limits
    assert max(settled) <= knee + max(1, knee // 4), limits


def test_on_saturated_cores_the_limit_falls_from_the_default_to_the_knee() -> None:
    limits = climb(Pacer(8, floor=2, cap=PARALLEL_CAP), cpu_bound(3), 12)
    assert limits[:6] == [8, 7, 6, 5, 4, 3]  # an eighth (at least one) per saturated window
    assert set(limits[6:]) <= {2, 3}


def test_an_io_bound_batch_climbs_to_the_cap_and_stays() -> None:
    limits = climb(Pacer(8, floor=2, cap=PARALLEL_CAP), io_bound, 20)
    assert limits[:5] == [8, 10, 12, 15, 18]  # a quarter (at least one) per idle window
    assert limits == sorted(limits)
    assert limits[-5:] == [PARALLEL_CAP] * 5


def test_a_move_that_cost_throughput_is_undone_and_held() -> None:
    pacer = Pacer(10, floor=1, cap=64)
    assert pacer.observe(Window(busy=0.2, throughput=100.0)) == 12  # idle: up
    assert pacer.observe(Window(busy=0.2, throughput=80.0)) == 10  # it cost 20 %: back
    for _ in range(HOLD_WINDOWS):  # held, whatever the windows say
        assert pacer.observe(Window(busy=1.0, throughput=1.0)) == 10
    assert pacer.observe(Window(busy=1.0, throughput=1.0)) == 9  # saturated: down again


def test_a_small_loss_is_noise_not_a_reason_to_undo() -> None:
    pacer = Pacer(10, floor=1, cap=64)
    pacer.observe(Window(busy=0.2, throughput=100.0))
    assert pacer.observe(Window(busy=0.2, throughput=91.0)) == 15  # within 10 %: up again


def test_saturation_is_a_busy_share_at_or_above_the_threshold() -> None:
    assert Pacer(16, cap=64).observe(Window(busy=SATURATED, throughput=1.0)) == 14
    assert Pacer(16, cap=64).observe(Window(busy=SATURATED - 0.01, throughput=1.0)) == 20


windows = st.lists(
    st.builds(
        Window,
        busy=st.floats(0.0, 1.0),
        throughput=st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False),
    ),
    max_size=60,
)


@given(start=st.integers(-5, 200), floor=st.integers(1, 70), span=st.integers(0, 70), seen=windows)
def test_the_limit_never_leaves_floor_and_cap(
    start: int, floor: int, span: int, seen: list[Window]
) -> None:
    pacer = Pacer(start, floor=floor, cap=floor + span)
    assert floor <= pacer.limit <= floor + span
    for window in seen:
        assert floor <= pacer.observe(window) <= floor + span


@given(parallel=st.integers(1, 500), seen=windows)
def test_an_explicit_parallel_never_moves(parallel: int, seen: list[Window]) -> None:
    pacer = Pacer.fixed(parallel)
    for window in seen:
        assert pacer.observe(window) == parallel
    assert not pacer.window_due(10**6, 10**6)


def test_a_bad_floor_or_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="floor <= cap"):
        Pacer(8, floor=9, cap=8)
    with pytest.raises(ValueError, match="floor <= cap"):
        Pacer(8, floor=0, cap=8)


def test_a_window_is_the_limits_worth_of_jobs_and_long_enough_to_count_cpu_ticks() -> None:
    pacer = Pacer(20, cap=64)
    assert not pacer.window_due(19, 5.0)
    assert pacer.window_due(20, 5.0)
    assert not pacer.window_due(20, 0.1)  # /proc/stat counts 10 ms ticks
    assert Pacer(2, cap=64).window_due(8, 1.0)
    assert not Pacer(2, cap=64).window_due(7, 1.0)  # at least 8 jobs, however small the limit


PROC_STAT = """cpu  4705 356 584 3699 23 0 5 7 11 0
cpu0 1393 280 283 1800 10 0 2 3 5 0
intr 114930548 113199788 3 0 5 263 0 4 [... 20 more ...]
"""


def test_proc_stat_busy_is_everything_but_idle_and_iowait() -> None:
    times = parse_proc_stat(PROC_STAT)
    total = 4705 + 356 + 584 + 3699 + 23 + 0 + 5 + 7  # guest time is within user already
    assert times == CpuTimes(busy=total - 3699 - 23, total=total)
    with pytest.raises(ValueError, match="no cpu line"):
        parse_proc_stat("intr 1 2 3\n")


def test_the_busy_share_between_two_readings() -> None:
    assert busy_share(CpuTimes(10, 100), CpuTimes(60, 200)) == 0.5
    assert busy_share(CpuTimes(10, 100), CpuTimes(10, 100)) == 0.0  # no time: idle
    assert busy_share(CpuTimes(0, 0), CpuTimes(500, 400)) == 1.0  # clamped
