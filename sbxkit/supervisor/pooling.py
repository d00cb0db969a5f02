"""Pools the supervisor holds (issue 13, docs/pool.md): parked containers that outlive callers.

A ``Claim`` names a shape by a template (``templates.py``). The first claim of a shape starts
its pool; every claim takes the oldest parked container of the shape, if one is parked, and
hands its lease to the claiming connection (``Claimed``) — from there it is that connection's
lease like any other: Close or EOF removes it. Otherwise the answer is ``Unclaimed`` and the
caller runs cold; claims never wait for a refill.

Each parked container is an ordinary lease of this supervisor, created by the one lease task
(``lifecycle.py``) from the template under a fresh lease: re-checked (recheck.py), admitted
(never queued ahead of a caller: a park that does not fit now is retried later), journaled,
created, its reservation checked, verified against the template's expected mounts
(``verify.check_created``), then started with the parked shell waiting for one line. It is
removed when claimed-and-closed, after ``idle_ttl_s`` unclaimed, when a waiting request needs
its capacity (``_make_room``), when its pool ends (``idle_ttl_s`` without a claim) or the
supervisor stops; a crash leaves its record to recovery, as for every lease.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from sbxkit.admission import Need, never_fits
from sbxkit.engine.client import Engine
from sbxkit.errors import SbxError
from sbxkit.supervisor.admitting import Admitting
from sbxkit.supervisor.lease import (
    Intent,
    LaunchSlot,
    LiveLease,
    NoPeer,
    Peer,
    first_of,
    log,
)
from sbxkit.supervisor.recheck import unknown_field
from sbxkit.supervisor.templates import body_for_lease, shape_key, template_problem
from sbxkit.supervisor.wire import Claim, Claimed, PoolTerms, Refused, Register, Unclaimed
from sbxkit.verify import check_created

MAX_SHAPES = 16
CLAIM_WAIT_S = 5.0  # the longest a claim waits for a park under way before going cold
PARK_RETRY_S = 1.0  # after a park that did not fit or failed
STOP_DRAIN_S = 10.0


@dataclass(eq=False)
class ShapePool:
    """The parked containers of one shape and what keeps them."""

    key: str
    claim: Claim
    last_claim: float
    parked: list[LiveLease] = field(default_factory=list)
    """Ready for a claim, oldest first."""
    starting: int = 0
    in_use: int = 0
    """Parked or claimed and not yet removed."""
    error: str | None = None
    """Why the last park failed (None once one parked)."""
    wanted: trio.Event = field(default_factory=trio.Event)
    ended: bool = False
    parks: int = 0
    """Parks started in the pool's life (``refill=False`` stops at ``size``)."""
    waiting: int = 0
    """Claims waiting for a park under way (at most one per park)."""
    arrived: trio.Event = field(default_factory=trio.Event)
    """Set when a container is parked or a park ends: waiting claims look again."""

    def signal_arrival(self) -> None:
        self.arrived.set()
        self.arrived = trio.Event()

    @property
    def terms(self) -> PoolTerms:
        return self.claim.terms


class Pooling(Admitting):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pools: dict[str, ShapePool] = {}
        self.stopping = False

    def stats(self) -> str:
        parked = sum(len(pool.parked) for pool in self.pools.values())
        return f"{super().stats()}, pools: {len(self.pools)} holding {parked} parked"

    # -- a claim ---------------------------------------------------------------------------------

    async def _claim(self, peer: Peer, claim: Claim) -> LiveLease | None:
        """Answer a Claim: the claimed lease (now the peer's), or None (answered otherwise)."""
        problem = template_problem(claim)
        if problem is None:
            problem = _unknown_template_field(peer.last_payload)
        if problem is not None:
            await peer.send(Refused(code="request", reason=problem, field="template"))
            return None
        if self.stopping:
            await peer.send(Unclaimed(reason="the supervisor is stopping"))
            return None
        key = shape_key(claim)
        pool = self.pools.get(key)
        now = trio.current_time()
        if pool is None and claim.mode == "end":
            await peer.send(Unclaimed(reason="no pool of this shape is held"))
            return None
        if pool is None:
            if len(self.pools) >= MAX_SHAPES:
                await peer.send(Unclaimed(reason=f"{MAX_SHAPES} pools are held already"))
                return None
            pool = self.pools[key] = ShapePool(key, claim, now)
            self.nursery.start_soon(self._keep_pool, pool)
            log(f"pool {key[:12]}: started (size {claim.terms.size})")
        if claim.mode == "end":
            await self._end_pool(pool)
            await peer.send(Unclaimed(reason="the pool ended; its parked containers are removed"))
            return None
        pool.claim, pool.last_claim = claim, now  # the latest terms hold
        self._fill(pool)  # a new pool's first parks start now: this claim may wait for one
        pool.wanted.set()
        live = await self._next_parked(pool) if claim.mode == "take" else None
        if live is None:
            reason = "nothing parked of this shape yet; the pool is filling"
            await peer.send(Unclaimed(reason=reason, parked=len(pool.parked), problem=pool.error))
            return None
        live.peer = peer
        container_id = live.record.container_id or ""
        await peer.send(
            Claimed(lease=live.record.lease, name=live.record.name, container_id=container_id)
        )
        live.claimed.set()
        return live

    async def _next_parked(self, pool: ShapePool) -> LiveLease | None:
        """The oldest parked container; with none parked, wait (at most ``CLAIM_WAIT_S``) for
        a park already under way that no other claim waits for — it is further along than a
        cold create would be. None: go cold."""
        if pool.parked:
            return pool.parked.pop(0)
        if pool.waiting >= pool.starting or pool.error is not None:
            return None
        pool.waiting += 1
        try:
            with trio.move_on_after(CLAIM_WAIT_S):
                while not pool.parked:
                    if pool.ended or pool.error is not None or pool.starting == 0:
                        return None
                    await pool.arrived.wait()
                return pool.parked.pop(0)
            return None
        finally:
            pool.waiting -= 1

    # -- keeping a pool ----------------------------------------------------------------------------

    async def _keep_pool(self, pool: ShapePool) -> None:
        """Park up to ``size`` while the pool is claimed from; end it after ``idle_ttl_s``
        without a claim (its parked containers are removed, and an idle supervisor can exit)."""
        try:
            while not (self.stopping or pool.ended):
                idle_until = pool.last_claim + pool.terms.idle_ttl_s
                if trio.current_time() >= idle_until:
                    log(f"pool {pool.key[:12]}: no claim for {pool.terms.idle_ttl_s:g} s; ended")
                    return
                self._fill(pool)
                pool.wanted = trio.Event()
                wake_at = idle_until
                if pool.error is not None:
                    wake_at = min(wake_at, trio.current_time() + PARK_RETRY_S)
                with trio.move_on_at(wake_at):
                    await pool.wanted.wait()
                if pool.error is not None and pool.starting == 0:
                    await trio.sleep(PARK_RETRY_S)  # e.g. a full host: claims run cold meanwhile
        finally:
            pool.ended = True
            if self.pools.get(pool.key) is pool:
                del self.pools[pool.key]
            for live in pool.parked:
                live.request_stop("its pool ended")
            pool.parked.clear()

    def _fill(self, pool: ShapePool) -> None:
        """Start parks until ``size`` are starting, parked or in use."""
        while (
            pool.starting + pool.in_use < pool.terms.size
            and not (pool.ended or self.stopping)
            and (pool.terms.refill or pool.parks < pool.terms.size)
        ):
            pool.starting += 1
            pool.parks += 1
            self.nursery.start_soon(self._park_one, pool)

    async def _park_one(self, pool: ShapePool) -> None:
        """One parked container of the pool's shape, through the one lease task. It counts
        toward the pool's size while starting, parked and claimed: its replacement is parked
        once the claimed run ended, so a refill never competes with the run on the daemon."""
        parked = trio.Event()
        try:
            outcome = await self._park_refusal(pool, uuid.uuid4().hex, parked)
            if isinstance(outcome, str):
                pool.error = outcome
                return
            await first_of(parked, outcome.finished)
            if not parked.is_set():
                return
            pool.starting -= 1
            pool.in_use += 1
            try:
                await outcome.finished.wait()
            finally:
                pool.in_use -= 1
        finally:
            if not parked.is_set():
                pool.starting -= 1
                pool.signal_arrival()  # a claim waiting for this park goes cold
            pool.wanted.set()

    async def _park_refusal(
        self, pool: ShapePool, lease: str, parked: trio.Event
    ) -> str | LiveLease:
        """Admit, journal and start the lease task of one parked container: its live lease,
        or why not."""
        template = pool.claim.template
        register = msgspec.structs.replace(
            template,
            lease=lease,
            name=f"sbxkit-{lease}",
            body=body_for_lease(template.body, template.lease, lease),
        )
        problem = self._request_problem(register)
        if problem is not None:
            return problem
        refusal = await self._recheck_body(register)
        if refusal is not None:
            return f"refused {refusal[0]}: {refusal[1]}"
        try:
            engine = await self.engine_for(self.config.docker_socket or register.engine_socket)
            await self._learn_budget(engine)
        except SbxError as exc:
            return f"engine unavailable: {exc}"
        refused = await self._volumes_refusal(engine, register)
        if refused is None:
            refused = await self._managed_refusal(engine, register)
        if refused is not None:
            return f"refused {refused.field}: {refused.reason}"
        need = Need(register.reservation.memory_bytes, register.reservation.nano_cpus)
        impossible = never_fits(need, self.admission.budget)
        if impossible is not None:
            return impossible.rule
        problem = self._hard_bound_problem()
        if problem is not None:
            return problem
        # Never ahead of a caller: a park that does not fit now waits for the next round.
        self.admission.enqueue(lease, need)
        self._pump()
        if not self.admission.is_admitted(lease):
            self.admission.withdraw(lease)
            self._pump()
            return "the host's budget is in use; parking resumes when it frees"
        assert self.launch_slots is not None
        slot = LaunchSlot(self.launch_slots)
        outcome: str | LiveLease = "no launch slot within the startup deadline"
        try:
            with trio.move_on_after(template.startup_deadline_s):
                await slot.acquire()
            if slot.held and not (self.stopping or pool.ended):
                outcome = await self._journal_parked(pool, register, engine, slot, parked)
        finally:
            if not isinstance(outcome, LiveLease):  # else its lease task owns both
                slot.release()
                if lease not in self.live:
                    self._release(lease)
        return outcome

    async def _journal_parked(
        self,
        pool: ShapePool,
        register: Register,
        engine: Engine,
        slot: LaunchSlot,
        parked: trio.Event,
    ) -> str | LiveLease:
        live = await self._journal_lease(register, NoPeer(), Intent())
        if isinstance(live, str):
            return live
        live.on_created = lambda container_id: self._parked(
            pool, live, engine, container_id, parked
        )
        self.nursery.start_soon(self._lease_task, live, engine, slot)
        return live

    async def _parked(
        self,
        pool: ShapePool,
        live: LiveLease,
        engine: Engine,
        container_id: str,
        parked: trio.Event,
    ) -> None:
        """Verify, start, and wait for a claim (or the idle limit, or a stop)."""
        try:
            info = await engine.container_inspect(container_id)
            check_created(
                info,
                live.body,
                lease=live.record.lease,
                name=live.record.name,
                container_id=container_id,
                expected_mounts=pool.claim.expected_mounts,
                podman=engine.is_podman,
            )
            await engine.container_start(container_id)
            # A governed network's listeners are in place before the container is parked:
            # a claim hands over a sandbox whose payload finds them there.
            governed = live.network is not None and live.network.needs_governor
            problem = await self._govern(live.record.lease) if governed else None
            if problem is not None:
                raise SbxError(f"governed network: {problem}")
        except SbxError as exc:
            pool.error = f"could not park: {exc}"
            log(f"pool {pool.key[:12]}: {pool.error}")
            live.request_stop(pool.error)
            return
        finally:
            live.intent.started.set()  # its launch slot goes to the next lease
        if self.stopping or pool.ended:
            live.request_stop("its pool ended")
        if live.stop.is_set():
            return
        pool.error = None
        pool.parked.append(live)
        parked.set()
        pool.signal_arrival()
        with trio.move_on_after(pool.terms.idle_ttl_s):
            await first_of(live.claimed, live.stop)
        if not live.claimed.is_set():
            if live in pool.parked:
                pool.parked.remove(live)
            live.request_stop("parked unclaimed for the pool's idle limit")
            pool.wanted.set()

    # -- giving capacity back ----------------------------------------------------------------------

    def _make_room(self, need: Need) -> None:
        """A caller must wait for capacity: parked containers make room, oldest first."""
        freed = 0
        parked = sorted(
            (live for pool in self.pools.values() for live in pool.parked),
            key=lambda live: live.record.registered_at,
        )
        for live in parked:
            if freed and freed >= need.memory_bytes:
                return
            for pool in self.pools.values():
                if live in pool.parked:
                    pool.parked.remove(live)
            live.request_stop("its capacity went to a waiting request")
            freed += live.record.memory_bytes

    async def _end_pool(self, pool: ShapePool) -> None:
        """End one pool now: no more parks; its parked containers removed (bounded wait)."""
        pool.ended = True  # its keeper ends at its next wake-up, and parks under way stop
        pool.signal_arrival()  # claims waiting for a park go cold
        if self.pools.get(pool.key) is pool:
            del self.pools[pool.key]  # a claim from now on starts a new pool
        parked, pool.parked = list(pool.parked), []
        pool.wanted.set()
        for live in parked:
            live.request_stop("its pool was ended")
        with trio.move_on_after(STOP_DRAIN_S):
            for live in parked:
                await live.finished.wait()
            while pool.starting:  # a park under way is removed when it ends
                pool.wanted = trio.Event()  # the keeper was woken above and has ended
                await pool.wanted.wait()

    async def _drain_pools(self) -> None:
        """The supervisor stops: no more parks; every pool ended (parked containers and parks
        under way removed, each pool's wait bounded)."""
        self.stopping = True
        for pool in list(self.pools.values()):
            await self._end_pool(pool)

    async def _recheck_body(self, register: Register) -> tuple[str, str] | None:
        refusal = await self._recheck_register(register)
        return None if refusal is None else (refusal[1], refusal[2])


def _unknown_template_field(payload: bytes) -> str | None:
    """A template body field sbxkit's policy never sets is refused by name, as on Register."""
    try:
        raw = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return "the claim is not JSON"
    template = raw.get("template") if isinstance(raw, dict) else None
    body = template.get("body") if isinstance(template, dict) else None
    unknown = unknown_field(body)
    return None if unknown is None else f"{unknown}: not a field sbxkit's policy sets"
