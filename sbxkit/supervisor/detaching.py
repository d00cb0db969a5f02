"""Detached leases (issue 40): a session handed to another process of the same account.

A caller detaches its live lease (``Detach``, on the lease's connection) with the hash of a
fresh secret that only the handle it gives away carries. Here:

- the lease's record gets that hash (the caller's own secret is spent) and its keep deadline,
  ``detached_until``, at most its lifetime deadline; both are journaled (fsync'd) before
  ``Detached`` is answered, and from then the caller's connection ends nothing;
- the lease lives on in this process as any other (its lifetime deadline, its disk bound), its
  answers going nowhere, until someone reattaches it — ``Adopt`` with the handle's secret,
  checked as a re-adoption's is (proof.py): the next hash is journaled, the lease is the new
  connection's, and its end (Close, EOF) removes the container as before;
- a lease nobody reattached by its keep deadline is removed; a supervisor restarted meanwhile
  holds the detached record until that deadline (``hold_for_adoption``) and then recovery
  removes it, or honours a reattach before it (adopting.py's take-over);
- a wrong or spent secret, an unknown lease, one that is carried by a connection: refused,
  logged, the lease untouched. The secret itself is never logged.
"""

from __future__ import annotations

import time

import trio

from sbxkit._protocol.proof import check_proof, detach_problem, handed_over, refusal_reason, rotated
from sbxkit._protocol.wire import Adopt, Adopted, Detach, Detached, Unadopted
from sbxkit.errors import StorageError
from sbxkit.supervisor.adopting import Adopting
from sbxkit.supervisor.lease import LiveLease, NoPeer, Replies, first_of, log


class Detaching(Adopting):
    async def detach_lease(self, detach: Detach) -> Detached:
        """Hand ``detach.lease`` over to this supervisor's keeping (journaled), or say why not
        (the lease then goes on, attached)."""
        lease = detach.lease
        live = self.live.get(lease)
        now = time.time()
        if live is None or live.stop.is_set() or live.kept is not None:
            problem: str | None = "the lease is not live"
        else:
            problem = detach_problem(live.record, detach.secret_hash, detach.keep_s, now)
        if problem is not None or live is None:
            log(f"lease {lease}: not detached: {problem}")
            return Detached(lease=lease, problem=problem)
        original = live.record
        record = handed_over(original, detach.secret_hash, now + detach.keep_s)
        until = record.detached_until
        assert until is not None
        self.records[lease] = live.record = record
        try:
            await self.journal.write(record)  # durable before the caller hears Detached
        except (OSError, StorageError) as exc:
            self.records[lease] = live.record = original
            self.storage_errors.append(f"journal write failed: {exc}")
            return Detached(lease=lease, problem=f"journal write failed: {exc}")
        live.peer = NoPeer()
        self._keep(live, until)
        self.note(f"lease {lease}: detached by its caller; kept {until - now:.1f} s for a reattach")
        return Detached(lease=lease, until=until)

    def _keep(self, live: LiveLease, until: float) -> None:
        """Keep ``live`` detached until ``until`` (unix seconds), then end it."""
        kept = trio.Event()
        live.kept = kept
        at = trio.current_time() + (until - time.time())
        self.nursery.start_soon(self._keep_detached, live, kept, at)

    async def _keep_detached(self, live: LiveLease, kept: trio.Event, at: float) -> None:
        with trio.move_on_at(at):
            await first_of(kept, live.finished)
        if kept.is_set() or live.finished.is_set() or live.stop.is_set():
            return
        self.note(
            f"lease {live.record.lease}: detached and not reattached by its keep deadline; "
            "removing its container"
        )
        live.request_stop("detached, not reattached by its keep deadline")

    async def adopt_lease(self, peer: Replies, adopt: Adopt) -> LiveLease | None:
        """An Adopt for a detached live lease reattaches it; any other is a re-adoption."""
        live = self.live.get(adopt.lease)
        if live is None or live.kept is None:
            return await super().adopt_lease(peer, adopt)
        return await self._reattach(peer, adopt, live)

    async def _reattach(self, peer: Replies, adopt: Adopt, live: LiveLease) -> LiveLease | None:
        lease = adopt.lease
        kept = live.kept
        assert kept is not None
        proof = check_proof(live.record, adopt.secret, adopt.next_secret_hash)
        ended = live.stop.is_set()
        if ended:
            reason = "its keep deadline passed (or it ended); its container is being removed"
        elif proof != "accepted":  # a retry only makes sense after a restart (adopting.py)
            reason = f"refused: {refusal_reason('replayed' if proof == 'retried' else proof)}"
        else:
            reason = ""
        if reason:
            self.note(f"lease {lease}: not reattached: {reason}")
            await peer.send(Unadopted(lease=lease, reason=reason, record=True, ended=ended))
            return None
        live.kept = None  # no second reattach, and the keep deadline stands down
        kept.set()
        original = live.record
        record = rotated(original, adopt.secret, adopt.next_secret_hash)
        self.records[lease] = live.record = record
        try:
            await self.journal.write(record)  # durable before the new caller hears Adopted
        except (OSError, StorageError) as exc:
            self.records[lease] = live.record = original
            self.storage_errors.append(f"journal write failed: {exc}")
            assert original.detached_until is not None
            self._keep(live, original.detached_until)
            reason = f"journal write failed: {exc}"
            self.note(f"lease {lease}: not reattached: {reason}")
            await peer.send(Unadopted(lease=lease, reason=reason, record=True))
            return None
        live.peer = peer
        live.intent.detached = trio.Event()  # this connection's end ends the lease again
        container_id = record.container_id
        assert container_id is not None
        left = live.lifetime_deadline - trio.current_time()
        self.note(
            f"lease {lease}: reattached by a new caller (container {container_id[:12]}, "
            f"{left:.0f} s left of its lifetime)"
        )
        await peer.send(Adopted(lease=lease, container_id=container_id))
        return live

    def hold_for_adoption(self) -> None:
        """At startup: a detached record is held until its keep deadline (not for the grace
        period: no caller is connected to re-adopt it), for its reattach; recovery removes its
        container then."""
        super().hold_for_adoption()
        now, clock = time.time(), trio.current_time()
        kept = 0
        for record in self.records.values():
            until = record.detached_until
            if record.state != "created" or until is None or record.secret_hash is None:
                continue
            left = min(until, record.lifetime_deadline) - now
            if left <= 0:  # its keep ended while no supervisor ran: no grace for a reattach
                self.held.pop(record.lease, None)
                continue
            self.held[record.lease] = clock + left  # nobody is connected to re-adopt it sooner
            kept += 1
        if kept:
            log(f"holding {kept} detached lease(s) until their keep deadlines for a reattach")
