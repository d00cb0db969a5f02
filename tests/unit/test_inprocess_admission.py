"""``InProcessOwner``'s admission (the supervisor's rules, in one process), driven with trio."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from sbxkit._lifecycle.admission import Budget, Need
from sbxkit._lifecycle.owner import InProcessAdmission
from sbxkit.errors import NeverFits, SpecError

MiB = 1024**2


async def test_a_request_waits_in_fifo_order_until_memory_is_released() -> None:
    gate = InProcessAdmission(Budget(memory_bytes=100 * MiB), launch_bound=8)
    order: list[str] = []
    await gate.admit("first", Need(64 * MiB, 0))

    async def later(lease: str) -> None:
        await gate.admit(lease, Need(64 * MiB, 0))
        order.append(lease)

    async with trio.open_nursery() as nursery:
        for lease in ("a", "b"):
            nursery.start_soon(later, lease)
            await trio.testing.wait_all_tasks_blocked()
        assert order == []
        assert (gate.queue.ahead("a"), gate.queue.ahead("b")) == (0, 1)
        gate.release("first")
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["a"]
        gate.release("a")
    assert order == ["a", "b"]


async def test_cancelling_a_waiting_request_leaves_the_queue() -> None:
    gate = InProcessAdmission(Budget(memory_bytes=100 * MiB), launch_bound=8)
    await gate.admit("first", Need(64 * MiB, 0))
    with trio.move_on_after(0.05) as scope:
        await gate.admit("impatient", Need(64 * MiB, 0))
    assert scope.cancelled_caught
    assert gate.queue.waiting == 0
    gate.release("first")
    await gate.admit("next", Need(64 * MiB, 0))  # nothing stale blocks the head
    assert gate.queue.is_admitted("next")


async def test_launches_in_flight_are_bounded_until_started() -> None:
    gate = InProcessAdmission(Budget(memory_bytes=None), launch_bound=1)
    await gate.admit("a", Need(MiB, 0))
    admitted = trio.Event()

    async def second() -> None:
        await gate.admit("b", Need(MiB, 0))
        admitted.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert not admitted.is_set()  # memory fits, but the one launch slot is taken
        gate.started("a")
        await admitted.wait()


async def test_a_request_that_never_fits_is_refused_at_once() -> None:
    gate = InProcessAdmission(Budget(memory_bytes=100 * MiB, host_nano_cpus=2 * 10**9), 4)
    with pytest.raises(NeverFits) as caught:
        await gate.admit("big", Need(200 * MiB, 0))
    assert isinstance(caught.value, SpecError)
    assert caught.value.field == "limits.memory_bytes"
    assert gate.queue.waiting == 0
