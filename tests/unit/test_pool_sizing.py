"""A batch's pools per shape (sbxkit/pool/sizing.py, sbxkit/pool/shapes.py): the sizes follow
the jobs still to start, never more than the batch's parallelism in all, and bad pool settings
are refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbxkit._consumers.harness import Job, run_many
from sbxkit._model.call_checks import MAX_POOL_SIZE
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.backends.docker import DockerBackend
from sbxkit.errors import SpecError
from sbxkit.pool import ParkingBudget
from sbxkit.pool.shapes import PoolPerShape, ShapePools
from sbxkit.pool.sizing import pool_sizes
from tests.unit.test_sbx_runner import Machine


def test_each_shape_gets_one_per_job_of_it_among_the_next_parallel() -> None:
    assert pool_sizes("ABABAB", parallel=4, per_shape=4) == {"A": 2, "B": 2}
    assert pool_sizes("AAAABBBB", parallel=4, per_shape=4) == {"A": 4}
    assert pool_sizes("AAAABBBB"[3:], parallel=4, per_shape=4) == {"A": 1, "B": 3}


def test_a_shape_never_holds_more_than_its_jobs_still_to_start_or_its_own_size() -> None:
    assert pool_sizes("AB", parallel=8, per_shape=8) == {"A": 1, "B": 1}
    assert pool_sizes("AAAAAB", parallel=8, per_shape=2) == {"A": 2, "B": 1}
    assert pool_sizes("", parallel=8, per_shape=8) == {}


@pytest.mark.parametrize("parallel", [1, 2, 3, 7, 16])
def test_the_sizes_never_sum_past_parallel(parallel: int) -> None:
    queue = "ABCABBBCCAAAD" * 3
    for started in range(len(queue) + 1):
        sizes = pool_sizes(queue[started:], parallel=parallel, per_shape=parallel)
        remaining = queue[started:]
        assert sum(sizes.values()) <= parallel
        assert all(sizes[shape] <= remaining.count(shape) for shape in sizes)
        if remaining:
            assert sum(sizes.values()) == min(parallel, len(remaining))  # no room is wasted


def test_a_parking_budget_lends_at_most_its_total_and_pokes_its_listeners() -> None:
    budget = ParkingBudget(2)
    pokes: list[int] = []
    budget.listen(lambda: pokes.append(budget.held))
    assert [budget.take(), budget.take(), budget.take()] == [True, True, False]
    budget.give_back()
    assert pokes == [1]
    assert budget.take()
    assert (budget.held, budget.peak) == (2, 2)


SPEC = SandboxSpec(
    image="sbxkit-test/busybox:latest",
    command=["true"],
    limits=Limits(cpus=0.5, memory_bytes=64 * MiB, pids=32, output_bytes=4096, timeout_s=5.0),
)


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        (PoolPerShape(size=0), "pool.size"),
        (PoolPerShape(idle_ttl_s=0), "pool.idle_ttl"),
        (PoolPerShape(max_timeout_s=float("nan")), "pool.max_timeout"),
        ("yes", "pool"),
    ],
)
async def test_bad_batch_pool_settings_are_refused_before_anything_runs(
    pool: object, field: str
) -> None:
    # No daemon is contacted: the socket does not exist.
    with pytest.raises(SpecError) as caught:
        await run_many(
            [Job(id=1, spec=SPEC)],
            parallel=2,
            pool=pool,  # type: ignore[arg-type]
            socket_path="/nonexistent/docker.sock",
        )
    assert caught.value.field == field


async def test_a_pool_per_shape_on_a_backend_other_than_docker_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = Machine(tmp_path)
    monkeypatch.setenv("FAKE_SBX_STATE", str(machine.state))
    backend = machine.backend()
    with pytest.raises(SpecError) as caught:
        await run_many([Job(id=1, spec=SPEC)], parallel=2, backend=backend, pool=PoolPerShape())
    assert caught.value.field == "pool"
    assert "'sandbox'" in caught.value.rule
    assert machine.argvs() == []  # the sbx binary was never run


def test_a_batch_parks_at_most_its_parallelism_and_a_pools_ceiling() -> None:
    backend = DockerBackend(socket_path="/nonexistent/docker.sock")  # never contacted
    specs = [SPEC] * 3
    wide = ShapePools(backend, specs, parallel=1000, options=PoolPerShape())
    narrow = ShapePools(backend, specs, parallel=4, options=PoolPerShape(size=2))
    assert (wide.budget.total, wide.per_shape) == (MAX_POOL_SIZE, MAX_POOL_SIZE)
    assert (narrow.budget.total, narrow.per_shape) == (4, 2)


def test_a_parking_budget_resized_pokes_only_when_it_grows() -> None:
    budget = ParkingBudget(2)
    pokes: list[int] = []
    budget.listen(lambda: pokes.append(budget.total))
    assert [budget.take(), budget.take()] == [True, True]
    budget.resize(1)  # below what is held: nothing more until enough is given back
    assert pokes == []
    budget.give_back()
    assert not budget.take()
    budget.resize(3)
    assert pokes == [1, 3]
    assert [budget.take(), budget.take(), budget.take()] == [True, True, False]


def test_a_batchs_pools_follow_its_limit_as_it_moves() -> None:
    backend = DockerBackend(socket_path="/nonexistent/docker.sock")  # never contacted
    pools = ShapePools(backend, [SPEC] * 40, parallel=8, options=PoolPerShape())
    sizes: list[tuple[int, int, int]] = []
    pools.rebalance = lambda: sizes.append(  # type: ignore[method-assign]
        (pools.parallel, pools.per_shape, pools.budget.total)
    )
    pools.set_parallel(12)
    pools.set_parallel(3)
    pools.set_parallel(1000)
    assert sizes == [(12, 12, 12), (3, 3, 3), (MAX_POOL_SIZE, MAX_POOL_SIZE, MAX_POOL_SIZE)]
    sized = ShapePools(backend, [SPEC] * 40, parallel=8, options=PoolPerShape(size=5))
    sized.rebalance = lambda: None  # type: ignore[method-assign]
    sized.set_parallel(12)
    assert (sized.per_shape, sized.budget.total) == (5, 12)
    sized.set_parallel(3)
    assert (sized.per_shape, sized.budget.total) == (3, 3)
