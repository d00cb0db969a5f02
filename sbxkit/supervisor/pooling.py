"""Pools the supervisor holds (issue 13, docs/pool.md): parked containers that outlive callers.

A ``Claim`` names a shape by a template (``templates.py``). The first claim of a shape starts
its pool; every claim takes the oldest parked container of the shape, if one is parked, and
hands its lease to the claiming connection (``Claimed``) — from there it is that connection's
lease like any other: Close or EOF removes it. With none parked a claim waits only for a park
already under way for it (``sbxkit/_util/parking.py``, the mechanism the in-process pool
shares); otherwise the answer is ``Unclaimed`` and the caller runs cold.

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

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from sbxkit._kernel.fifos import make_io_dir, remove_io_dir, sandbox_ids
from sbxkit._kernel.scripts import GO_LINE, io_dir_of, io_root
from sbxkit._lifecycle.admission import Need, never_fits
from sbxkit._lifecycle.kernel_run import start_on_fifos
from sbxkit._lifecycle.kernel_watch import NotAlive
from sbxkit._lifecycle.owned import set_host_rlimits
from sbxkit._protocol.proof import SECRET_BYTES, secret_hash
from sbxkit._protocol.records import LeaseRecord
from sbxkit._protocol.wire import (
    Claim,
    Claimed,
    HeldPoolState,
    Pools,
    PoolTerms,
    Refused,
    Register,
    Unclaimed,
)
from sbxkit._util.parking import Parking
from sbxkit.engine.client import Engine
from sbxkit.errors import SbxError, StorageError
from sbxkit.supervisor.admitting import Admitting
from sbxkit.supervisor.lease import (
    Intent,
    LaunchSlot,
    LiveLease,
    NoPeer,
    ParkedIO,
    Peer,
    first_of,
    log,
)
from sbxkit.supervisor.recheck import unknown_field
from sbxkit.supervisor.templates import (
    body_for_lease,
    claimed_lifetime,
    mounts_for_lease,
    shape_key,
    template_problem,
)

MAX_SHAPES = 16
PARK_RETRY_S = 1.0  # after a park that did not fit or failed
STOP_DRAIN_S = 10.0


@dataclass(eq=False)
class ShapePool:
    """The parked containers of one shape and what keeps them."""

    key: str
    claim: Claim
    last_claim: float
    parking: Parking[LiveLease] = field(default_factory=Parking)
    """Parked (ready for a claim, oldest first), parks under way, claims waiting for one."""
    in_use: int = 0
    """Parked or claimed and not yet removed."""
    error: str | None = None
    """Why the last park failed (None once one parked)."""
    wanted: trio.Event = field(default_factory=trio.Event)
    ended: bool = False
    parks: int = 0
    """Parks started in the pool's life (``refill=False`` stops at ``size``)."""

    @property
    def parked(self) -> list[LiveLease]:
        return self.parking.ready

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
        taken = await self.take_parked(claim, peer.last_payload)
        if not isinstance(taken, LiveLease):
            await peer.send(taken)
            return None
        live = taken
        live.peer = peer
        claimed, fds = claimed_message(live)
        if fds:  # the kernel path: its ends go to the claimer, never its output or exit
            await peer.send_with_fds(claimed, fds)
        else:
            await peer.send(claimed)
        live.claimed.set()  # parking ends: this supervisor's copies of the ends are closed
        return live

    async def take_parked(
        self, claim: Claim, payload: bytes | None
    ) -> LiveLease | Refused | Unclaimed:
        """Take a parked container of the claim's shape (its new lifetime set); else the answer
        that says why not. The caller hands the lease over and sets ``live.claimed``: a Claim's
        connection (``_claim``), or a run handed to this supervisor (sbxkit/handoff).
        ``payload``: the raw Claim as it came (its template's body is checked for fields
        sbxkit's policy never sets); None for a Claim this process made itself."""
        problem = template_problem(claim)
        if problem is None and payload is not None:
            problem = _unknown_template_field(payload)
        if problem is not None:
            return Refused(code="request", reason=problem, field="template")
        if self.stopping:
            return Unclaimed(reason="the supervisor is stopping")
        key = shape_key(claim)
        pool = self.pools.get(key)
        now = trio.current_time()
        if pool is None and claim.mode == "end":
            return Unclaimed(reason="no pool of this shape is held")
        if pool is None:
            if len(self.pools) >= MAX_SHAPES:
                return Unclaimed(reason=f"{MAX_SHAPES} pools are held already")
            pool = self.pools[key] = ShapePool(key, claim, now)
            self.nursery.start_soon(self._keep_pool, pool)
            log(f"pool {key[:12]}: started (size {claim.terms.size})")
        if claim.mode == "end":
            await self._end_pool(pool)
            return Unclaimed(reason="the pool ended; its parked containers are removed")
        pool.claim, pool.last_claim = claim, now  # the latest terms hold
        self._fill(pool)  # a new pool's first parks start now: this claim may wait for one
        pool.wanted.set()
        live = None
        if claim.mode == "take":
            live = await pool.parking.take_or_wait(lambda: pool.ended or pool.error is not None)
        if live is None:
            reason = "nothing parked of this shape yet; the pool is filling"
            return Unclaimed(reason=reason, parked=len(pool.parked), problem=pool.error)
        # However long it was parked, the claimed run keeps the lifetime its claim implies.
        lifetime_s = claimed_lifetime(claim)
        live.lifetime_deadline = trio.current_time() + lifetime_s
        live.record = msgspec.structs.replace(
            live.record, lifetime_deadline=time.time() + lifetime_s
        )
        self.records[live.record.lease] = live.record
        self.nursery.start_soon(self._journal_later, live.record)  # off the claim's path
        return live

    async def _journal_later(self, record: LeaseRecord) -> None:
        """Journal a claimed lease's new lifetime deadline. Not on the claim's path: until it
        is durable, recovery holds the parked deadline (sooner or later, never a leak). Queued
        in submission order, so it is written before the lease's own later delete."""
        if self.records.get(record.lease) is not record:
            return  # already ended (or changed again): nothing to write
        try:
            await self.journal.write(record)
        except (OSError, StorageError) as exc:
            self.storage_errors.append(f"journal write failed: {exc}")
            log(f"lease {record.lease}: {exc}")

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
                if pool.error is not None and pool.parking.starting == 0:
                    await trio.sleep(PARK_RETRY_S)  # e.g. a full host: claims run cold meanwhile
        finally:
            pool.ended = True
            pool.parking.changed()  # claims waiting for a park go cold
            if self.pools.get(pool.key) is pool:
                del self.pools[pool.key]
            for live in pool.parked:
                live.request_stop("its pool ended")
            pool.parked.clear()

    def _fill(self, pool: ShapePool) -> None:
        """Start parks until ``size`` are starting, parked or in use."""
        while (
            pool.parking.starting + pool.in_use < pool.terms.size
            and not (pool.ended or self.stopping)
            and (pool.terms.refill or pool.parks < pool.terms.size)
        ):
            pool.parking.starting += 1
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
            pool.parking.starting -= 1
            pool.in_use += 1
            try:
                await outcome.finished.wait()
            finally:
                pool.in_use -= 1
        finally:
            if not parked.is_set():
                pool.parking.starting -= 1
                pool.parking.changed()  # a claim waiting for this park goes cold
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
        problem = self._request_problem(register) or await self._storage_problem()
        if problem is not None:
            return problem
        outcome: str | LiveLease = "not parked"
        try:
            if io_dir_of(register.body) is not None:  # the kernel path: its FIFOs first
                root = io_root(self.state.path)
                make_io_dir(root, lease, *sandbox_ids(register.body.user))
            outcome = await self._admit_park(pool, register, parked)
        except (OSError, SbxError) as exc:
            outcome = f"could not make its FIFOs: {exc}"
        finally:
            if not isinstance(outcome, LiveLease):
                remove_io_dir(io_root(self.state.path), lease)
        return outcome

    async def _admit_park(
        self, pool: ShapePool, register: Register, parked: trio.Event
    ) -> str | LiveLease:
        lease = register.lease
        refusal = await self._recheck_body(register)
        if refusal is not None:
            return f"refused {refusal[0]}: {refusal[1]}"
        taken = self._hold_uid(register)  # a taken uid: the next round parks under a new lease
        if taken is not None:
            return taken
        try:
            return await self._admit_park_held(pool, register, parked)
        finally:
            if lease not in self.records:
                self.let_uid_go(lease)  # not journaled: nothing of it can exist

    async def _admit_park_held(
        self, pool: ShapePool, register: Register, parked: trio.Event
    ) -> str | LiveLease:
        template, lease = pool.claim.template, register.lease
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
        # Its secret is made here and handed to its claimer: a claimed run re-adopts its
        # lease with it if this supervisor dies (proof.py), with no journal write on the claim.
        secret = secrets.token_hex(SECRET_BYTES)
        register = msgspec.structs.replace(register, secret_hash=secret_hash(secret))
        live = await self._journal_lease(register, NoPeer(), Intent())
        if isinstance(live, str):
            return live
        live.parked_secret = secret
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
        """Verify, start (on its FIFOs on the kernel path), and wait for a claim (or the idle
        limit, or a stop); the FIFO ends this supervisor held are closed when it returns."""
        try:
            await self._verify_and_start(pool, live, engine, container_id)
            await self._wait_for_claim(pool, live, parked)
        finally:
            if live.parked_io is not None:
                await live.parked_io.io.aclose()

    async def _verify_and_start(
        self, pool: ShapePool, live: LiveLease, engine: Engine, container_id: str
    ) -> None:
        template = pool.claim.template
        assert live.body is not None  # a parked container was created from its body
        io_dir = io_dir_of(live.body)
        try:
            info = await engine.container_inspect(container_id)
            # Rootless Podman drops the ulimits: set from the host before the claim.
            host_rlimits = engine.is_podman and (await engine.podman_host()).security.rootless
            live.check_created(
                info,
                container_id,
                expected_mounts=mounts_for_lease(
                    pool.claim.expected_mounts, template.lease, live.record.lease
                ),
                podman=engine.is_podman,
                rlimits_by_host=host_rlimits,
            )

            async def start() -> None:
                await engine.container_start(container_id)
                if host_rlimits:
                    assert live.body is not None
                    await set_host_rlimits(engine, container_id, live.body)
                # A governed network's listeners are in place before the container is parked:
                # a claim hands over a sandbox whose payload finds them there.
                governed = live.network is not None and live.network.needs_governor
                problem = await self.govern_lease(live.record.lease) if governed else None
                if problem is not None:
                    raise SbxError(f"governed network: {problem}")

            if io_dir is None:
                await start()
            else:
                host = template.body.host_config
                runtime = host.runtime if host is not None else None
                started = await start_on_fifos(engine, container_id, io_dir, start, runtime=runtime)
                live.parked_io = ParkedIO(*started)
                await started[0].stdin.send_all(GO_LINE)  # the parked shell reads its claim now
        except (SbxError, NotAlive, OSError) as exc:
            pool.error = f"could not park: {exc}"
            log(f"pool {pool.key[:12]}: {pool.error}")
            live.request_stop(pool.error)
        finally:
            live.intent.started.set()  # its launch slot goes to the next lease

    async def _wait_for_claim(self, pool: ShapePool, live: LiveLease, parked: trio.Event) -> None:
        if self.stopping or pool.ended:
            live.request_stop("its pool ended")
        if live.stop.is_set():
            return
        pool.error = None
        parked.set()
        pool.parking.park(live)
        with trio.move_on_after(pool.terms.idle_ttl_s):
            await first_of(live.claimed, live.stop)
        if not live.claimed.is_set():
            if live in pool.parked:
                pool.parked.remove(live)
            live.request_stop("parked unclaimed for the pool's idle limit")
            pool.wanted.set()

    # -- the operator's requests (sbxkit pools list / end) -----------------------------------------

    def held_pools(self, shape: str | None = None) -> list[HeldPoolState]:
        """The pools held (those whose shape key starts with ``shape``), oldest claim first."""
        now = trio.current_time()
        chosen = [p for p in self.pools.values() if shape is None or p.key.startswith(shape)]
        return [
            HeldPoolState(
                shape=pool.key,
                image=pool.claim.template.body.image,
                size=pool.terms.size,
                parked=len(pool.parked),
                starting=pool.parking.starting,
                claimed=pool.in_use - len(pool.parked),
                idle_s=now - pool.last_claim,
                idle_ttl_s=pool.terms.idle_ttl_s,
                problem=pool.error,
            )
            for pool in sorted(chosen, key=lambda pool: pool.last_claim)
        ]

    async def end_pools(self, shape: str | None) -> Pools:
        """End the pool whose shape key starts with ``shape`` (exactly one must), or all."""
        ending = self.held_pools(shape)
        if shape is not None and len(ending) != 1:
            problem = "no held pool" if not ending else f"{len(ending)} held pools"
            return Pools(pools=ending, problem=f"{problem} has a shape starting with {shape!r}")
        for state in ending:
            pool = self.pools.get(state.shape)
            if pool is not None:
                log(f"pool {pool.key[:12]}: ended by an operator")
                await self._end_pool(pool)
        return Pools(pools=ending)

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
        pool.parking.changed()  # claims waiting for a park go cold
        if self.pools.get(pool.key) is pool:
            del self.pools[pool.key]  # a claim from now on starts a new pool
        parked = list(pool.parked)
        pool.parked.clear()
        pool.wanted.set()
        for live in parked:
            live.request_stop("its pool was ended")
        with trio.move_on_after(STOP_DRAIN_S):
            for live in parked:
                await live.finished.wait()
            while pool.parking.starting:  # a park under way is removed when it ends
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


def claimed_message(live: LiveLease) -> tuple[Claimed, list[int]]:
    """The ``Claimed`` a taken lease is handed over with, and the ends that ride with it (the
    kernel path's: stdin, stdout, stderr, the init's pidfd when held; [] on the daemon's)."""
    container_id = live.record.container_id or ""
    claimed = Claimed(
        lease=live.record.lease,
        name=live.record.name,
        container_id=container_id,
        secret=live.parked_secret,  # the claimer's now, and only its (re-adoption's proof)
    )
    live.parked_secret = None
    if live.parked_io is None:
        return claimed, []
    fds = live.parked_io.fds()
    claimed = msgspec.structs.replace(claimed, fds=len(fds), evidence=live.parked_io.evidence)
    return claimed, fds


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
