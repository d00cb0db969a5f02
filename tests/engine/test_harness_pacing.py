"""``run_many`` without ``parallel`` against the real daemon: the in-flight limit moves as a
scripted CPU reading dictates (no dependence on this machine's real load), and the containers
of the batch, counted by the witness, never outnumber the limit in force.
"""

from __future__ import annotations

import trio

from sbxkit._consumers.harness import Job, JobResult, run_many
from sbxkit._consumers.paced import PaceStep, Pacing
from sbxkit._model.spec import MiB
from sbxkit.engine.client import Engine
from tests.engine.helpers import spec, unique
from tests.unit.test_pacing import ScriptedCpu, limit_at, replay
from tests.witness import Witness

TEST_LABEL = "sbxkit.test"
JOB_LABEL = "sbxkit.test.job"
SLEEPS = ("0.2", "0.4", "0.3", "0.5", "0.25")
"""Each job sleeps one of these in turn: the jobs do not finish in lockstep."""


def sleeping_job(index: int, image: str, label: str) -> Job:
    job_spec = spec(image, f"sleep {SLEEPS[index % len(SLEEPS)]}", cpus=0.1, memory_bytes=32 * MiB)
    job_spec.labels = {TEST_LABEL: label, JOB_LABEL: str(index)}
    return Job(id=index, spec=job_spec)


class Snapshots:
    """The batch's containers by job, read through the witness, each read stamped with the
    trio clock before and after (the run's ``started_at`` is on the same clock)."""

    def __init__(self, witness: Witness, label: str) -> None:
        self.witness = witness
        self.selector = f"{TEST_LABEL}={label}"
        self.seen: list[tuple[float, float, list[int]]] = []

    async def poll(self, until: trio.Event) -> None:
        while not until.is_set():
            before = trio.current_time()
            found = await trio.to_thread.run_sync(self.witness.containers, self.selector)
            after = trio.current_time()
            jobs = [int((c.get("Labels") or {})[JOB_LABEL]) for c in found]
            self.seen.append((before, after, jobs))
            await trio.sleep(0.02)


async def test_the_batch_follows_the_limit_a_scripted_cpu_moves(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("pacing")
    jobs = [sleeping_job(i, busybox, label) for i in range(80)]
    steps: list[PaceStep] = []
    # Two idle windows, then saturated cores for good.
    pacing = Pacing(
        cpu=ScriptedCpu([0.2, 0.2, 1.0]), on_window=steps.append, start=4, floor=2, cap=16
    )
    snapshots = Snapshots(witness, label)
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(snapshots.poll, done)
        try:
            results: list[JobResult] = await run_many(jobs, engine=engine, pacing=pacing)
        finally:
            done.set()
    for outcome in results:
        assert outcome.error is None, outcome.error
        assert outcome.ok, outcome.result

    limits = [step.after for step in steps]
    assert limits[:2] == [8, 16], steps  # busy 0.2: double (at most) a window
    assert [step.window.busy for step in steps][:3] == [0.2, 0.2, 1.0]
    # Saturated from the third window: a cut, or a raise while more in flight still pays,
    # as the measured throughput says (tests/unit/test_pacing.py has both, scripted): the
    # batch makes the rule's moves for what it measured.
    assert len(steps) > 2, steps
    assert limits == replay(4, 2, 16, steps)

    started = {r.id: r.started_at for r in results}
    most = 0
    for before, after, seen in snapshots.seen:
        if not seen:
            continue
        # Every container seen belongs to a job admitted while fewer than the limit then in
        # force were in flight; a lowered limit lets those already running finish.
        earliest = min(started[job] for job in seen)
        in_force = [limit_at(steps, 4, earliest)] + [
            step.after for step in steps if earliest < step.at <= after
        ]
        assert len(seen) <= max(in_force), (before, after, seen, steps)
        most = max(most, len(seen))
    assert most > 4  # the raised limit was used: more than the starting 4 at once
    assert witness.containers(f"{TEST_LABEL}={label}") == []
