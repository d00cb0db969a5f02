"""Caller cancellation at every await point of the one-shot lifecycle on the kernel path
(sbxkit/kernel: FIFOs and the init's pidfd), then proof nothing leaked — the table of
test_cancellation.py, whose engine hooks and witness checks this reuses, with the kernel path's
own points: no attach and no wait; after the start the init's pid is read
(``container_inspect#2``, on a daemon whose cgroup layout is not known yet: see
``every_run_asks_the_daemon``; ``#1`` with the supervisor as owner, as in that table), the
shell's word awaited (``kernel.alive``) and the exit (``kernel.exited``).

==============================  ==========  ==============================================
point                           phase       ends in
==============================  ==========  ==============================================
image_inspect … container_inspect#1         as on the daemon's path: removed, never started
container_start#1               before      Cancelled; removed, never started
container_start#1               after       Cancelled; started (the payload waits for its
container_inspect#2 / alive     both        go line: it never ran), then removed
kernel.exited#1                 before      (alive() watching for the shell's death) the same
kernel.exited#2                 before      Cancelled; the payload ran, then removed
--- reached only by a payload that exits (``true``) ---
kernel.exited#2                 after       Cancelled (the drain wait is a checkpoint)
owner.release#1                 before      Cancelled (closing the session is a checkpoint);
                                            the supervisor has the Close: it removes
owner.release#1                 after       returns normally (the supervisor removes)
container_remove#1 / owner.remove#1 both    returns normally (shielded removal, last await)
==============================  ==========  ==============================================

With the supervisor as owner a run's container is started by the supervisor itself once it
verified it (``launched``, the default): no ``container_start`` of the caller's, and

==============================  ==========  ==============================================
image_inspect#1, owner.create#1 before      Cancelled; nothing created
owner.create#1                  after       Cancelled; started by the supervisor (the payload
owner.said_or_launched#1 …      both        waits for its go line: it never ran), then
… kernel.alive#1                            removed — the removal waits for the start's answer
==============================  ==========  ==============================================

and from ``kernel.exited#2`` on as with the supervisor above. ``supervised`` keeps the table
above for a supervised run whose caller starts its container (a governed network's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sbxkit._kernel.init import ContainerInit
from sbxkit._lifecycle.kernel_watch import KernelIO
from tests.engine import test_cancellation as daemon
from tests.engine.test_cancellation import (
    CancellingEngine,
    OwnerKind,
    Point,
    assert_gone_and_started,
    cancelling_engine,
    ended_before_create,
    every_run_asks_the_daemon,  # noqa: F401 - an autouse fixture, for this module too
    expect_outcome,
    make_spec,
    run_with_cancel,
    supervised,
)
from tests.witness import Witness

PRE_START: list[Point] = [
    ("image_inspect#1", "before"),
    ("image_inspect#1", "after"),
    ("container_create#1", "before"),
    ("container_create#1", "after"),
    ("container_inspect#1", "before"),
    ("container_inspect#1", "after"),
    ("container_start#1", "before"),
]
STARTED_NOT_RUN: list[Point] = [
    ("container_start#1", "after"),
    ("container_inspect#2", "before"),
    ("container_inspect#2", "after"),
    ("kernel.alive#1", "before"),
    ("kernel.exited#1", "before"),  # alive() watches for the shell's death meanwhile
    ("kernel.alive#1", "after"),
]
RUNNING: list[Point] = [("kernel.exited#2", "before")]
SLOW_POINTS = PRE_START + STARTED_NOT_RUN + RUNNING
EXIT_POINTS: list[Point] = [
    ("kernel.exited#2", "after"),
    ("container_remove#1", "before"),
    ("container_remove#1", "after"),
]
SUPERVISED_EXIT_POINTS: list[Point] = [
    ("kernel.exited#2", "after"),
    ("owner.release#1", "before"),
    ("owner.release#1", "after"),
    ("owner.remove#1", "before"),
    ("owner.remove#1", "after"),
]
# The default supervised run: the supervisor starts the container once verified (launched),
# and the caller waits for its shell's word or the daemon's answer, whichever comes first;
# the init is held once the daemon answered (this table's daemons never have a known
# cgroup layout: ``owner.launch_answer`` then ``container_inspect#1`` for State.Pid).
LAUNCHED_PRE_START: list[Point] = [
    ("image_inspect#1", "before"),
    ("image_inspect#1", "after"),
    ("owner.create#1", "before"),
]
LAUNCHED_STARTED_NOT_RUN: list[Point] = [
    ("owner.create#1", "after"),  # started by the supervisor: the payload waits for its go
    ("owner.said_or_launched#1", "before"),
    ("owner.said_or_launched#1", "after"),
    ("owner.launch_answer#1", "before"),
    ("owner.launch_answer#1", "after"),
    ("container_inspect#1", "before"),
    ("container_inspect#1", "after"),
    ("kernel.alive#1", "before"),
    ("kernel.exited#1", "before"),
    ("kernel.alive#1", "after"),
]
LAUNCHED_SLOW_POINTS = LAUNCHED_PRE_START + LAUNCHED_STARTED_NOT_RUN + RUNNING
RETURNS_NORMALLY: set[Point] = {
    ("container_remove#1", "before"),
    ("container_remove#1", "after"),
    ("owner.release#1", "after"),
    ("owner.remove#1", "before"),
    ("owner.remove#1", "after"),
}


@pytest.fixture
def hooked(monkeypatch: pytest.MonkeyPatch) -> list[CancellingEngine]:
    """Hooks around the kernel path's own awaits, reported to the test's engine; and the
    supervised owner's release."""
    current: list[CancellingEngine] = []

    def around(name: str, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def hooked_call(*args: Any, **kwargs: Any) -> Any:
            engine = current[0]
            point = engine.numbered(name)
            engine.hook(point, "before")
            value = await call(*args, **kwargs)
            engine.hook(point, "after")
            return value

        return hooked_call

    monkeypatch.setattr(KernelIO, "alive", around("kernel.alive", KernelIO.alive))
    monkeypatch.setattr(ContainerInit, "exited", around("kernel.exited", ContainerInit.exited))
    release = daemon.HookedOwner.release
    monkeypatch.setattr(daemon.HookedOwner, "release", around("owner.release", release))
    monkeypatch.setattr(daemon, "RETURNS_NORMALLY", RETURNS_NORMALLY)
    return current


async def check_kernel_point(
    hooked: list[CancellingEngine],
    witness: Witness,
    busybox: str,
    command: list[str],
    point: Point,
    owner: OwnerKind,
) -> None:
    since = daemon.time.time()
    async with cancelling_engine(witness.socket_path) as engine:
        hooked[:] = [engine]
        outcome = await run_with_cancel(engine, make_spec(busybox, command), point, owner=owner)
        assert engine.fired, f"{point} was never reached; calls: {engine.log}"
        expect_outcome(point, outcome, owner)
        if ended_before_create(witness, engine, since, point, owner):
            return
        not_started = {
            "in-process": PRE_START,
            "supervised": supervised(PRE_START),
            "launched": LAUNCHED_PRE_START,
        }[owner]
        started = point not in not_started
        await daemon.trio.to_thread.run_sync(witness.wait_until_no_sbxkit_containers, 10.0)
        assert_gone_and_started(witness, engine, since, started=started)


@pytest.mark.parametrize("point", SLOW_POINTS, ids=daemon.point_id)
async def test_cancel_long_running_payload_on_the_kernel_path(
    hooked: list[CancellingEngine], witness: Witness, busybox: str, point: Point
) -> None:
    await check_kernel_point(
        hooked, witness, busybox, ["sh", "-c", "sleep 30"], point, "in-process"
    )


@pytest.mark.parametrize("point", SLOW_POINTS + EXIT_POINTS, ids=daemon.point_id)
async def test_cancel_exiting_payload_on_the_kernel_path(
    hooked: list[CancellingEngine], witness: Witness, busybox: str, point: Point
) -> None:
    await check_kernel_point(hooked, witness, busybox, ["true"], point, "in-process")


@pytest.mark.parametrize(
    "point", supervised(SLOW_POINTS) + SUPERVISED_EXIT_POINTS, ids=daemon.point_id
)
async def test_cancel_exiting_payload_supervised_on_the_kernel_path(
    hooked: list[CancellingEngine], witness: Witness, busybox: str, point: Point
) -> None:
    await check_kernel_point(hooked, witness, busybox, ["true"], point, "supervised")


@pytest.mark.parametrize(
    "point", LAUNCHED_SLOW_POINTS + SUPERVISED_EXIT_POINTS, ids=daemon.point_id
)
async def test_cancel_exiting_payload_launched_on_the_kernel_path(
    hooked: list[CancellingEngine], witness: Witness, busybox: str, point: Point
) -> None:
    await check_kernel_point(hooked, witness, busybox, ["true"], point, "launched")


@pytest.mark.parametrize("point", LAUNCHED_SLOW_POINTS, ids=daemon.point_id)
async def test_cancel_long_running_payload_launched_on_the_kernel_path(
    hooked: list[CancellingEngine], witness: Witness, busybox: str, point: Point
) -> None:
    await check_kernel_point(hooked, witness, busybox, ["sh", "-c", "sleep 30"], point, "launched")


@pytest.mark.parametrize("owner", ["in-process", "supervised", "launched"])
async def test_the_kernel_points_cover_every_hook_of_a_run(
    hooked: list[CancellingEngine], witness: Witness, busybox: str, owner: OwnerKind
) -> None:
    """An uncancelled ``true`` run on the kernel path passes exactly the listed points, in
    lifecycle order, so the parametrizations above cannot miss an await the path adds."""
    async with cancelling_engine(witness.socket_path) as engine:
        hooked[:] = [engine]
        outcome = await run_with_cancel(engine, make_spec(busybox, ["true"]), None, owner=owner)
        assert outcome.result is not None
        assert outcome.result.ok
        assert outcome.result.evidence == "kernel"
        expected = {
            "in-process": SLOW_POINTS + EXIT_POINTS,
            "supervised": supervised(SLOW_POINTS) + SUPERVISED_EXIT_POINTS,
            "launched": LAUNCHED_SLOW_POINTS + SUPERVISED_EXIT_POINTS,
        }[owner]
        seen = [p for p in engine.log if p in expected or p[0].startswith(("kernel.", "owner."))]
        assert seen == expected, repr(engine.log)[-1500:]
