"""One pool per shape for a batch of mixed shapes: ``run_many(jobs, pool=PoolPerShape())`` and
``sbxkit batch --pool``.

A layer on ``sbxkit.pool``: for each distinct shape of the batch's jobs a ``Pool`` is opened
when the shape's jobs come near the head of the queue, resized as the queue moves, and closed
once its last job has started, so what it held (admission memory included) returns while the
batch goes on. The sizes are ``pool_sizes``'s (``sizing.py``): the shapes of the next
``parallel`` jobs still to start, at most ``size`` per shape. One ``ParkingBudget`` of
``parallel`` bounds them all: the containers the pools hold unclaimed (being created, parked,
being removed) never exceed the batch's parallelism, even while one shape's pool shrinks as
another's grows. A batch whose limit moves (``run_many`` without ``parallel``) calls
``set_parallel``: the sizes and the budget follow the limit in force.

A job claims a parked container of its own shape when one is there and runs cold otherwise:
no job waits for a refill. Jobs a pool cannot serve (a command starting with ``-``, a time
limit above ``max_timeout_s``, a spec the backend refuses) run cold and take no room.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import msgspec
import trio

from sbxkit._model.call_checks import MAX_POOL_SIZE, check_pool_options
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.parking import ParkingBudget
from sbxkit._util.public import publish
from sbxkit._util.stdin import StdinSource
from sbxkit._util.unwrap import plain_errors
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerBackend
from sbxkit.errors import CleanupError, SpecError
from sbxkit.pool.inprocess import Pool
from sbxkit.pool.line import claim_line_within
from sbxkit.pool.shape import shape_of
from sbxkit.pool.sizing import pool_sizes

__all__ = ["PoolPerShape", "ShapePools", "open_shape_pools"]

_SHAPE_KEY = msgspec.json.Encoder(order="deterministic")


class PoolPerShape(msgspec.Struct, frozen=True, kw_only=True):
    """``run_many(jobs, pool=PoolPerShape())``: a pool per shape of the batch, opened and
    closed with it (docs/pool.md)."""

    size: int | None = None
    """At most this many parked per shape (None: the batch's ``parallel``). Whatever it is,
    all shapes together never hold more than ``parallel`` (nor 256, a pool's ceiling)."""
    idle_ttl_s: float = 300.0
    max_timeout_s: float = 600.0

    def check(self) -> None:
        """``SpecError`` naming ``pool.size`` and so on, before anything runs."""
        size = 1 if self.size is None else self.size  # None: parallel, checked by the batch
        check_pool_options(size, self.idle_ttl_s, self.max_timeout_s)


class ShapePools:
    """The pools of one batch (``open_shape_pools``); ``run`` serves its jobs by index."""

    def __init__(
        self,
        backend: DockerBackend,
        specs: Sequence[SandboxSpec | CheckedSpec],
        *,
        parallel: int,
        options: PoolPerShape,
    ) -> None:
        self.backend = backend
        self.options = options
        self.parallel = min(parallel, MAX_POOL_SIZE)  # a pool's own ceiling holds for all
        self.per_shape = min(options.size or parallel, self.parallel)
        self.budget = ParkingBudget(self.parallel)
        self._shapes: dict[bytes, SandboxSpec] = {}
        self._keys = [self._key_of(spec) for spec in specs]
        self._pending = {index: key for index, key in enumerate(self._keys) if key is not None}
        """Jobs still to start that a pool can serve, in input order: index → shape key."""
        self._remaining = Counter(self._pending.values())
        self.pools: dict[bytes, Pool] = {}
        """The open pools, by shape key."""
        self.closed: list[Pool] = []
        self._refused: set[bytes] = set()
        self._nursery: trio.Nursery | None = None

    def _key_of(self, spec: SandboxSpec | CheckedSpec) -> bytes | None:
        try:
            checked = self.backend.check(spec, "run")
        except SpecError:
            return None  # the job runs cold and meets its own error
        if claim_line_within(checked.spec, self.options.max_timeout_s) is None:
            return None
        shape = shape_of(checked.spec)
        key = _SHAPE_KEY.encode(shape)
        self._shapes.setdefault(key, shape)
        return key

    def _open(self, key: bytes, size: int) -> Pool | None:
        assert self._nursery is not None
        try:
            pool = Pool(
                self.backend,
                self._shapes[key],
                size=size,
                idle_ttl_s=float(self.options.idle_ttl_s),
                max_timeout_s=float(self.options.max_timeout_s),
                budget=self.budget,
            )
        except SpecError:
            self._refused.add(key)  # the parked shell's spec is refused: its jobs run cold
            return None
        pool.start(self._nursery)
        self.pools[key] = pool
        return pool

    def rebalance(self) -> None:
        """Size every shape's pool for the jobs still to start; close the pools of shapes
        that have none left."""
        sizes = pool_sizes(self._pending.values(), self.parallel, self.per_shape)
        for key in [key for key in self.pools if self._remaining[key] == 0]:
            pool = self.pools.pop(key)
            pool.close()
            self.closed.append(pool)
        for key, pool in self.pools.items():
            pool.resize(sizes.get(key, 0))  # shrink first: their room goes to the others
        for key, size in sizes.items():
            if key not in self.pools and key not in self._refused:
                self._open(key, size)

    def set_parallel(self, parallel: int) -> None:
        """The batch's in-flight limit moved (an adaptive batch): park for the new one."""
        self.parallel = min(parallel, MAX_POOL_SIZE)
        self.per_shape = min(self.options.size or parallel, self.parallel)
        self.budget.resize(self.parallel)
        self.rebalance()

    def _leave(self, index: int) -> None:
        key = self._pending.pop(index, None)
        if key is not None:
            self._remaining[key] -= 1
            self.rebalance()

    async def run(
        self,
        index: int,
        spec: SandboxSpec | CheckedSpec,
        stdin: StdinSource | None,
        cold: Backend,
    ) -> RunResult:
        """Job ``index``: claimed from its shape's pool when a container is parked there, or
        is being parked with no other job waiting for it (``Pool.wait_for_park``); otherwise
        run cold through ``cold``. Its start moves the pools on."""
        key = self._keys[index]
        pool = self.pools.get(key) if key is not None else None
        claim = None
        try:
            if pool is not None:
                claim = pool.take(spec)  # before the move on: the shrink must not remove it
                if not claim.pooled and claim.line is not None:
                    # A park under way beats a cold create; waited for before the move on,
                    # which would close the pool after its shape's last job.
                    claim = await pool.wait_for_park(claim)
        finally:
            try:
                self._leave(index)
            except BaseException:
                if claim is not None:
                    claim.abandon()
                raise
        if claim is not None and claim.pooled:
            return await claim.run(stdin)
        return await cold.run_once(spec, stdin)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
            self.closed.append(pool)
        self.pools.clear()

    @property
    def cleanup_errors(self) -> list[CleanupError]:
        return [error for pool in self.closed for error in pool.cleanup_errors]


@asynccontextmanager
async def open_shape_pools(
    backend: DockerBackend,
    specs: Sequence[SandboxSpec | CheckedSpec],
    *,
    parallel: int,
    options: PoolPerShape,
) -> AsyncIterator[ShapePools]:
    """The pools of a batch of ``specs`` (input order) for the block; every container they
    hold is removed when it ends, and a removal that failed is raised then."""
    options.check()
    pools = ShapePools(backend, specs, parallel=parallel, options=options)
    with plain_errors():  # the caller's own error leaves as itself, not in a group
        async with trio.open_nursery() as nursery:
            pools._nursery = nursery
            pools.rebalance()
            try:
                yield pools
            finally:
                pools.close()
    if pools.cleanup_errors:
        raise pools.cleanup_errors[0]


publish(__name__, globals())  # public names show as sbxkit.NAME
