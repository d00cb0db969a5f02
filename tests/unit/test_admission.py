"""The supervisor's admission queue (pure): FIFO, budgets, never-fits, headroom."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._lifecycle.admission import (
    AdmissionQueue,
    Budget,
    GiB,
    Need,
    default_memory_budget,
    memory_headroom,
    never_fits,
)
from sbxkit.supervisor.config import Capacity, launch_bound

MiB = 1024**2


def test_a_request_that_fits_is_admitted_at_once() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(Budget(memory_bytes=256 * MiB))
    queue.enqueue("a", Need(128 * MiB, 10**9))
    assert queue.admit_ready() == ["a"]
    assert (queue.memory_in_use, queue.running, queue.waiting) == (128 * MiB, 1, 0)


def test_the_head_is_never_overtaken_by_a_smaller_request() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(Budget(memory_bytes=256 * MiB))
    queue.enqueue("big-running", Need(200 * MiB, 0))
    assert queue.admit_ready() == ["big-running"]
    queue.enqueue("head", Need(100 * MiB, 0))
    queue.enqueue("small", Need(10 * MiB, 0))  # would fit now, but must not jump the queue
    assert queue.admit_ready() == []
    assert (queue.ahead("head"), queue.ahead("small")) == (0, 1)
    queue.release("big-running")
    assert queue.admit_ready() == ["head", "small"]


def test_cpu_quotas_do_not_limit_admission_without_a_cpu_budget() -> None:
    queue: AdmissionQueue[int] = AdmissionQueue(Budget(memory_bytes=GiB, host_nano_cpus=2 * 10**9))
    for i in range(8):
        queue.enqueue(i, Need(64 * MiB, 10**9))  # eight 1-CPU sandboxes on a 2-CPU host
    assert queue.admit_ready() == list(range(8))


def test_an_operator_cpu_budget_limits_admission() -> None:
    queue: AdmissionQueue[int] = AdmissionQueue(Budget(memory_bytes=GiB, nano_cpus=2 * 10**9))
    for i in range(3):
        queue.enqueue(i, Need(MiB, 10**9))
    assert queue.admit_ready() == [0, 1]


def test_max_running_counts_live_sandboxes_only() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(Budget(memory_bytes=None, max_running=1))
    queue.hold("recovered", Need(MiB, 0))  # an orphan record: memory held, not running
    queue.enqueue("a", Need(MiB, 0))
    queue.enqueue("b", Need(MiB, 0))
    assert queue.admit_ready() == ["a"]
    queue.stop_running("a")  # became an orphan: its slot among the running is free
    assert queue.admit_ready() == ["b"]
    assert queue.memory_in_use == 3 * MiB


def test_withdrawing_a_waiting_request_lets_the_next_one_move_up() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(Budget(memory_bytes=MiB))
    queue.hold("x", Need(MiB, 0), running=True)
    for key in ("a", "b", "c"):
        queue.enqueue(key, Need(MiB, 0))
    assert queue.withdraw("b")
    assert not queue.withdraw("b")
    assert queue.ahead("c") == 1
    queue.release("x")
    assert queue.admit_ready() == ["a"]


def test_keys_are_unique() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(Budget(memory_bytes=None))
    queue.enqueue("a", Need(1, 0))
    with pytest.raises(ValueError, match="already queued"):
        queue.enqueue("a", Need(1, 0))


def test_never_fits_names_the_field_the_flag_the_value_and_the_budget() -> None:
    budget = Budget(memory_bytes=100 * MiB, host_nano_cpus=2 * 10**9)
    memory = never_fits(Need(200 * MiB, 10**9), budget)
    assert memory is not None
    assert memory.field == "limits.memory_bytes"
    assert memory.rule.startswith("--memory 200 MiB asked, more than the whole memory budget")
    assert "100 MiB" in memory.rule
    cpus = never_fits(Need(MiB, 3 * 10**9), budget)
    assert cpus is not None
    assert cpus.field == "limits.cpus"
    assert "--cpus 3 asked, more than the daemon's 2 CPUs" in cpus.rule
    operator = never_fits(Need(MiB, 10**9), Budget(memory_bytes=None, nano_cpus=5 * 10**8))
    assert operator is not None
    assert "CPU budget of 0.5" in operator.rule
    assert never_fits(Need(100 * MiB, 2 * 10**9), budget) is None  # exactly the budget fits


@pytest.mark.parametrize(
    ("mem_total", "headroom"),
    [(24 * GiB, 24 * GiB // 10), (4 * GiB, GiB), (GiB, GiB // 2), (512 * MiB, 256 * MiB)],
)
def test_the_host_keeps_a_headroom(mem_total: int, headroom: int) -> None:
    assert memory_headroom(mem_total) == headroom
    assert default_memory_budget(mem_total) == mem_total - headroom


def test_the_launch_bound_follows_the_daemons_cpus_unless_set() -> None:
    assert launch_bound(Capacity(), 2) == 4
    assert launch_bound(Capacity(), 1) == 2
    assert launch_bound(Capacity(max_launching=3), 16) == 3


needs = st.builds(Need, st.integers(0, 10 * MiB), st.integers(0, 4 * 10**9))


@given(
    st.lists(st.tuples(st.sampled_from(["enqueue", "release", "withdraw"]), needs), max_size=60),
    st.integers(MiB, 20 * MiB),
    st.none() | st.integers(10**9, 8 * 10**9),
    st.none() | st.integers(1, 6),
)
def test_admission_never_exceeds_a_budget_and_admits_in_arrival_order(
    steps: list[tuple[str, Need]], memory: int, cpus: int | None, running: int | None
) -> None:
    queue: AdmissionQueue[int] = AdmissionQueue(
        Budget(memory_bytes=memory, nano_cpus=cpus, max_running=running)
    )
    arrived: list[int] = []
    admitted: list[int] = []
    for index, (action, need) in enumerate(steps):
        if action == "enqueue":
            queue.enqueue(index, need)
            arrived.append(index)
        elif action == "release" and admitted:
            queue.release(admitted[len(admitted) // 2])
        elif action == "withdraw" and queue.waiting:
            waiting = [k for k in arrived if queue.is_waiting(k)]
            queue.withdraw(waiting[-1])
            arrived.remove(waiting[-1])
        admitted += queue.admit_ready()
        assert queue.memory_in_use <= memory
        assert cpus is None or queue.nano_cpus_in_use <= cpus
        assert running is None or queue.running <= running
    # Admissions happen in arrival order, whatever the sizes (a withdrawn one never is).
    assert admitted == [k for k in arrived if k in set(admitted)]
