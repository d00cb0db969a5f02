"""The adaptive in-flight limit of a batch without ``parallel`` (sbxkit/_consumers/pacing.py,
its shell sbxkit/_consumers/paced.py): scripted CPU and throughput only, so nothing here
depends on the load of the machine that runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given

from sbxkit._consumers.harness import JobResult, run_many
from sbxkit._consumers.paced import PARALLEL_CAP, PaceStep, Pacing, default_parallel
from sbxkit._consumers.pacing import (
    HOLD_WINDOWS,
    SATURATED,
    CpuTimes,
    Pacer,
    Window,
    busy_share,
    parse_proc_stat,
)
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit.errors import SpecError
from tests.unit.test_harness import FakeRunner, backend_of, fake_result, jobs_of

Curve = Callable[[int], Window]


def cpu_bound(knee: int, per_job: float = 10.0, contention: float = 0.02) -> Curve:
    """Cores saturated from ``knee`` jobs in flight on; past it throughput only falls a little
    (contention), below it it falls in proportion."""

    def window(limit: int) -> Window:
        throughput = per_job * min(limit, knee) * max(0.1, 1 - contention * max(0, limit - knee))
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
    assert limits[:4] == [8, 16, 32, 64]  # cores about 15 % busy: double (at most) a window
    assert limits == sorted(limits)
    assert limits[-5:] == [PARALLEL_CAP] * 5


def test_a_move_that_cost_throughput_is_undone_and_held() -> None:
    pacer = Pacer(10, floor=1, cap=64)
    assert pacer.observe(Window(busy=0.2, throughput=100.0)) == 20  # idle: up, double at most
    assert pacer.observe(Window(busy=0.2, throughput=80.0)) == 10  # it cost 20 %: back
    for _ in range(HOLD_WINDOWS):  # held, whatever the windows say
        assert pacer.observe(Window(busy=1.0, throughput=1.0)) == 10
    assert pacer.observe(Window(busy=1.0, throughput=1.0)) == 9  # saturated: down again


def test_small_cuts_cannot_slide_the_limit_far_below_where_throughput_was() -> None:
    """Each cut loses 6 %: within the noise of the window before, yet the third is judged
    against the best and goes back to the lowest limit that came within a tenth of it."""
    pacer = Pacer(16, floor=1, cap=64)
    assert pacer.observe(Window(busy=1.0, throughput=100.0)) == 14
    assert pacer.observe(Window(busy=1.0, throughput=94.0)) == 13
    assert pacer.observe(Window(busy=1.0, throughput=88.4)) == 14  # 11.6 % below 100
    for _ in range(HOLD_WINDOWS):
        assert pacer.observe(Window(busy=1.0, throughput=50.0)) == 14  # held, measured afresh


def test_a_loss_at_a_limit_that_did_well_before_is_noise() -> None:
    pacer = Pacer(10, floor=1, cap=64)
    assert pacer.observe(Window(busy=1.0, throughput=100.0)) == 9
    assert pacer.observe(Window(busy=0.85, throughput=95.0)) == 11  # near saturation: a quarter
    assert pacer.observe(Window(busy=1.0, throughput=96.0)) == 10
    assert pacer.observe(Window(busy=1.0, throughput=99.0)) == 9
    # 9 did well before (95): this loss is the windows' noise, and saturated cores lower it.
    assert pacer.observe(Window(busy=1.0, throughput=70.0)) == 8


def test_a_small_loss_is_noise_not_a_reason_to_undo() -> None:
    pacer = Pacer(10, floor=1, cap=64)
    pacer.observe(Window(busy=0.85, throughput=100.0))
    assert pacer.observe(Window(busy=0.85, throughput=91.0)) == 15  # within 10 %: up again


def test_saturated_cores_still_climb_while_more_in_flight_pays() -> None:
    """Jobs that wait on busy cores: each raise still brings more than a tenth over the best
    at any lower limit, so saturation does not stop the climb; once a raise stops paying,
    saturated cores lower the limit again."""
    pacer = Pacer(16, floor=1, cap=64)
    assert pacer.observe(Window(busy=0.85, throughput=100.0)) == 20  # idle: up a quarter
    assert pacer.observe(Window(busy=0.95, throughput=125.0)) == 25  # saturated, paying: up
    assert pacer.observe(Window(busy=0.95, throughput=140.0)) == 31  # 12 % over 125: up
    assert pacer.observe(Window(busy=0.95, throughput=145.0)) == 28  # 3.6 %: no longer pays


@pytest.mark.parametrize(
    ("busy", "after"),
    [(0.0, 32), (0.3, 32), (0.45, 32), (0.6, 24), (0.8, 20), (0.85, 20), (0.89, 20)],
)
def test_idle_cores_raise_toward_where_they_would_saturate(busy: float, after: int) -> None:
    """From 16: the limit times 0.9 over the busy share, at least a quarter more and at most
    double (0.6 busy: 24 would read 0.9)."""
    assert Pacer(16, cap=64).observe(Window(busy=busy, throughput=1.0)) == after


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


class ScriptedCpu:
    """Cumulative CPU times whose k-th window (between reading k and k+1) has the busy share
    ``shares[k]`` (the last one repeats)."""

    def __init__(self, shares: list[float]) -> None:
        self.shares = shares
        self.readings = 0
        self.busy = 0.0

    def __call__(self) -> CpuTimes:
        if self.readings:
            index = min(self.readings - 1, len(self.shares) - 1)
            self.busy += self.shares[index] * 100
        self.readings += 1
        return CpuTimes(busy=self.busy, total=100.0 * (self.readings - 1))


class SimHost:
    """A backend on a mock host of ``cores`` cores: a job waits ``wait_s`` and computes
    ``cpu_s``. With ``n`` in flight the cores share out: a job takes at least
    ``n * cpu_s / cores``, and 1 % longer per job in flight (contention), so throughput is
    bounded by ``cores / cpu_s`` and the cores saturate from ``cores * (wait_s + cpu_s) /
    cpu_s`` in flight on (the knee). Durations vary by a fixed cycle so the jobs do not move in
    lockstep. ``cpu`` reads the host's cumulative busy time, as ``/proc/stat`` would."""

    kind = "sim"
    CYCLE = (0.7, 1.3, 0.9, 1.1, 0.8, 1.2)

    def __init__(self, cores: int, cpu_s: float, wait_s: float) -> None:
        self.cores = cores
        self.cpu_s = cpu_s
        self.wait_s = wait_s
        self.active = 0
        self.peak = 0
        self.runs = 0
        self.busy = 0.0
        self.began: float | None = None
        self.last = 0.0

    def knee(self) -> float:
        return self.cores * (self.wait_s + self.cpu_s) / self.cpu_s

    def _duration(self, in_flight: int) -> float:
        shared = max(self.wait_s + self.cpu_s, in_flight * self.cpu_s / self.cores)
        return shared * (1 + 0.01 * in_flight)

    def _busy_share(self) -> float:
        if not self.active:
            return 0.0
        cpu_rate = self.active * self.cpu_s / self._duration(self.active)
        return min(1.0, cpu_rate / self.cores)

    def _advance(self) -> None:
        now = trio.current_time()
        if self.began is None:
            self.began = self.last = now
        self.busy += self._busy_share() * (now - self.last)
        self.last = now

    def cpu(self) -> CpuTimes:
        self._advance()
        assert self.began is not None
        return CpuTimes(busy=self.busy, total=self.last - self.began)

    async def run_once(self, spec: SandboxSpec, stdin: bytes | None = None, **_: Any) -> RunResult:
        self._advance()
        self.active += 1
        self.peak = max(self.peak, self.active)
        factor = self.CYCLE[self.runs % len(self.CYCLE)]
        self.runs += 1
        try:
            await trio.sleep(factor * self._duration(self.active))
        finally:
            self._advance()
            self.active -= 1
        return fake_result("sim")


def limit_at(steps: list[PaceStep], start: int, when: float) -> int:
    limit = start
    for step in steps:
        if step.at <= when:
            limit = step.after
    return limit


def replay(start: int, floor: int, cap: int, steps: list[PaceStep]) -> list[int]:
    """What the pure rule says for the windows the batch measured."""
    pacer = Pacer(start, floor=floor, cap=cap)
    return [pacer.observe(step.window) for step in steps]


def assert_never_above_the_limit(
    results: list[JobResult], steps: list[PaceStep], start: int
) -> None:
    """Each job started while fewer than the limit then in force were in flight."""
    for job in results:
        in_flight = sum(
            1 for other in results if other.started_at <= job.started_at < other.finished_at
        )
        assert in_flight <= limit_at(steps, start, job.started_at), job.id


async def test_a_batch_of_waiting_jobs_on_idle_cores_climbs_to_the_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = SimHost(cores=2, cpu_s=0.01, wait_s=1.0)
    steps: list[PaceStep] = []
    pacing = Pacing(cpu=host.cpu, on_window=steps.append, start=8, floor=2, cap=PARALLEL_CAP)
    results = await run_many(jobs_of(1000), backend=backend_of(host), pacing=pacing)
    assert all(r.ok for r in results)
    limits = [s.after for s in steps]
    assert limits[:3] == [16, 32, 64]  # idle cores: double (at most) a window
    assert limits == sorted(limits)
    assert limits[-1] == PARALLEL_CAP
    assert host.peak == PARALLEL_CAP
    assert limits == replay(8, 2, PARALLEL_CAP, steps)
    assert_never_above_the_limit(results, steps, 8)


async def wall_time(host: SimHost, jobs: int, parallel: int | None, pacing: Pacing) -> float:
    begun = trio.current_time()
    if parallel is None:
        await run_many(jobs_of(jobs), backend=backend_of(host), pacing=pacing)
    else:
        await run_many(jobs_of(jobs), backend=backend_of(host), parallel=parallel)
    return trio.current_time() - begun


@pytest.mark.parametrize("wait_s", [0.05, 0.3])
async def test_a_cpu_bound_batch_settles_near_where_it_saturates_the_cores(
    autojump_clock: trio.testing.MockClock, wait_s: float
) -> None:
    """Jobs of 75 ms of CPU on 2 cores (HumanEval's, roughly), waiting 50 or 300 ms besides:
    the cores saturate from 3.3 or 10 in flight on. The adaptive batch settles about there
    and takes within a tenth of the best fixed limit's wall time."""
    host = SimHost(cores=2, cpu_s=0.075, wait_s=wait_s)
    steps: list[PaceStep] = []
    pacing = Pacing(cpu=host.cpu, on_window=steps.append, start=8, floor=2, cap=PARALLEL_CAP)
    adaptive = await wall_time(host, 600, None, pacing)
    settled = sorted(s.after for s in steps[-20:])
    assert len(steps) >= 40
    assert host.knee() * 0.6 <= settled[10] <= host.knee() * 1.5, settled
    assert [s.after for s in steps] == replay(8, 2, PARALLEL_CAP, steps)
    fixed = {
        parallel: await wall_time(SimHost(2, 0.075, wait_s), 600, parallel, pacing)
        for parallel in (2, 4, 8, 12, 16, 32)
    }
    assert adaptive <= 1.1 * min(fixed.values()), (adaptive, fixed)


@pytest.mark.parametrize("climbs", [False, True])
async def test_the_limit_follows_a_scripted_cpu(
    autojump_clock: trio.testing.MockClock, climbs: bool
) -> None:
    """Two idle windows, then saturated cores for good: up twice, then down where more in
    flight no longer pays (jobs of 75 ms of CPU: a cut may be undone and held, but within five
    windows one stands); on up where it still does (jobs of 10 ms that wait 1 s: throughput
    rises with every raise, whatever the busy share says)."""
    host = SimHost(cores=2, cpu_s=0.01, wait_s=1.0) if climbs else SimHost(2, 0.075, 0.05)
    steps: list[PaceStep] = []
    script = ScriptedCpu([0.2, 0.2, 1.0])
    pacing = Pacing(cpu=script, on_window=steps.append, start=8, floor=2, cap=PARALLEL_CAP)
    results = await run_many(jobs_of(300), backend=backend_of(host), pacing=pacing)
    limits = [s.after for s in steps]
    assert limits[:2] == [16, 32]  # busy 0.2: double (at most) a window
    if climbs:
        assert limits[2] > limits[1], limits  # saturated, yet paying: up
    else:
        assert min(limits[2 : 2 + HOLD_WINDOWS + 2]) < 32, limits
    assert [s.window.busy for s in steps][:4] == [0.2, 0.2, 1.0, 1.0]
    assert limits == replay(8, 2, PARALLEL_CAP, steps)
    assert_never_above_the_limit(results, steps, 8)


async def test_the_tail_of_a_batch_is_not_judged(autojump_clock: trio.testing.MockClock) -> None:
    """Once every job has started, throughput falls as the batch drains: not the limit's
    doing, so no window is judged then."""
    fake = FakeRunner(seconds=1.0)
    steps: list[PaceStep] = []
    pacing = Pacing(cpu=ScriptedCpu([0.1]), on_window=steps.append, start=8, floor=2, cap=64)
    results = await run_many(jobs_of(40), backend=backend_of(fake), pacing=pacing)
    last_start = max(r.started_at for r in results)
    assert steps
    assert all(step.at <= last_start for step in steps)


async def test_without_a_script_the_limit_starts_at_the_cores_worth() -> None:
    pacer = Pacing().pacer()
    assert pacer.limit == default_parallel()
    assert pacer.adaptive
    assert pacer.cap == PARALLEL_CAP


@pytest.mark.parametrize(
    ("pacing", "field"),
    [
        (Pacing(start=0), "pacing.start"),
        (Pacing(floor=True), "pacing.floor"),  # type: ignore[arg-type]
        (Pacing(cap=2.5), "pacing.cap"),  # type: ignore[arg-type]
        (Pacing(floor=9, cap=8), "pacing.floor"),
    ],
)
async def test_bad_pacing_is_refused_before_anything_runs(pacing: Pacing, field: str) -> None:
    fake = FakeRunner()
    with pytest.raises(SpecError) as refused:
        await run_many(jobs_of(3), backend=backend_of(fake), pacing=pacing)
    assert refused.value.field == field
    assert fake.peak == 0


async def test_pacing_beside_an_explicit_parallel_is_refused() -> None:
    fake = FakeRunner()
    with pytest.raises(SpecError, match="pacing: adapts a batch without parallel"):
        await run_many(jobs_of(3), parallel=2, backend=backend_of(fake), pacing=Pacing())
    assert fake.peak == 0


async def test_an_exception_from_on_window_stops_the_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeRunner(seconds=1.0)

    def refuse(step: PaceStep) -> None:
        raise RuntimeError("stop")

    pacing = Pacing(cpu=ScriptedCpu([0.1]), on_window=refuse, start=4, floor=1, cap=8)
    with pytest.raises(RuntimeError, match="stop"):
        await run_many(jobs_of(40), backend=backend_of(fake), pacing=pacing)
    assert fake.active == 0
