"""Re-adoption (issue 22): a caller whose supervisor died carries its lease on in this one.

At startup every live, verified container of an intact record is held for the grace period
(``--adopt-grace``) instead of being removed (recovery.py, ``hold_left``). A caller that noticed
its connection drop reconnects and sends ``Adopt`` with the lease's secret (proof.py). Here:

- the lease must have a record, belong to no connection (no lease is ever owned by two), and
  the secret must be its current one (or the retry of an adoption whose answer was lost); a
  wrong or replayed secret is refused and logged, and the record stays recovery's;
- a ``created`` lease must still be held and its container still carry the lease's label; an
  interrupted create (``creating``/``uncertain``, the caller never heard ``Created``) is taken
  over only if its container appears within ``CREATE_APPEARS_S``, never started — or started by
  the previous supervisor's launch (``Register.launch``, sent beside the created record's fsync)
  with its shell still waiting for the caller's go line — else its tombstone rules hold;
- a governed lease is refused: its listeners were the dead supervisor's sockets;
- the next secret's hash is journaled (fsync'd) before ``Adopted`` is sent, and the lease then
  lives as any other (``lifecycle.py``) with its original lifetime deadline.

Recovery and an adoption never work on one lease at once: a pass skips the leases in
``adopting``, and an Adopt waits for a pass that is resolving its lease (``recovering``).
"""

from __future__ import annotations

import time

import trio

from sbxkit.admission import Need
from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerInspect
from sbxkit.errors import NotFound, SbxError
from sbxkit.kernel.scripts import IO_TARGET
from sbxkit.ownership import carries_lease, find_lease_container
from sbxkit.supervisor import records as rec
from sbxkit.supervisor.lease import Intent, LiveLease, Replies, log
from sbxkit.supervisor.lifecycle import Leases
from sbxkit.supervisor.proof import check_proof, refusal_reason, rotated
from sbxkit.supervisor.records import LeaseRecord, StorageError
from sbxkit.supervisor.wire import Adopt, Adopted, Closed, Unadopted

CREATE_APPEARS_S = 5.0
"""How long an interrupted create's container may take to appear for its re-adopting caller:
a create the previous supervisor sent lands in well under a second here."""
CREATE_POLL_S = 0.1


def _launched_waiting(info: ContainerInspect) -> bool:
    """A kernel path container that runs: the previous supervisor's launch may have started it
    before its created record was durable. Its payload waits for the go line its caller writes
    on the sandbox's stdin, so nothing of the payload ran; the caller checks the container
    against its plan, as after any create, before it writes that line."""
    waits = any(
        m.type == "bind" and m.destination == IO_TARGET and not m.rw for m in info.mounts or []
    )
    return waits and info.state.running and info.state.status == "running"


class _NotAdopted(Exception):
    """Why an adoption stops (answered ``Unadopted`` with ``record``)."""

    def __init__(self, reason: str, *, record: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.record = record


class Adopting(Leases):
    def hold_for_adoption(self) -> None:
        """At startup: hold every intact ``created`` record that can be re-adopted for the
        grace period (recovery removes its container only once the hold ends)."""
        grace = self.config.adopt_grace_s
        if grace <= 0:
            return
        until = trio.current_time() + grace
        now = time.time()
        for record in self.records.values():
            if (
                record.state == "created"
                and record.secret_hash is not None
                and not record.governed
                and record.lifetime_deadline > now
            ):
                self.held[record.lease] = until
        if self.held:
            log(
                f"holding {len(self.held)} lease(s) up to {grace:g} s for their callers to re-adopt"
            )

    async def _adopt(self, peer: Replies, adopt: Adopt) -> LiveLease | None:
        """Answer an Adopt: the re-adopted lease (now the peer's), or None (answered)."""
        lease = adopt.lease
        if not rec.LEASE_ID.fullmatch(lease):
            reason = "lease id must be 32 lowercase hex digits"
            await peer.send(Unadopted(lease=lease[:64], reason=reason, record=False))
            return None
        while lease in self.recovering:  # a recovery pass is resolving it: take its verdict
            await self.recovery_done.wait()
        try:
            record = self._adoptable(adopt)
            self.adopting.add(lease)  # no await since the checks: recovery skips it from here
            try:
                return await self._take_over(peer, adopt, record)
            finally:
                self.adopting.discard(lease)
        except _NotAdopted as refusal:
            self.note(f"lease {lease}: not re-adopted: {refusal.reason}")
            await peer.send(Unadopted(lease=lease, reason=refusal.reason, record=refusal.record))
            return None

    def _adoptable(self, adopt: Adopt) -> LeaseRecord:
        """The record ``adopt`` may take over (checked without waiting), else _NotAdopted."""
        lease = adopt.lease
        record = self.records.get(lease)
        if record is None:
            raise _NotAdopted(
                "no record of the lease: nothing was journaled for it, or it ended", record=False
            )
        proof = check_proof(record, adopt.secret, adopt.next_secret_hash)
        if proof not in ("accepted", "retried"):
            raise _NotAdopted(f"refused: {refusal_reason(proof)}")
        if lease in self.live or lease in self.adopting:
            raise _NotAdopted("the lease is owned by another connection")
        if record.governed:
            self._end_hold(lease)
            raise _NotAdopted(
                "its governed network's listeners died with the previous supervisor; a "
                "governed lease is not re-adopted, recovery removes its container"
            )
        if record.lifetime_deadline <= time.time():
            self._end_hold(lease)
            raise _NotAdopted("its lifetime deadline passed; recovery removes its container")
        if record.state == "created" and lease not in self.held:
            raise _NotAdopted("its hold for re-adoption ended; recovery removes its container")
        return record

    def _end_hold(self, lease: str) -> None:
        self.held.pop(lease, None)
        self.wake_reaper.set()

    async def _take_over(
        self, peer: Replies, adopt: Adopt, original: LeaseRecord
    ) -> LiveLease | None:
        lease, record = adopt.lease, original
        try:
            engine = await self.engine_for(record.engine_socket)
            if record.state == "created":
                container_id = await self._verified(engine, record)
            else:
                container_id = await self._interrupted_create(engine, record)
                record = rec.adopted_create(record, container_id)
                self.uncertain_changed.set()
        except SbxError as exc:
            raise _NotAdopted(f"the daemon did not answer: {exc}") from exc
        if container_id is None:  # gone: the record is released, the lease over
            await self._forget(lease)
            self.note(f"lease {lease}: its container is already gone; record released")
            await peer.send(Closed(lease=lease))
            return None
        if check_proof(original, adopt.secret, adopt.next_secret_hash) == "accepted":
            record = rotated(record, adopt.secret, adopt.next_secret_hash)
        if record is not original:
            self.records[lease] = record
            try:
                await self.journal.write(record)  # durable before the caller hears Adopted
            except (OSError, StorageError) as exc:
                self.records[lease] = original
                self.storage_errors.append(f"journal write failed: {exc}")
                raise _NotAdopted(f"journal write failed: {exc}") from exc
        now = trio.current_time()
        left = record.lifetime_deadline - time.time()
        live = LiveLease(record, None, peer, Intent(), now, now + left)
        live.intent.started.set()  # no launch slot to hand on: it was started, or will be
        self.live[lease] = live
        self.held.pop(lease, None)
        self._count_running(record)
        self.note(
            f"lease {lease}: re-adopted by its caller (container {container_id[:12]}, "
            f"{left:.0f} s left of its lifetime)"
        )
        await peer.send(Adopted(lease=lease, container_id=container_id))
        self.nursery.start_soon(self._lease_task, live, engine, None, container_id)
        return live

    def _count_running(self, record: LeaseRecord) -> None:
        """A re-adopted lease is a live sandbox again (its memory was held all along)."""
        lease = record.lease
        if self.admission.is_admitted(lease):
            self.admission.start_running(lease)
        else:
            self.admission.hold(lease, Need(record.memory_bytes, record.nano_cpus), running=True)

    async def _verified(self, engine: Engine, record: LeaseRecord) -> str | None:
        """The held container's id once the daemon shows it carrying the lease's label;
        None if it is gone."""
        assert record.container_id is not None
        try:
            info = await engine.container_inspect(record.container_id)
        except NotFound:
            return None
        if not carries_lease(info.config.labels, record.lease):
            raise _NotAdopted("its container is labelled for another lease; recovery keeps it")
        return record.container_id

    async def _interrupted_create(self, engine: Engine, record: LeaseRecord) -> str:
        """The container of a create the previous supervisor did not get to answer, once it
        shows up never started (or launched, its shell waiting: ``_launched_waiting``) and as
        admitted; else _NotAdopted (tombstone rules hold)."""
        found: str | None = None
        with trio.move_on_after(CREATE_APPEARS_S):
            while found is None:
                found = await find_lease_container(engine, record.lease, record.name)
                if found is None:
                    await trio.sleep(CREATE_POLL_S)
        if found is None:
            raise _NotAdopted(
                f"its create was interrupted and no container of it appeared within "
                f"{CREATE_APPEARS_S:g} s; the record stays recovery's (an uncertain create)"
            )
        info = await engine.container_inspect(found)
        host = info.host_config
        if info.state.status != "created" and not _launched_waiting(info):
            problem = f"its container is {info.state.status}, never started by its caller"
        elif host.memory != record.memory_bytes or host.nano_cpus != record.nano_cpus:
            problem = "its container's limits differ from the admitted reservation"
        else:
            return found
        self.wake_reaper.set()  # recovery removes it
        raise _NotAdopted(f"{problem}; recovery removes it")
