"""Admission in the supervisor: check a registration, wait in the fair FIFO queue (nothing is
journaled while waiting), take a launch slot, journal the lease and start its task. The state
directory is audited afresh at every admission; a caller waiting for capacity or a launch slot
hears ``Queued`` at least every second, and the admission deadline bounds both waits.

The rules are ``sbxkit/_lifecycle/admission.py``'s; docs/operations.md, "Capacity and admission".
"""

from __future__ import annotations

import math
import os
import time
from typing import Literal

import msgspec
import trio

from sbxkit._kernel.fifos import io_dir_problem
from sbxkit._kernel.scripts import io_dir_of
from sbxkit._lifecycle.admission import Budget, Need, default_memory_budget, never_fits
from sbxkit._lifecycle.uid_holds import hold_own_uid
from sbxkit._model.rules import PODMAN_AUTO_WITNESS, PODMAN_ROOT_REFUSED, ROOT_INSIDE_REFUSED
from sbxkit._model.spec import ROOT_USER
from sbxkit._plan.network_planning import managed_gateway_problem
from sbxkit._plan.preflight import planned_root_witness, root_inside_witness
from sbxkit._protocol import records as rec
from sbxkit._protocol.proof import is_well_formed
from sbxkit._protocol.records import LeaseRecord
from sbxkit._protocol.wire import Closed, Queued, RefusalCode, Refused, Register, Registered
from sbxkit.engine.client import Engine
from sbxkit.errors import NotFound, SbxError, StorageError
from sbxkit.supervisor.config import launch_bound
from sbxkit.supervisor.lease import (
    Caller,
    Intent,
    LaunchSlot,
    LiveLease,
    Replies,
    log,
)
from sbxkit.supervisor.lifecycle import Leases
from sbxkit.supervisor.recheck import (
    engine_socket_problem,
    recheck_body,
    unknown_field,
    volume_backing_problem,
)

QUEUED_HEARTBEAT_S = 1.0  # a waiting caller hears from us at least this often


class Admitting(Leases):
    def _request_problem(self, register: Register) -> str | None:
        lease = register.lease
        if not rec.LEASE_ID.fullmatch(lease):
            return "lease id must be 32 lowercase hex digits"
        if register.name != f"sbxkit-{lease}":
            return f"container name must be sbxkit-{lease}"
        host = register.body.host_config
        reservation = register.reservation
        if (
            host is None
            or host.memory != reservation.memory_bytes
            or (host.nano_cpus != reservation.nano_cpus)
        ):
            return "the reservation must equal the body's Memory and NanoCpus"
        if reservation.memory_bytes <= 0 or reservation.nano_cpus <= 0:
            return "the reservation must be bounded"
        for value in (register.startup_deadline_s, register.lifetime_deadline_s):
            if not (math.isfinite(value) and value > 0):
                return "deadlines must be finite and positive"
        if not register.engine_socket.startswith("/"):
            return "engine_socket must be an absolute path"
        if register.secret_hash is not None and not is_well_formed(register.secret_hash):
            return "secret_hash must be 64 lowercase hex digits (a sha256)"
        if register.launch is not None:
            if io_dir_of(register.body) is None:
                return "launch: only a body whose payload waits for its go line (the kernel path)"
            if register.network is not None and register.network.needs_governor:
                return "launch: not with a governed network (its listeners go in after the start)"
        if lease in self.records or lease in self.live:
            return "lease id already in use"
        return None

    def _recheck(self, payload: bytes, register: Register) -> tuple[RefusalCode, str, str] | None:
        """The second line of defence: the socket the caller names, then the body's invariants
        (recheck.py); (code, field, reason) of the first refusal. Blocking (it looks at the
        body's paths): call it from a worker thread."""
        refusal = self._socket_refusal(register)
        if refusal is not None:
            return refusal
        try:
            raw = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            raw = {}
        unknown = unknown_field(raw.get("body") if isinstance(raw, dict) else None)
        if unknown is not None:
            return "policy", unknown, "not a field sbxkit's policy sets; refused, not dropped"
        return self._body_refusal(register)

    async def _recheck_register(self, register: Register) -> tuple[RefusalCode, str, str] | None:
        """``_recheck`` of a Register the supervisor made itself (a pool's parked container)."""
        return self._socket_refusal(register) or await trio.to_thread.run_sync(
            self._body_refusal, register
        )

    def _socket_refusal(self, register: Register) -> tuple[RefusalCode, str, str] | None:
        problem = engine_socket_problem(
            register.engine_socket, self.config.docker_socket, self.allowed_sockets
        )
        return None if problem is None else ("engine", "engine_socket", problem)

    def _body_refusal(self, register: Register) -> tuple[RefusalCode, str, str] | None:
        refusal = recheck_body(
            register.body,
            lease=register.lease,
            state_dir=str(self.state.path),
            environment=self.environment,
            resolve=os.path.realpath,
            io_dir_problem=io_dir_problem,
            network=register.network,
        )
        return None if refusal is None else ("policy", refusal.field, refusal.reason)

    async def _volumes_refusal(self, engine: Engine, register: Register) -> Refused | None:
        """Each named volume must exist and be backed by nothing a bind could not be."""
        host = register.body.host_config
        for index, mount in enumerate((host.mounts if host else None) or []):
            field = f"HostConfig.Mounts[{index}].Source"
            try:
                volume = await engine.volume_inspect(mount.source or "")
            except NotFound:
                reason = f"no volume named {mount.source!r}; it would be created"
                return Refused(code="policy", reason=reason, field=field)
            except SbxError as exc:
                return Refused(code="request", reason=f"cannot inspect the volume: {exc}")
            state_dir = str(self.state.path)
            problem = await trio.to_thread.run_sync(
                volume_backing_problem, volume, state_dir, os.path.realpath
            )
            if problem is not None:
                reason = f"volume {mount.source!r} {problem}"
                return Refused(code="policy", reason=reason, field=field)
        return None

    async def _root_refusal(self, engine: Engine, register: Register) -> Refused | None:
        """A workspace's root inside is admitted only where this supervisor's own look at the
        daemon (or the body's runtime, gVisor; on rootful Podman the body's ``UsernsMode``)
        says it is not the host's root: the caller's word is not taken. The caller's own start
        then asks the host's kernel too."""
        body = register.body
        if body.user != ROOT_USER:
            return None  # recheck_body refused a UsernsMode without root inside
        host = body.host_config
        runtime = host.runtime if host is not None else None
        userns_mode = host.userns_mode if host is not None else None
        try:
            if await root_inside_witness(engine, runtime, userns_mode) is not None:
                return None
            planned = await planned_root_witness(engine, runtime)
        except SbxError as exc:
            return Refused(
                code="policy", reason=f"cannot ask the daemon: {exc}", field="Config.User"
            )
        if userns_mode is not None:  # asked where no user namespace of its own is sbxkit's
            reason = (
                f"{userns_mode!r} is taken only on rootful Podman (a workspace's root's own "
                f"user namespace); here root inside rests on {planned or 'nothing'}"
            )
            return Refused(code="policy", reason=reason, field="HostConfig.UsernsMode")
        reason = PODMAN_ROOT_REFUSED if planned == PODMAN_AUTO_WITNESS else ROOT_INSIDE_REFUSED
        return Refused(code="policy", reason=reason, field="Config.User")

    async def _managed_refusal(self, engine: Engine, register: Register) -> Refused | None:
        """A managed network's gateway must be the daemon's bridge's (the forwarder binds it)."""
        network = register.network
        if network is None or network.mode != "managed":
            return None
        try:
            problem = await managed_gateway_problem(engine, network)
        except SbxError as exc:
            problem = f"cannot inspect the managed network: {exc}"
        if problem is None:
            return None
        return Refused(code="policy", reason=problem, field="network.gateway")

    def _hard_bound_problem(self) -> str | None:
        cap = self.config.capacity
        if len(self.records) >= cap.max_records:
            return f"{len(self.records)} lease records, the cap is {cap.max_records}"
        return None

    async def _learn_budget(self, engine: Engine) -> None:
        """The budget from the first daemon's /info, unless the operator set it."""
        if self.admission.budget.memory_bytes is not None and self.launch_slots is not None:
            return
        info = await engine.info()
        cap = self.config.capacity
        self.admission.budget = Budget(
            memory_bytes=cap.memory_budget_bytes or default_memory_budget(info.mem_total),
            nano_cpus=cap.cpu_budget_nano,
            max_running=cap.max_workers,
            host_nano_cpus=info.ncpu * 10**9 if info.ncpu else None,
        )
        if self.launch_slots is None:
            self.launch_slots = trio.Semaphore(launch_bound(cap, info.ncpu))

    async def _storage_problem(self) -> str | None:
        """What in the state directory blocks new execution now, or None. Audited afresh at
        every admission and before every park (docs/operations.md): a chmod, a swapped path, a
        foreign file or a malformed record added while the supervisor runs blocks the next one,
        and one an operator removed stops blocking. A failed journal write stays (sticky)."""
        return await trio.to_thread.run_sync(self._audit)

    def _audit(self) -> str | None:
        """``_storage_problem``, blocking: call it from a worker thread."""
        try:
            problems = self.state.audit(self.records)
        except (StorageError, OSError) as exc:
            return f"unsafe supervisor state blocks execution: {exc}"
        found = [str(problem) for problem in problems] + self.storage_errors
        if found:
            return "unsafe or malformed supervisor state blocks new execution: " + "; ".join(found)
        return None

    async def admit_lease(
        self, peer: Caller, register: Register, intent: Intent
    ) -> LiveLease | None:
        """Admit a Register: checks, the lease's uid, the admission and launch-slot waits, the
        journal and the lease task; the live lease, or None (answered to ``peer``). One of the
        four calls the hand-off makes (with ``adopt_lease``, ``govern_lease``, ``take_parked``)."""
        problem = self._request_problem(register)
        payload = peer.last_payload
        # One worker thread audits the state directory and rechecks a well-formed request's
        # body (one hand-off, not two); the refusals keep their order: storage, request, policy.
        storage, refusal = await trio.to_thread.run_sync(
            lambda: (self._audit(), None if problem else self._recheck(payload, register))
        )
        if storage is not None:
            await self._refuse(peer, "storage", storage)
            return None
        if problem:
            await self._refuse(peer, "request", problem)
            return None
        if refusal is not None:
            await peer.send(Refused(code=refusal[0], reason=refusal[2], field=refusal[1]))
            log(f"lease {register.lease}: refused {refusal[1]}: {refusal[2]}")
            return None
        taken = self._hold_uid(register)
        if taken is not None:
            await peer.send(Refused(code="uid_taken", reason=taken, field="Config.User"))
            log(f"lease {register.lease}: refused Config.User: {taken}")
            return None
        live: LiveLease | None = None
        try:
            live = await self._admit_held(peer, register, intent)
        finally:
            if live is None and register.lease not in self.records:
                self.let_uid_go(register.lease)  # nothing was journaled: nothing can exist
        return live

    def _hold_uid(self, register: Register) -> str | None:
        """Hold the uid the body runs as when it is the lease's own (``sbxkit._model.uids``): why it
        cannot be held, else None. Held until the container is confirmed gone (``_forget``)."""
        held = hold_own_uid(register.lease, register.body)
        if isinstance(held, str):
            return held
        if held is not None:
            self.uid_holds[register.lease] = held
        return None

    async def _admit_held(
        self, peer: Caller, register: Register, intent: Intent
    ) -> LiveLease | None:
        """``admit_lease`` once the lease's uid is held: the daemon's checks, the admission and
        launch slot waits, the journal."""
        try:
            engine = await self.engine_for(self.config.docker_socket or register.engine_socket)
            await self._learn_budget(engine)
        except SbxError as exc:
            await self._refuse(peer, "request", f"engine unavailable: {exc}")
            return None
        refused = await self._volumes_refusal(engine, register)
        if refused is None:
            refused = await self._managed_refusal(engine, register)
        if refused is None:
            refused = await self._root_refusal(engine, register)
        if refused is not None:
            await peer.send(refused)
            log(f"lease {register.lease}: refused {refused.field}: {refused.reason}")
            return None
        need = Need(register.reservation.memory_bytes, register.reservation.nano_cpus)
        impossible = never_fits(need, self.admission.budget)
        if impossible is not None:
            await peer.send(
                Refused(code="never_fits", reason=impossible.rule, field=impossible.field)
            )
            return None
        problem = self._hard_bound_problem()
        if problem:
            await self._refuse(peer, "capacity", f"capacity exhausted: {problem}")
            return None
        waiting_since = trio.current_time()
        if not await self._wait_for_admission(peer, register.lease, need, intent):
            return None
        assert self.launch_slots is not None
        slot = LaunchSlot(self.launch_slots)
        try:
            waited = await self._wait_for_launch_slot(peer, register.lease, slot, intent)
            if waited != "held":
                self._release(register.lease)
                if waited == "left":
                    await peer.send(Closed(lease=register.lease))
                else:
                    timeout = self.config.capacity.admission_timeout_s
                    await self._refuse(
                        peer,
                        "admission_timeout",
                        f"waited {timeout:g} s for a launch slot (creates and starts in flight "
                        "are bounded; each lease holds its slot at most "
                        f"{self.config.capacity.max_startup_deadline_s:g} s); nothing was created",
                    )
                return None
            waited_s = trio.current_time() - waiting_since
            return await self._register(peer, register, intent, engine, slot, waited_s)
        except BaseException:
            slot.release()
            raise

    def _make_room(self, need: Need) -> None:
        """A request must wait: let idle holders of capacity go (``pooling.py``)."""

    async def _wait_for_admission(
        self, peer: Caller, lease: str, need: Need, intent: Intent
    ) -> bool:
        """Wait in the FIFO until admitted (True), or until the caller leaves or the admission
        deadline passes (False; answered). Nothing is journaled for a waiting request."""
        self.admission.enqueue(lease, need)
        self._pump()
        if self.admission.is_admitted(lease):
            return True
        self._make_room(need)
        self.queued_total += 1
        log(
            f"lease {lease}: waiting for capacity ({self.admission.ahead(lease)} ahead, "
            f"{self.admission.running} running)"
        )
        told: int | None = None
        told_at = -math.inf
        self.intents[lease] = intent
        try:
            with trio.move_on_after(self.config.capacity.admission_timeout_s):
                while True:
                    intent.nudge = trio.Event()  # fresh before the checks: no change is missed
                    if self.admission.is_admitted(lease):
                        return True
                    if intent.stop.is_set():
                        self.admission.withdraw(lease)
                        self._pump()
                        await peer.send(Closed(lease=lease))
                        return False
                    ahead = self.admission.ahead(lease)
                    now = trio.current_time()
                    if ahead != told or now - told_at >= QUEUED_HEARTBEAT_S:
                        told, told_at = ahead, now
                        await peer.send(Queued(lease=lease, ahead=ahead))
                    with trio.move_on_after(QUEUED_HEARTBEAT_S):
                        await intent.nudge.wait()
        finally:
            self.intents.pop(lease, None)
        if self.admission.is_admitted(lease):  # admitted as the deadline passed
            return True
        self.admission.withdraw(lease)
        self._pump()
        timeout = self.config.capacity.admission_timeout_s
        await self._refuse(
            peer,
            "admission_timeout",
            f"waited {timeout:g} s for capacity ({self.admission.ahead(lease)} ahead, "
            f"{self.admission.running} running); nothing was created",
        )
        return False

    async def _wait_for_launch_slot(
        self, peer: Caller, lease: str, slot: LaunchSlot, intent: Intent
    ) -> Literal["held", "left", "timeout"]:
        """Creates and starts in flight are bounded; waiting here is queueing too: after a
        second without a slot the caller hears ``Queued`` (``ahead``: the leases waiting for a
        slot before it) at least every second, and the admission deadline bounds the wait.
        Slots are handed on in arrival order (trio's semaphore is FIFO)."""
        if not slot.try_acquire():
            await self._queue_for_launch_slot(peer, lease, slot, intent)
        if intent.stop.is_set():
            slot.release()
            return "left"
        return "held" if slot.held else "timeout"

    async def _queue_for_launch_slot(
        self, peer: Caller, lease: str, slot: LaunchSlot, intent: Intent
    ) -> None:
        """Wait for a slot in line, telling the caller its place every second, until it is
        held, the caller leaves, or the admission deadline passes."""
        acquired = trio.Event()
        beat = trio.CancelScope()

        async def acquire() -> None:
            await slot.acquire()  # in its own task: a heartbeat never loses its place in line
            acquired.set()
            beat.cancel()  # the waiter wakes now, with no task of its own per event

        self.slot_waiters.append(lease)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(acquire)
                with trio.move_on_after(self.config.capacity.admission_timeout_s):
                    while True:
                        # ``acquire`` cancels the scope in place now: nothing runs between
                        # this check and the wait.
                        beat = trio.move_on_after(QUEUED_HEARTBEAT_S)
                        with beat:
                            if not acquired.is_set():
                                await intent.stop.wait()
                        if acquired.is_set() or intent.stop.is_set():
                            break
                        ahead = self.slot_waiters.index(lease)
                        await peer.send(Queued(lease=lease, ahead=ahead))
                nursery.cancel_scope.cancel()
        finally:
            self.slot_waiters.remove(lease)

    async def _register(
        self,
        peer: Caller,
        register: Register,
        intent: Intent,
        engine: Engine,
        slot: LaunchSlot,
        waited_s: float,
    ) -> LiveLease | None:
        """Journal the admitted lease (fsync'd) before anything reaches the daemon. Its
        ``Registered`` goes with the lease task's next answer (lifecycle.py)."""
        live = await self._journal_lease(register, peer, intent)
        if isinstance(live, str):
            await self._refuse(peer, "storage", live)
            return None
        peer.hold(Registered(lease=live.record.lease, waited_s=waited_s))
        self.nursery.start_soon(self._lease_task, live, engine, slot)
        return live

    async def _journal_lease(
        self, register: Register, peer: Replies, intent: Intent
    ) -> LiveLease | str:
        """The admitted lease, live and journaled (fsync'd); else why the journal failed."""
        now = trio.current_time()
        record = LeaseRecord(
            lease=register.lease,
            name=register.name,
            state="creating",
            engine_socket=self.config.docker_socket or register.engine_socket,
            registered_at=time.time(),
            lifetime_deadline=time.time() + register.lifetime_deadline_s,
            memory_bytes=register.reservation.memory_bytes,
            nano_cpus=register.reservation.nano_cpus,
            secret_hash=register.secret_hash,
            governed=register.network is not None and register.network.needs_governor,
            uid=held.uid if (held := self.uid_holds.get(register.lease)) is not None else None,
        )
        live = LiveLease(
            record,
            register.body,
            peer,
            intent,
            # The supervisor's cap, not the caller's wish, bounds how long a slot is held.
            now + min(register.startup_deadline_s, self.config.capacity.max_startup_deadline_s),
            now + register.lifetime_deadline_s,
            network=register.network,
        )
        live.launch = register.launch
        # Live and counted before the first await: the reaper must never take a lease that is
        # being admitted for an orphan.
        self.records[record.lease] = record
        self.live[record.lease] = live
        self.leases_admitted += 1
        try:
            await self.journal.write(record)
        except (OSError, StorageError) as exc:
            self.records.pop(record.lease, None)
            self.live.pop(record.lease, None)
            self._release(record.lease)
            self.storage_errors.append(f"journal write failed: {exc}")
            return f"journal write failed: {exc}"
        return live
