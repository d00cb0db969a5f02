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
- a governed lease's listeners were the dead supervisor's sockets: its egress is closed from
  the crash on (nothing listens in the sandbox). It is held like any other, and an Adopt that
  brings its terms (``Adopt.network``, what the caller registered) has them bound in the
  sandbox again — entered as the first governor did (governor.py, netns.py) — before
  ``Adopted``; if they cannot be, it is refused and recovery removes the container at once.
  One re-adopted without its terms (a handed-off run resumed once it ended) stays closed;
- the next secret's hash is journaled (fsync'd) before ``Adopted`` is sent, and the lease then
  lives as any other (``lifecycle.py``) with its original lifetime deadline.

Recovery and an adoption never work on one lease at once: a pass skips the leases in
``adopting``, and an Adopt waits for a pass that is resolving its lease (``recovering``).
"""

from __future__ import annotations

import time

import trio

from sbxkit._kernel.scripts import IO_TARGET
from sbxkit._lifecycle.admission import Need
from sbxkit._lifecycle.ownership import carries_lease, find_lease_container
from sbxkit._model.network_allow import parse_allow_list
from sbxkit._model.network_inject import inject_terms_problem
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._model.spec import body_ids
from sbxkit._plan.network_planning import managed_gateway_problem
from sbxkit._protocol import records as rec
from sbxkit._protocol.proof import check_proof, refusal_reason, rotated
from sbxkit._protocol.records import LeaseRecord
from sbxkit._protocol.wire import Adopt, Adopted, Closed, Unadopted
from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerInspect
from sbxkit.errors import NotFound, SbxError, SpecError, StorageError
from sbxkit.network.governor import Governor
from sbxkit.supervisor.lease import Intent, LiveLease, Replies, log
from sbxkit.supervisor.lifecycle import Leases

CREATE_APPEARS_S = 5.0
"""How long an interrupted create's container may take to appear for its re-adopting caller:
a create the previous supervisor sent lands in well under a second here."""
CREATE_POLL_S = 0.1


def terms_problem(terms: NetworkTerms | None, governed: bool) -> str | None:
    """Why an Adopt's network terms cannot govern the lease (pure): they must parse as a
    Register's do (recheck.py), and come only for a lease registered governed."""
    if terms is None or not terms.needs_governor:
        return None
    if not governed:
        return "it registered no governed network; an Adopt cannot add one"
    try:
        parse_allow_list(terms.allow, "network.allow")
    except SpecError as exc:
        return f"its network terms: {exc.field}: {exc.rule}"
    if terms.mode == "managed" and terms.allow:
        return "its network terms: a managed network takes no allow-list"
    if terms.mode == "none" and (terms.gateway or terms.network_name):
        return "its network terms: only the managed network has a gateway"
    inject = inject_terms_problem(terms.inject, terms.allow, terms.mode)
    if inject is not None:
        return f"its network terms: network.inject{inject}"
    if terms.audit_log is not None and not terms.audit_log.startswith("/"):
        return "its network terms: the audit log must be an absolute path"
    return None


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

    def __init__(self, reason: str, *, record: bool = True, ended: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.record = record
        self.ended = ended


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
                and record.lifetime_deadline > now
            ):
                self.held[record.lease] = until
        if self.held:
            log(
                f"holding {len(self.held)} lease(s) up to {grace:g} s for their callers to re-adopt"
            )

    async def adopt_lease(self, peer: Replies, adopt: Adopt) -> LiveLease | None:
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
            await peer.send(
                Unadopted(
                    lease=lease, reason=refusal.reason, record=refusal.record, ended=refusal.ended
                )
            )
            return None

    def _adoptable(self, adopt: Adopt) -> LeaseRecord:
        """The record ``adopt`` may take over (checked without waiting), else _NotAdopted."""
        lease = adopt.lease
        record = self.records.get(lease)
        if record is None:
            raise _NotAdopted(
                "no record of the lease: nothing was journaled for it, or it ended",
                record=False,
                ended=True,
            )
        proof = check_proof(record, adopt.secret, adopt.next_secret_hash)
        if proof not in ("accepted", "retried"):
            raise _NotAdopted(f"refused: {refusal_reason(proof)}")
        if lease in self.live or lease in self.adopting:
            raise _NotAdopted("the lease is owned by another connection")
        problem = terms_problem(adopt.network, record.governed)
        if problem is not None:
            raise _NotAdopted(problem)
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
        info: ContainerInspect | None = None
        try:
            engine = await self.engine_for(record.engine_socket)
            if record.state == "created":
                info = await self._verified(engine, record)
                container_id = None if info is None else record.container_id
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
        terms = adopt.network if record.governed else None
        governor = None
        if terms is not None and terms.needs_governor and info is not None:
            governor = await self._govern_again(engine, record, terms, info)
        if check_proof(original, adopt.secret, adopt.next_secret_hash) == "accepted":
            record = rotated(record, adopt.secret, adopt.next_secret_hash)
        if record is not original:
            self.records[lease] = record
            try:
                await self.journal.write(record)  # durable before the caller hears Adopted
            except (OSError, StorageError) as exc:
                self.records[lease] = original
                self.storage_errors.append(f"journal write failed: {exc}")
                if governor is not None:
                    governor.close()
                raise _NotAdopted(f"journal write failed: {exc}") from exc
        now = trio.current_time()
        left = record.lifetime_deadline - time.time()
        live = LiveLease(record, None, peer, Intent(), now, now + left, network=terms)
        live.governor = governor
        live.intent.started.set()  # no launch slot to hand on: it was started, or will be
        self.live[lease] = live
        self.held.pop(lease, None)
        self._count_running(record)
        egress = ""
        if record.governed:
            egress = (
                "; its governed network's listeners bound again"
                if governor is not None
                else "; its governed network stays closed"
                if terms is None
                else "; its governed network goes in once its caller asks"
            )
        self.note(
            f"lease {lease}: re-adopted by its caller (container {container_id[:12]}, "
            f"{left:.0f} s left of its lifetime{egress})"
        )
        await peer.send(Adopted(lease=lease, container_id=container_id))
        self.nursery.start_soon(self._lease_task, live, engine, None, container_id)
        return live

    async def _govern_again(
        self, engine: Engine, record: LeaseRecord, terms: NetworkTerms, info: ContainerInspect
    ) -> Governor | None:
        """A re-adopted running sandbox's listeners, bound again (the TLS bundle and the hosts
        line are the first governor's, left as they are); None for a sandbox that does not
        run (never started: its caller asks, as after a create; or its payload ended and
        nothing more goes out). A running sandbox whose listeners cannot be put back is not
        re-adopted: its hold ends and recovery removes it at once."""
        if not info.state.running:
            return None
        assert record.container_id is not None
        try:
            if terms.mode == "managed":
                problem = await managed_gateway_problem(engine, terms)
                if problem is not None:
                    raise SbxError(problem)
            governor = Governor(record.lease, terms, user=_sandbox_user(info))
            await self.nursery.start(governor.run, engine, record.container_id)
        except (SbxError, OSError) as exc:
            self._end_hold(record.lease)
            raise _NotAdopted(
                f"its governed network could not be put back ({exc}); recovery removes it"
            ) from exc
        return governor

    async def govern_lease(self, lease: str) -> str | None:
        """``Leases.govern_lease``, and for a lease re-adopted before its container started (no
        body here): the caller's Govern after its start, as the user its container runs as."""
        live = self.live.get(lease)
        if (
            live is None
            or live.body is not None
            or live.governor is not None
            or live.network is None
            or not live.network.needs_governor
            or live.record.container_id is None
        ):
            return await super().govern_lease(lease)
        try:
            engine = await self.engine_for(live.record.engine_socket)
            info = await engine.container_inspect(live.record.container_id)
            user = _sandbox_user(info)
            governor = Governor(lease, live.network, user=user)
            await self.nursery.start(governor.run, engine, live.record.container_id)
        except (SbxError, OSError) as exc:
            log(f"lease {lease}: governed network refused: {exc}")
            return str(exc.rule if isinstance(exc, SpecError) else exc)
        live.governor = governor
        if live.stop.is_set():
            governor.close()  # ended meanwhile: nothing to serve
        return None

    def _count_running(self, record: LeaseRecord) -> None:
        """A re-adopted lease is a live sandbox again (its memory was held all along)."""
        lease = record.lease
        if self.admission.is_admitted(lease):
            self.admission.start_running(lease)
        else:
            self.admission.hold(lease, Need(record.memory_bytes, record.nano_cpus), running=True)

    async def _verified(self, engine: Engine, record: LeaseRecord) -> ContainerInspect | None:
        """The held container's inspection once the daemon shows it carrying the lease's
        label; None if it is gone."""
        assert record.container_id is not None
        try:
            info = await engine.container_inspect(record.container_id)
        except NotFound:
            return None
        if not carries_lease(info.config.labels, record.lease):
            raise _NotAdopted("its container is labelled for another lease; recovery keeps it")
        return info

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


def _sandbox_user(info: ContainerInspect) -> tuple[int, int]:
    """The uid:gid the sandbox runs as (the TLS bundle's owner), from its inspection."""
    return body_ids(info.config.user or "")
