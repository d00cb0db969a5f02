"""A pool per shape for a batch of mixed shapes (sbxkit/pool/shapes.py) on the real engine.

Every shape of the batch gets pre-started containers sized for its jobs still to start, the
pools together never hold more unclaimed containers than the batch's parallelism, a shape's
pool closes (its containers removed) once its last job has started, and each result says
whether it ran pooled. The autouse witness proves nothing is left behind.
"""

from __future__ import annotations

import msgspec
import trio

from sbxkit._consumers.harness import Job, run_many
from sbxkit._model.spec import SandboxSpec
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.pool import Pool
from sbxkit.pool.shapes import PoolPerShape, ShapePools, open_shape_pools
from tests.engine.helpers import spec
from tests.witness import Witness

SHAPE_LABEL = "sbxkit.test.shape"


def shaped(image: str, script: str, shape: str) -> SandboxSpec:
    """``sh -c script`` whose container carries its shape's name as a label (part of it)."""
    return msgspec.structs.replace(spec(image, script), labels={SHAPE_LABEL: shape})


def parked_of(pools: ShapePools, shape: str) -> int:
    return sum(
        len(pool.parking.ready)
        for pool in pools.pools.values()
        if pool.shape.labels[SHAPE_LABEL] == shape
    )


def pool_of(pools: ShapePools, shape: str) -> Pool | None:
    found = [p for p in pools.pools.values() if p.shape.labels[SHAPE_LABEL] == shape]
    return found[0] if found else None


async def wait_parked(pools: ShapePools, wanted: dict[str, int]) -> None:
    with trio.fail_after(60):
        while {shape: parked_of(pools, shape) for shape in wanted} != wanted:  # noqa: ASYNC110
            await trio.sleep(0.02)


def on_daemon(witness: Witness, shape: str) -> int:
    return len(witness.containers(label=f"{SHAPE_LABEL}={shape}"))


async def test_run_many_runs_every_shape_of_a_mixed_batch_pooled(
    engine: Engine, busybox: str, python_image: str
) -> None:
    # The first job of each shape holds its slot long enough for the pools to park the
    # containers of the jobs behind it; the batch alternates two shapes (two images).
    images = {"small": busybox, "python": python_image}
    jobs = [
        Job(
            id=n,
            spec=shaped(images[shape], f"sleep {2 if n < 2 else 0.2}; echo {shape} {n}", shape),
        )
        for n, shape in enumerate(["small", "python"] * 4)
    ]
    backend = DockerBackend(engine=engine)
    results = await run_many(jobs, parallel=2, backend=backend, pool=PoolPerShape())

    assert [r.result.stdout if r.result else r.error for r in results] == [
        f"{shape} {n}\n".encode() for n, shape in enumerate(["small", "python"] * 4)
    ]
    pooled: dict[int, list[bool]] = {0: [], 1: []}
    for n, done in enumerate(results):
        assert done.result is not None
        pooled[n % 2].append(done.result.pooled)
    assert any(pooled[0]), pooled  # the first shape ran pooled
    assert any(pooled[1]), pooled  # and so did the second


async def test_the_pools_follow_the_queue_within_parallel_and_close_when_done(
    engine: Engine, busybox: str, witness: Witness
) -> None:
    specs = [
        shaped(busybox, "echo a", "a"),
        shaped(busybox, "echo a", "a"),
        shaped(busybox, "echo b", "b"),
        shaped(busybox, "echo b", "b"),
        shaped(busybox, "echo c", "c"),
    ]
    backend = DockerBackend(engine=engine)
    async with open_shape_pools(
        backend, specs, parallel=2, options=PoolPerShape(idle_ttl_s=60)
    ) as pools:
        await wait_parked(pools, {"a": 2, "b": 0})  # the next two jobs are a's
        assert on_daemon(witness, "a") == 2  # positive control: the witness sees them
        assert on_daemon(witness, "b") == 0

        first = await pools.run(0, specs[0], None, backend)
        assert (first.pooled, first.stdout) == (True, b"a\n")
        await wait_parked(pools, {"a": 1, "b": 1})  # the queue moved: one a, then one b

        second = await pools.run(1, specs[1], None, backend)
        assert (second.pooled, second.stdout) == (True, b"a\n")
        assert pool_of(pools, "a") is None  # a's last job started: its pool closed
        await wait_parked(pools, {"b": 2})
        with trio.fail_after(30):
            while on_daemon(witness, "a"):  # noqa: ASYNC110 - removal goes on in the pool
                await trio.sleep(0.05)

        rest = [await pools.run(index, specs[index], None, backend) for index in (2, 3, 4)]
        assert [r.stdout for r in rest] == [b"b\n", b"b\n", b"c\n"]
        assert [r.pooled for r in rest[:2]] == [True, True]
        assert pools.pools == {}  # every shape's last job started: every pool closed
        assert pools.budget.peak == 2  # two unclaimed at a time, never more
