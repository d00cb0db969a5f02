"""``run_many`` against the real daemon: every job gets a result, admission holds, and
cancelling the batch removes every container in flight through its own run's owner.

What the daemon did is read through the witness (containers by this test's label), never
through sbxkit's own client.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from sbxkit._consumers.harness import Job, JobResult, run_many
from sbxkit._lifecycle.owned import created_inspection
from sbxkit._lifecycle.owner import CreateRequest, Owner
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.spec import MiB
from sbxkit._protocol.wire import Expiring
from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerInspect
from sbxkit.errors import SpecError
from tests.engine.helpers import spec, unique
from tests.witness import Witness

TEST_LABEL = "sbxkit.test"


def labelled_job(job_id: Any, image: str, script: str, label: str, **limits: Any) -> Job:
    job_spec = spec(image, script, **{"cpus": 0.1, "memory_bytes": 32 * MiB, **limits})
    job_spec.labels = {TEST_LABEL: label}
    return Job(id=job_id, spec=job_spec)


def most_in_flight(results: list[JobResult]) -> int:
    """Peak overlap of the [started_at, finished_at) intervals (finishes first on ties)."""
    events = sorted([(r.started_at, 1) for r in results] + [(r.finished_at, -1) for r in results])
    peak = now = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


class Poller:
    """Counts this test's containers through the witness while the batch runs."""

    def __init__(self, witness: Witness, label: str) -> None:
        self.witness = witness
        self.selector = f"{TEST_LABEL}={label}"
        self.counts: list[int] = []
        self.running: list[int] = []

    async def poll(self, until: trio.Event) -> None:
        while not until.is_set():
            found = await trio.to_thread.run_sync(self.witness.containers, self.selector)
            self.counts.append(len(found))
            self.running.append(sum(1 for c in found if c.get("State") == "running"))
            await trio.sleep(0.02)


async def test_twelve_jobs_at_parallel_four_all_produce_results(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("harness")
    jobs = [labelled_job(i, busybox, f"echo job-{i}", label) for i in range(12)]
    seen: list[JobResult] = []
    poller = Poller(witness, label)
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.poll, done)
        results = await run_many(jobs, parallel=4, engine=engine, on_result=seen.append)
        done.set()
    assert [r.id for r in results] == list(range(12))
    for index, outcome in enumerate(results):
        assert outcome.error is None, outcome.error
        assert outcome.result is not None
        assert outcome.ok
        assert outcome.result.stdout == f"job-{index}\n".encode()
    assert sorted(r.id for r in seen) == list(range(12))
    assert len({r.result.container_id for r in results if r.result}) == 12
    assert most_in_flight(results) == 4
    assert max(poller.counts) <= 4
    assert witness.containers(label=f"{TEST_LABEL}={label}") == []


async def test_admission_by_memory_never_has_more_than_three_in_flight(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("harness")
    jobs = [
        labelled_job(f"m{i}", busybox, "sleep 1", label, memory_bytes=64 * MiB) for i in range(8)
    ]
    poller = Poller(witness, label)
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.poll, done)
        results = await run_many(jobs, parallel=8, host_memory_bytes=200 * MiB, engine=engine)
        done.set()
    assert all(r.ok for r in results), [r.error or r.result for r in results]
    assert most_in_flight(results) == 3
    # The daemon's view agrees: never more than three of this test's containers existed,
    # and three did run at once (the budget, not something else, was the bound).
    assert max(poller.counts) <= 3
    assert max(poller.running) == 3


async def test_a_failing_job_is_an_error_result_and_the_batch_goes_on(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("harness")
    good = labelled_job("good", busybox, "echo fine", label)
    missing = labelled_job("missing", busybox, "true", label)
    missing.spec.image = f"sbxkit-test/absent:{unique('tag')}"
    results = await run_many([missing, good], parallel=2, engine=engine)
    assert results[0].error is not None
    assert results[0].error.type == "ImageError"
    assert "never pulls" in results[0].error.message
    assert results[1].ok


async def test_a_job_larger_than_the_budget_is_refused_before_anything_runs(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("harness")
    since = time.time()
    jobs = [
        labelled_job("fits", busybox, "true", label),
        labelled_job("huge", busybox, "true", label, memory_bytes=256 * MiB),
    ]
    with pytest.raises(SpecError, match=r"job 'huge': limits\.memory_bytes"):
        await run_many(jobs, parallel=2, host_memory_bytes=200 * MiB, engine=engine)
    created = witness.events(
        since, time.time(), type=["container"], event=["create"], label=[f"{TEST_LABEL}={label}"]
    )
    assert created == []


class RecordingOwner:
    """The runner's default owner (the supervisor), recording what it was asked to do."""

    def __init__(self, engine: Engine, log: dict[str, list[str | None]]) -> None:
        self.inner: Owner = SupervisedOwner(engine)
        self.log = log

    async def create(self, request: CreateRequest) -> str:
        container_id = await self.inner.create(request)
        self.log["created"].append(container_id)
        return container_id

    async def started(self, lease: str) -> None:
        await self.inner.started(lease)

    def queued_s(self, lease: str) -> float:
        return self.inner.queued_s(lease)

    def created_inspection(self, lease: str) -> ContainerInspect | None:
        return created_inspection(self.inner, lease)

    async def ended_by_owner(self, lease: str) -> Expiring | None:
        return await self.inner.ended_by_owner(lease)

    async def release(self, lease: str) -> bool:
        return await self.inner.release(lease)

    @property
    def fifo_root(self) -> Path:
        return self.inner.fifo_root

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        await self.inner.remove(lease, name, container_id)
        self.log["removed"].append(container_id)


async def test_cancelling_the_batch_removes_every_container_in_flight_through_its_owner(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("harness")
    jobs = [labelled_job(i, busybox, "sleep 30", label) for i in range(6)]
    log: dict[str, list[str | None]] = {"created": [], "removed": []}
    seen: list[JobResult] = []
    selector = f"{TEST_LABEL}={label}"

    def three_running() -> bool:
        found = witness.containers(label=selector)
        return sum(1 for c in found if c.get("State") == "running") == 3

    async with trio.open_nursery() as nursery:

        async def batch() -> None:
            await run_many(
                jobs,
                parallel=3,
                engine=engine,
                owner_factory=lambda eng: RecordingOwner(eng, log),
                on_result=seen.append,
            )

        nursery.start_soon(batch)
        with trio.fail_after(20):
            while not await trio.to_thread.run_sync(three_running):  # noqa: ASYNC110 (polls the daemon)
                await trio.sleep(0.05)
        cancelled_at = trio.current_time()
        nursery.cancel_scope.cancel()
    unwound_s = trio.current_time() - cancelled_at
    assert seen == []  # nothing finished: cancelled runs write no result
    assert len(log["created"]) == 3  # jobs not yet admitted never started
    assert sorted(map(str, log["removed"])) == sorted(map(str, log["created"]))
    assert witness.containers(label=selector) == []  # removed before run_many unwound
    assert unwound_s < 10
