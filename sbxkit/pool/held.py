"""One-shot runs that claim from a pool the supervisor holds (issue 13, docs/pool.md).

``PooledBackend`` is a ``DockerBackend`` whose one-shot runs first ask the supervisor for a
parked container of their shape: the supervisor keeps a pool per shape (``size`` parked,
refilled in its own tasks, ended after ``idle_ttl_s`` without a claim), so successive
processes — ``sbxkit run --pool N`` from a shell — claim what an earlier one caused to be
parked. A claim is one round trip on a fresh connection; with nothing parked it waits only for a
park already under way (pooling.py), else the run goes cold at once (``RunResult.pooled`` says
which path ran). Everything else (sessions, PTYs, stdio
workers, grants) is the ``DockerBackend``'s.

The claimed container is verified and started by the supervisor before it is parked; this
process attaches to it, registers the exit wait, then writes the claim line (``claim_line``)
and the run's stdin — from there it is the cold run's supervision: the same caps, the time
limit from the claim, the verdict judged on the daemon's evidence. The lease is this
connection's: a Close (or this process dying) removes the container. By default the result
returns at the payload's exit and removal finishes under the supervisor's ownership;
``HeldPool(wait_for_removal=True)`` waits until the supervisor confirmed it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Unpack

import msgspec
import trio

from sbxkit._kernel.fifos import HostEnds
from sbxkit._kernel.init import ContainerInit
from sbxkit._lifecycle.attached import OutputCallback
from sbxkit._lifecycle.kernel_watch import Exited, Feed, KernelIO, KernelSupervise, supervise_kernel
from sbxkit._lifecycle.outcome import Verdict, judge_exit
from sbxkit._lifecycle.owned import OwnedContainer
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.call_checks import check_pool_options
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.kernel_host import kernel_path_reason
from sbxkit._plan.plan import (
    LIFETIME_MARGIN_S,
    CheckedSpec,
    DaemonFacts,
    build_plan,
    learn_daemon,
    new_lease_id,
)
from sbxkit._plan.policy import claim_env
from sbxkit._protocol.wire import Claim, Claimed, PoolTerms
from sbxkit._util.public import publish
from sbxkit._util.stdin import StdinSource
from sbxkit.backends.base import Consumer
from sbxkit.backends.docker import (
    DockerBackend,
    DockerOptions,
    Overrides,
    default_owner,
    governed,
)
from sbxkit.engine.client import Engine, engine_or_open
from sbxkit.errors import PoolUnavailable, SpecError
from sbxkit.pool.line import claim_line
from sbxkit.pool.shape import parked_spec
from sbxkit.pool.transport import AttachTransport, ClaimTransport, FifoTransport

__all__ = ["HeldPool", "PoolUnavailable", "PooledBackend"]

WARM_POLL_S = 0.05
WARM_WAIT_S = 30.0
"""How long ``PooledBackend.warm`` waits for a park unless told."""


class HeldPool(msgspec.Struct, frozen=True, kw_only=True):
    """How the supervisor keeps the pool of each shape this backend's runs claim from."""

    size: int
    """Containers parked per shape (1..256)."""
    idle_ttl_s: float = 300.0
    """A parked container waits at most this long; a shape's pool ends after this long
    without a claim (so an idle supervisor can still exit)."""
    max_timeout_s: float = 600.0
    """Runs with a longer time limit go cold (a parked container's lifetime must cover it)."""
    wait_for_removal: bool = False
    """Return only once the supervisor confirmed the claimed container removed."""
    refill: bool = True
    """False: the supervisor parks ``size`` once and replaces nothing claimed or idled out."""

    @property
    def terms(self) -> PoolTerms:
        return PoolTerms(
            size=self.size,
            idle_ttl_s=self.idle_ttl_s,
            max_timeout_s=self.max_timeout_s,
            refill=self.refill,
        )


class PooledBackend(DockerBackend):
    """A ``DockerBackend`` whose one-shot runs (``_run_checked``) and sessions
    (``_own_checked``) claim parked containers from the supervisor, cold when they cannot."""

    def __init__(
        self, *, pool: HeldPool, recover_at_open: bool = True, **options: Unpack[DockerOptions]
    ) -> None:
        check_pool_options(pool.size, pool.idle_ttl_s, pool.max_timeout_s)
        owner = options.get("owner")
        if owner is not None and not isinstance(owner, SupervisedOwner):
            raise SpecError(
                "pool",
                "a held pool lives in the supervisor: it needs the default owner "
                "(open_pool keeps a pool in this process for any owner)",
            )
        super().__init__(recover_at_open=recover_at_open, **options)
        self.pool = pool

    async def _run_checked(
        self, checked: CheckedSpec, stdin: StdinSource | None, on_output: OutputCallback | None
    ) -> RunResult:
        """Claim a parked container of the spec's shape and run there; cold when none is
        parked, when the command cannot ride a claim line, when the time limit is above
        ``max_timeout_s``, or for a GPU request."""
        result = await self._run_claimed(checked, stdin, on_output)
        if result is not None:
            return result
        return await super()._run_checked(checked, stdin, on_output)

    async def _run_claimed(
        self, checked: CheckedSpec, stdin: StdinSource | None, on_output: OutputCallback | None
    ) -> RunResult | None:
        spec, pool = checked.spec, self.pool
        line = claim_line(list(spec.command), claim_env(spec))
        timeout_s = spec.limits.timeout_s
        assert timeout_s is not None  # checked
        if line is None or timeout_s > pool.max_timeout_s or spec.gpus is not None:
            return None
        t_asked = trio.current_time()
        async with self._claiming(checked) as claiming:
            image_env = claiming.facts.image_env
            line = claim_line(list(spec.command), claim_env(spec), image_env=image_env)
            if line is None:
                return None
            reply = await claiming.owner.claim(claiming.claim)
            if not isinstance(reply, Claimed):
                return None
            return await _run_on_claimed(
                claiming.engine,
                claiming.owner,
                reply,
                line,
                stdin,
                checked,
                on_output,
                t_asked,
                pool,
                self.kernel_supervise,
            )

    async def warm(self, spec: SandboxSpec | CheckedSpec, *, wait_s: float = WARM_WAIT_S) -> int:
        """Start the supervisor's pool of ``spec``'s shape without running anything, and wait
        (at most ``wait_s``) until a container is parked; returns how many are. Raises
        ``PoolUnavailable`` with the supervisor's reason when it cannot park one."""
        checked = self.check(spec, "run")
        async with self._claiming(checked) as claiming:
            owner, warm = claiming.owner, msgspec.structs.replace(claiming.claim, mode="warm")
            reason = "nothing parked yet"
            with trio.move_on_after(wait_s):
                while True:
                    reply = await owner.claim(warm)
                    assert not isinstance(reply, Claimed)  # warm never takes one
                    if reply.parked:
                        return reply.parked
                    if reply.problem is not None:
                        raise PoolUnavailable(reply.problem)
                    reason = reply.reason
                    await trio.sleep(WARM_POLL_S)
        raise PoolUnavailable(f"{reason} after {wait_s:g} s")

    async def end(self, spec: SandboxSpec | CheckedSpec) -> None:
        """End the supervisor's pool of ``spec``'s shape now: its parked containers are removed
        before this returns (claimed ones stay their callers')."""
        checked = self.check(spec, "run")
        async with self._claiming(checked) as claiming:
            await claiming.owner.claim(msgspec.structs.replace(claiming.claim, mode="end"))

    @asynccontextmanager
    async def _claiming(self, checked: CheckedSpec) -> AsyncIterator[_Claiming]:
        """The engine, the supervisor and the Claim of ``checked``'s shape: the template is the
        Register of a parked container of that shape (planned like any sandbox)."""
        pool = self.pool
        async with engine_or_open(self.engine, self.socket_path) as engine:
            spec = parked_spec(checked.spec, pool.idle_ttl_s, pool.max_timeout_s)
            parked = self.check(spec, "run")
            facts = await learn_daemon(engine, parked, self.gpu_cursor)
            owner = self.owner or default_owner(engine, parked.settings, self.on_queued)
            assert isinstance(owner, SupervisedOwner)  # __init__ refused any other
            fifo_io = await kernel_path_reason(engine, parked, facts) is None
            fifo_root = owner.fifo_root if fifo_io else None
            plan = build_plan(parked, facts, lease=new_lease_id(), fifo_root=fifo_root)
            template = owner.register_for(
                CreateRequest(
                    plan.lease, plan.name, plan.body, plan.lifetime_s, network=plan.network
                )
            )
            mounts = list(plan.expected_mounts)
            timeout_s = checked.spec.limits.timeout_s
            assert timeout_s is not None  # checked
            # The claimed run's own lifetime, from the claim on: however long the container
            # was parked, and under whoever's pool terms (issue 27, finding 3).
            run_lifetime_s = min(timeout_s + LIFETIME_MARGIN_S, plan.lifetime_s)
            claim = Claim(
                template=template,
                terms=pool.terms,
                expected_mounts=mounts,
                run_lifetime_s=run_lifetime_s,
            )
            yield _Claiming(engine, owner, claim, facts)

    @asynccontextmanager
    async def _own_checked(
        self, checked: CheckedSpec, consumer: Consumer, overrides: Overrides | None, kernel: bool
    ) -> AsyncIterator[OwnedContainer]:
        """A session (``open_sandbox``) starts from a parked container of its shape when one
        is parked: the claim line ``exec``s its keep-alive. Served cold: every other consumer,
        a session with env (a session's env is the container's, set at create), a time limit
        above ``max_timeout_s``, or nothing parked."""
        limits = checked.spec.limits
        assert limits.timeout_s is not None  # checked
        line = claim_line(list(checked.spec.command), {})
        if (
            consumer != "session"
            or overrides is not None
            or line is None
            or checked.spec.env
            or checked.spec.gpus is not None
            or limits.timeout_s > self.pool.max_timeout_s
        ):
            async with super()._own_checked(checked, consumer, overrides, kernel) as box:
                yield box
            return
        async with self._claiming(checked) as claiming:
            reply = await claiming.owner.claim(claiming.claim)
            if not isinstance(reply, Claimed):
                async with super()._own_checked(checked, consumer, None, False) as box:
                    yield box
                return
            plan = build_plan(checked, claiming.facts, lease=reply.lease)
            box = _ClaimedContainer(
                engine=claiming.engine,
                plan=plan,
                container_id=reply.container_id,
                began=trio.current_time(),
                owner=claiming.owner,
            )
            try:
                await _hand_over(claiming.engine, claiming.owner, reply, line)
                yield box
            finally:
                removing = trio.current_time()
                with trio.CancelScope(shield=True):
                    await claiming.owner.remove(reply.lease, reply.name, reply.container_id)
                box.remove_s = trio.current_time() - removing


@dataclass(frozen=True)
class _Claiming:
    engine: Engine
    owner: SupervisedOwner
    claim: Claim
    facts: DaemonFacts


class _ClaimedContainer(OwnedContainer):
    """A claimed parked container: started already, its main process the claimed command."""

    async def start(self, *, launched: bool = True) -> None:
        await trio.lowlevel.checkpoint()


async def _hand_over(engine: Engine, owner: SupervisedOwner, claimed: Claimed, line: bytes) -> None:
    """Write the claim line and close the parked shell's stdin: it ``exec``s the command."""
    fds = owner.claimed_fds(claimed.lease)
    if fds:  # the kernel path: the claim line goes into its ``in`` FIFO
        async with KernelIO.of(HostEnds(*fds[:3])) as io:
            if len(fds) == 4:
                io.init = ContainerInit.adopt(fds[3], claimed.container_id)
            await io.stdin.send_all(line)
        return
    attach = await engine.container_attach(claimed.container_id, stdin=True)
    try:
        await attach.send_all(line)
        await attach.send_eof()
    finally:
        await attach.aclose()


@asynccontextmanager
async def claimed_transport(
    engine: Engine,
    owner: SupervisedOwner,
    claimed: Claimed,
    supervise: KernelSupervise = supervise_kernel,
) -> AsyncIterator[ClaimTransport]:
    """The claimed container's transport: its FIFO ends (and init) as they came with the
    claim, or — on the daemon's path — an attach and a ``wait`` registered now (it is parked:
    nothing has happened yet). Closed when the block ends. ``supervise`` watches a run on the
    FIFOs (this process, unless the run was handed off)."""
    container_id = claimed.container_id
    transport: ClaimTransport
    fds = owner.claimed_fds(claimed.lease)
    if fds:
        io = KernelIO.of(HostEnds(*fds[:3]))
        exited: Exited
        if claimed.evidence == "kernel" and len(fds) == 4:
            io.init = ContainerInit.adopt(fds[3], container_id)
            exited = io.init.exited
        else:
            waiter = await engine.container_wait(container_id, "next-exit")

            async def exited() -> int:
                return (await waiter.result()).status_code

        transport = FifoTransport(io, exited, claimed.evidence, engine, container_id, supervise)
    else:
        attach = await engine.container_attach(container_id, stdin=True)
        try:
            transport = AttachTransport(attach, await engine.container_wait(container_id))
        except BaseException:
            await attach.aclose()
            raise
    try:
        yield transport
    finally:
        await transport.aclose()


async def _run_on_claimed(
    engine: Engine,
    owner: SupervisedOwner,
    claimed: Claimed,
    line: bytes,
    stdin: StdinSource | None,
    checked: CheckedSpec,
    on_output: OutputCallback | None,
    t_asked: float,
    pool: HeldPool,
    supervise: KernelSupervise,
) -> RunResult:
    """Write the claim line and stdin, supervise, judge — on the claim's own transport; then
    hand the lease back (Close) however it ended."""
    clock, limits = trio.current_time, checked.spec.limits
    assert limits.timeout_s is not None  # checked
    assert limits.output_bytes is not None
    lease, container_id = claimed.lease, claimed.container_id

    async def judge(code: int | None) -> Verdict:
        return await judge_exit(
            engine, container_id, code, ended_by_owner=lambda: owner.ended_by_owner(lease)
        )

    try:
        async with claimed_transport(engine, owner, claimed, supervise) as transport:
            t_claim = clock()
            feed = Feed(line, stdin, limits.output_bytes, limits.timeout_s, on_output)
            ran = await transport.run(feed, judge)
            run_s = clock() - t_claim
        denials = await owner.denials(lease) if governed(checked.spec) else ()
        ports = await owner.ports(lease) if governed(checked.spec) else ()
    except BaseException:
        with trio.CancelScope(shield=True):
            await owner.remove(lease, claimed.name, container_id)  # leave after removal
        raise
    removing = clock()
    if pool.wait_for_removal:
        await owner.remove(lease, claimed.name, container_id)
    else:
        await owner.release(lease)
    return ran.result(
        container_id,
        lease,
        start_s=t_claim - t_asked,
        run_s=run_s,
        remove_s=clock() - removing if pool.wait_for_removal else 0.0,
        denials=denials,
        ports=ports,
    )


publish(__name__, globals())  # public names show as sbxkit.NAME
