"""The supervisor service: an independent process that owns creation and cleanup of containers.

It journals every lease durably before asking Docker to create anything, so a caller that dies
— SIGKILL, power loss, a crashed interpreter — never leaks its container, and a supervisor that
dies recovers from the journal when it starts again.

Tasks in the service nursery:
- ``Journal.serve``: the single writer of lease records (fsync in a worker thread).
- ``_accept``: one handler per connection; one lease per connection.
- one lease task per live lease: create (never cancelled by the caller), hand the id over,
  wait for close, caller EOF or the lifetime deadline, remove, delete the record.
- ``_reap``: recovery at startup and then periodically for records no live task owns.
- ``_watch_events``: while uncertain records exist, follow the daemon's event stream so a late
  container is removed as soon as it appears rather than at the next poll.
- ``_idle_exit``: without ``--persistent``, exit once idle and record-free.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence

import trio

from sbxkit.admission import (
    AdmissionQueue,
    Budget,
    Need,
    default_memory_budget,
    never_fits,
)
from sbxkit.engine.client import Engine, connect
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import Conflict, EngineError, NotFound, SbxError
from sbxkit.policy import LEASE_LABEL
from sbxkit.supervisor import records as rec
from sbxkit.supervisor.channel import FrameChannel
from sbxkit.supervisor.config import Capacity, Config, build_parser, config_from_args, launch_bound
from sbxkit.supervisor.fingerprint import implementation_fingerprint
from sbxkit.supervisor.journal import Journal, StateDir, check_state_dir
from sbxkit.supervisor.records import LeaseRecord, StorageError
from sbxkit.supervisor.wire import (
    PROTOCOL_VERSION,
    Close,
    Closed,
    Created,
    Failed,
    Hello,
    Message,
    Orphaned,
    Queued,
    Recover,
    Refused,
    Register,
    Registered,
    Report,
    Retire,
    Started,
    Welcome,
    WireError,
    decode_client,
    encode,
)

HANDSHAKE_TIMEOUT_S = 10.0
REMOVE_ATTEMPT_BUDGET_S = 5.0
QUEUED_HEARTBEAT_S = 1.0  # a waiting caller hears from us at least this often


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{stamp} sbxkit-supervisor[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def peer_uid(stream: trio.SocketStream) -> int:
    creds = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class Peer(FrameChannel):
    """One client connection: framed receive, serialised send that tolerates a gone caller."""

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self._send_lock = trio.Lock()
        self.gone = False

    async def receive(self) -> Message | None:
        """The next message, or None at EOF or on a broken connection."""
        payload = await self.receive_payload()
        return None if payload is None else decode_client(payload)

    async def send(self, message: Message) -> None:
        if self.gone:
            return
        async with self._send_lock:
            try:
                await self.stream.send_all(encode(message))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.gone = True


class Intent:
    """What the caller has said on its connection since it registered: read by one task,
    seen by the admission wait and the lease task alike."""

    def __init__(self) -> None:
        self.stop = trio.Event()  # close message, caller EOF, lifetime deadline
        self.reason = ""
        self.started = trio.Event()  # the caller started the container
        self.nudge = trio.Event()  # anything changed for a waiting request

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()
        self.nudge.set()


class LiveLease:
    def __init__(
        self,
        record: LeaseRecord,
        body: ContainerCreate,
        peer: Peer,
        intent: Intent,
        startup_deadline: float,
        lifetime_deadline: float,
    ) -> None:
        self.record = record
        self.body = body
        self.peer = peer
        self.intent = intent
        self.stop = intent.stop
        self.startup_deadline = startup_deadline  # trio clock
        self.lifetime_deadline = lifetime_deadline  # trio clock
        self.finished = trio.Event()

    @property
    def stop_reason(self) -> str:
        return self.intent.reason

    def request_stop(self, reason: str) -> None:
        self.intent.request_stop(reason)


async def first_of(*events: trio.Event) -> None:
    """Return once any of the events is set."""
    async with trio.open_nursery() as nursery:
        for event in events:

            async def wait(event: trio.Event = event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait)


def describe(record: LeaseRecord) -> str:
    age = time.time() - record.registered_at
    container = (record.container_id or "-")[:12]
    reason = f" ({record.reason})" if record.reason else ""
    return f"{record.lease} {record.state:<9} container {container} age {age:.0f}s{reason}"


def is_definite_create_failure(error: SbxError) -> bool:
    """The daemon answered the create with an error status: its handler finished and cleaned
    up, so nothing was created. 409 (the name exists) is the exception: a container with this
    lease's name may be ours. A timeout or a lost connection proves nothing either way."""
    return isinstance(error, EngineError) and not isinstance(error, Conflict)


class LaunchSlot:
    """One of the bounded creates-and-starts in flight; released exactly once."""

    def __init__(self, slots: trio.Semaphore) -> None:
        self._slots = slots
        self.held = False

    async def acquire(self) -> None:
        await self._slots.acquire()
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._slots.release()


class Service:
    def __init__(self, config: Config, state: StateDir, journal: Journal) -> None:
        self.config = config
        self.state = state
        self.journal = journal
        self.records: dict[str, LeaseRecord] = {}
        self.live: dict[str, LiveLease] = {}
        self.engines: dict[str, Engine] = {}
        self.storage_errors: list[str] = []
        self.connections = 0
        self.wake_reaper = trio.Event()
        self.uncertain_changed = trio.Event()
        self.last_activity = trio.current_time()
        self.fingerprint = implementation_fingerprint()
        self.leases_admitted = 0
        self.reported_foreign: set[str] = set()
        capacity = config.capacity
        self.admission: AdmissionQueue[str] = AdmissionQueue(
            Budget(
                memory_bytes=capacity.memory_budget_bytes,
                nano_cpus=capacity.cpu_budget_nano,
                max_running=capacity.max_workers,
            )
        )
        self.launch_slots: trio.Semaphore | None = None  # sized from the daemon's NCPU
        self.intents: dict[str, Intent] = {}  # requests waiting for admission
        self.queued_total = 0

    # -- engines --------------------------------------------------------------------------------

    async def engine_for(self, socket_path: str) -> Engine:
        engine = self.engines.get(socket_path)
        if engine is None:
            engine = self.engines[socket_path] = await connect(socket_path)
        return engine

    # -- connections ----------------------------------------------------------------------------

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.last_activity = trio.current_time()
        peer = Peer(stream)
        try:
            await self._converse(peer)
        except WireError as exc:
            log(f"dropping a connection: {exc}")
        except Exception as exc:  # one connection must never take the service down
            log(f"dropping a connection after an internal error: {exc!r}")
        finally:
            self.connections -= 1
            self.last_activity = trio.current_time()
            await trio.aclose_forcefully(stream)

    async def _refuse(self, peer: Peer, code: str, reason: str) -> None:
        await peer.send(Refused(code=code, reason=reason))  # type: ignore[arg-type]

    async def _converse(self, peer: Peer) -> None:
        uid = peer_uid(peer.stream)
        if uid != os.geteuid():
            await self._refuse(peer, "peer", f"peer uid {uid} is not the supervisor's uid")
            return
        if self.connections > self.config.capacity.max_connections:
            await self._refuse(peer, "capacity", "too many connections")
            return
        hello: Message | None = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            hello = await peer.receive()
        if not isinstance(hello, Hello):
            return
        if hello.protocol != PROTOCOL_VERSION or hello.fingerprint != self.fingerprint:
            await self._refuse(
                peer,
                "version",
                f"client speaks protocol {hello.protocol} ({hello.fingerprint}), this supervisor "
                f"{PROTOCOL_VERSION} ({self.fingerprint}): drain the older supervisor before "
                "upgrading",
            )
            return
        await peer.send(Welcome(protocol=PROTOCOL_VERSION, fingerprint=self.fingerprint))
        register: Message | None = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            register = await peer.receive()
        if isinstance(register, Recover):
            await self.recover_once()
            lines = [describe(r) for r in self.orphans()] + [self.stats()]
            await peer.send(Report(lines=lines, remaining=len(self.records)))
            return
        if isinstance(register, Retire):
            await self._retire(peer, register.lease)
            return
        if not isinstance(register, Register):
            return
        intent = Intent()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_intent, peer, register.lease, intent)
            try:
                lease = await self._admit(peer, register, intent)
                if lease is not None:
                    await lease.finished.wait()
            finally:
                intent.request_stop("connection ended")
                nursery.cancel_scope.cancel()

    async def _read_intent(self, peer: Peer, lease: str, intent: Intent) -> None:
        """Relay the caller's messages after Register: Started, then Close (or EOF)."""
        try:
            while True:
                message = await peer.receive()
                if message is None:
                    intent.request_stop("caller disconnected")
                    return
                if isinstance(message, Started) and message.lease == lease:
                    intent.started.set()
                    intent.nudge.set()
                elif isinstance(message, Close) and message.lease == lease:
                    intent.request_stop("caller closed")
                    return
                else:
                    raise WireError(f"unexpected {type(message).__name__} after registration")
        except WireError as exc:
            log(f"lease {lease}: {exc}; treated as the caller leaving")
            intent.request_stop("protocol error")

    def _request_problem(self, register: Register) -> str | None:
        lease = register.lease
        if not rec.LEASE_ID.fullmatch(lease):
            return "lease id must be 32 lowercase hex digits"
        if register.name != f"sbxkit-{lease}":
            return f"container name must be sbxkit-{lease}"
        if (register.body.labels or {}).get(LEASE_LABEL) != lease:
            return f"the create body must carry {LEASE_LABEL}={lease}"
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
        if lease in self.records or lease in self.live:
            return "lease id already in use"
        return None

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

    async def _admit(self, peer: Peer, register: Register, intent: Intent) -> LiveLease | None:
        if self.storage_errors:
            await self._refuse(
                peer,
                "storage",
                "unsafe or malformed supervisor state blocks "
                "new execution: " + "; ".join(self.storage_errors),
            )
            return None
        problem = self._request_problem(register)
        if problem:
            await self._refuse(peer, "request", problem)
            return None
        try:
            engine = await self.engine_for(self.config.docker_socket or register.engine_socket)
            await self._learn_budget(engine)
        except SbxError as exc:
            await self._refuse(peer, "request", f"engine unavailable: {exc}")
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
        if not await self._wait_for_admission(peer, register.lease, need, intent):
            return None
        assert self.launch_slots is not None
        slot = LaunchSlot(self.launch_slots)
        try:
            if not await self._wait_for_launch_slot(slot, intent):
                self._release(register.lease)
                await peer.send(Closed(lease=register.lease))
                return None
            return await self._register(peer, register, intent, engine, slot)
        except BaseException:
            slot.release()
            raise

    async def _wait_for_admission(self, peer: Peer, lease: str, need: Need, intent: Intent) -> bool:
        """Wait in the FIFO until admitted (True), or until the caller leaves or the admission
        deadline passes (False; answered). Nothing is journaled for a waiting request."""
        self.admission.enqueue(lease, need)
        self._pump()
        if self.admission.is_admitted(lease):
            return True
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

    async def _wait_for_launch_slot(self, slot: LaunchSlot, intent: Intent) -> bool:
        """Creates and starts in flight are bounded; waiting here is queueing too."""
        acquired = trio.Event()

        async def acquire() -> None:
            await slot.acquire()
            acquired.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acquire)
            await first_of(acquired, intent.stop)
            nursery.cancel_scope.cancel()
        return slot.held and not intent.stop.is_set()

    def _pump(self) -> None:
        """Admit what fits now and wake every waiting request (places changed)."""
        self.admission.admit_ready()
        for intent in self.waiting_intents():
            intent.nudge.set()

    def waiting_intents(self) -> list[Intent]:
        return list(self.intents.values())

    def _release(self, lease: str) -> None:
        self.admission.release(lease)
        self._pump()

    async def _register(
        self, peer: Peer, register: Register, intent: Intent, engine: Engine, slot: LaunchSlot
    ) -> LiveLease | None:
        """Journal the admitted lease (fsync'd) before anything reaches the daemon."""
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
        )
        live = LiveLease(
            record,
            register.body,
            peer,
            intent,
            now + register.startup_deadline_s,
            now + register.lifetime_deadline_s,
        )
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
            await self._refuse(peer, "storage", f"journal write failed: {exc}")
            return None
        await peer.send(Registered(lease=record.lease))
        self.nursery.start_soon(self._lease_task, live, engine, slot)
        return live

    # -- one lease ------------------------------------------------------------------------------

    async def _lease_task(self, live: LiveLease, engine: Engine, slot: LaunchSlot) -> None:
        lease = live.record.lease
        try:
            container_id = await self._create(live, engine)
            if container_id is None:
                return
            self.nursery.start_soon(self._hand_on_launch_slot, live, slot)
            with trio.move_on_at(live.lifetime_deadline):
                await live.stop.wait()
            if not live.stop.is_set():
                live.request_stop("lifetime deadline")
                log(f"lease {lease}: lifetime deadline reached; removing its container")
            await self._remove_live(live, engine, container_id)
        except (SbxError, OSError) as exc:
            # The record (if any) stays in the journal; the reaper owns it from here.
            log(f"lease {lease}: {exc}; the reaper takes over")
            self.wake_reaper.set()
            await live.peer.send(Orphaned(lease=lease, reason=f"supervisor error: {exc}"))
        finally:
            slot.release()
            self.live.pop(lease, None)
            live.finished.set()
            self.last_activity = trio.current_time()
            if lease in self.records:  # now an orphan: recovery and the event watcher own it
                self.admission.stop_running(lease)
                self._pump()
                self.uncertain_changed.set()
                self.wake_reaper.set()

    async def _hand_on_launch_slot(self, live: LiveLease, slot: LaunchSlot) -> None:
        """The daemon's launch work ends when the caller has started the container (or gives
        up); a caller that never says so holds its slot at most until the startup deadline."""
        with trio.move_on_at(live.startup_deadline):
            await first_of(live.intent.started, live.stop, live.finished)
        slot.release()

    async def _create(self, live: LiveLease, engine: Engine) -> str | None:
        """Create the stopped container; return its id only if the caller may start it."""
        lease = live.record.lease
        outcome: list[str | SbxError] = []
        created = trio.Event()

        async def send_create() -> None:
            # Never cancelled by the caller: a create that may reach the daemon runs to an
            # answer (the engine's create deadline bounds it) so its container can be removed.
            try:
                outcome.append(await engine.container_create(live.body, name=live.record.name))
            except SbxError as exc:
                outcome.append(exc)
            created.set()

        self.nursery.start_soon(send_create)
        startup_missed = False
        with trio.move_on_at(live.startup_deadline):
            await created.wait()
        if not created.is_set():
            startup_missed = True
            await live.peer.send(
                Failed(
                    lease=lease,
                    reason="startup deadline passed before the container was "
                    "created; it will be removed without starting",
                )
            )
        await created.wait()
        result = outcome[0]
        if isinstance(result, SbxError):
            await self._create_failed(live, result)
            return None
        container_id = result
        live.record = rec.created(live.record, container_id)
        self.records[lease] = live.record
        await self.journal.write(live.record)
        if startup_missed or live.stop.is_set():
            live.request_stop("startup deadline" if startup_missed else live.stop_reason)
            await self._remove_live(live, engine, container_id)
            return None
        problem = await self._check_reservation(engine, live, container_id)
        if problem:
            await live.peer.send(Failed(lease=lease, reason=problem))
            live.request_stop(problem)
            await self._remove_live(live, engine, container_id)
            return None
        await live.peer.send(Created(lease=lease, container_id=container_id))
        return container_id

    async def _check_reservation(
        self, engine: Engine, live: LiveLease, container_id: str
    ) -> str | None:
        """The container's actual limits must be what was admitted, before it may start."""
        try:
            info = await engine.container_inspect(container_id)
        except SbxError as exc:
            return f"post-create inspection failed: {exc}"
        labels = info.config.labels or {}
        if labels.get(LEASE_LABEL) != live.record.lease:
            return "the created container does not carry this lease's label"
        if info.host_config.memory != live.record.memory_bytes:
            return (
                f"container memory {info.host_config.memory} differs from the reservation "
                f"{live.record.memory_bytes}"
            )
        if info.host_config.nano_cpus != live.record.nano_cpus:
            return (
                f"container NanoCpus {info.host_config.nano_cpus} differs from the "
                f"reservation {live.record.nano_cpus}"
            )
        if info.state.running or info.state.status != "created":
            return f"the container is {info.state.status}, not a stopped 'created' container"
        return None

    async def _create_failed(self, live: LiveLease, error: SbxError) -> None:
        lease = live.record.lease
        if is_definite_create_failure(error):
            await self._forget(lease)
            await live.peer.send(Failed(lease=lease, reason=f"create failed: {error}"))
            await live.peer.send(Closed(lease=lease))
            return
        live.record = rec.uncertain(live.record, f"create failed: {error}")
        self.records[lease] = live.record
        await self.journal.write(live.record)
        log(f"lease {lease}: create outcome uncertain ({error}); recovery owns it now")
        self.uncertain_changed.set()
        self.wake_reaper.set()
        reason = f"create outcome uncertain ({error}); recovery removes the container if it appears"
        await live.peer.send(Failed(lease=lease, reason=reason))
        await live.peer.send(Orphaned(lease=lease, reason=reason))

    async def _remove_live(self, live: LiveLease, engine: Engine, container_id: str) -> None:
        lease = live.record.lease
        error = await self._remove_container(engine, lease, container_id)
        if error is None:
            await self._forget(lease)
            await live.peer.send(Closed(lease=lease))
            return
        log(f"lease {lease}: removal failed ({error}); record kept, the reaper retries")
        self.wake_reaper.set()
        await live.peer.send(
            Orphaned(lease=lease, reason=f"removal failed, record kept for retry: {error}")
        )

    async def _remove_container(self, engine: Engine, lease: str, container_id: str) -> str | None:
        """Remove with retries for a short budget; None once the daemon confirmed it gone."""
        last = "not attempted"
        with trio.move_on_after(REMOVE_ATTEMPT_BUDGET_S):
            delay = 0.05
            while True:
                try:
                    await engine.container_remove(container_id)  # False (404): already gone
                    return None
                except SbxError as exc:  # 409 "removal in progress" included: re-check
                    last = str(exc)
                await trio.sleep(delay)
                delay = min(2 * delay, 0.5)
        return last

    async def _forget(self, lease: str) -> None:
        await self.journal.delete(lease)
        self.records.pop(lease, None)
        self._release(lease)  # its memory is free only once the container is confirmed gone
        self.uncertain_changed.set()

    # -- recovery -------------------------------------------------------------------------------

    def stats(self) -> str:
        """Counters for operators and the benchmark (fsyncs per lease, admission waits)."""
        return (
            f"leases admitted: {self.leases_admitted}, journal fsyncs: "
            f"{self.journal.fsyncs}, records: {len(self.records)}, "
            f"queued: {self.queued_total} (waiting now: {self.admission.waiting})"
        )

    def orphans(self) -> list[LeaseRecord]:
        return [r for lease, r in self.records.items() if lease not in self.live]

    async def recover_once(self) -> None:
        for record in self.orphans():
            try:
                await self._recover(record)
            except SbxError as exc:
                log(f"lease {record.lease}: recovery attempt failed: {exc}")
            except OSError as exc:
                log(f"lease {record.lease}: journal error during recovery: {exc}")

    async def _recover(self, record: LeaseRecord) -> None:
        engine = await self.engine_for(record.engine_socket)
        if record.state == "creating":
            # The supervisor died mid-create: the request may still land. Tombstone it.
            record = rec.uncertain(record, "supervisor restarted during create")
            self.records[record.lease] = record
            await self.journal.write(record)
            self.uncertain_changed.set()
        if record.state == "created":
            assert record.container_id is not None
            try:
                info = await engine.container_inspect(record.container_id)
            except NotFound:
                await self._forget(record.lease)
                log(f"lease {record.lease}: container already gone; record released")
                return
            if (info.config.labels or {}).get(LEASE_LABEL) != record.lease:
                self._report_foreign(record, info.config.labels or {})
                return
            error = await self._remove_container(engine, record.lease, record.container_id)
            if error is None:
                await self._forget(record.lease)
                log(
                    f"lease {record.lease}: recovered, container {record.container_id[:12]} removed"
                )
            return
        # uncertain: resolved only by observing and removing the owned container.
        for summary in await engine.container_list(label=f"{LEASE_LABEL}={record.lease}"):
            names = [n.lstrip("/") for n in summary.names or []]
            if (summary.labels or {}).get(LEASE_LABEL) != record.lease or record.name not in names:
                continue
            error = await self._remove_container(engine, record.lease, summary.id)
            if error is None:
                await self._forget(record.lease)
                log(
                    f"lease {record.lease}: late container {summary.id[:12]} removed; "
                    "uncertain record resolved"
                )

    async def _retire(self, peer: Peer, lease: str) -> None:
        """Delete a tombstone only if its container was never observed: checked now, by label
        and by name, on the daemon the record names."""
        record = self.records.get(lease)
        if record is None or lease in self.live:
            await self._refuse(peer, "request", f"no orphaned record for lease {lease}")
            return
        if record.state != "uncertain":
            await self._refuse(
                peer,
                "request",
                f"lease {lease} is {record.state}, not an uncertain tombstone; run recover instead",
            )
            return
        try:
            engine = await self.engine_for(record.engine_socket)
            by_label = await engine.container_list(label=f"{LEASE_LABEL}={lease}")
            by_name = await engine.container_list(name=record.name)
        except SbxError as exc:
            await self._refuse(peer, "request", f"cannot check the daemon: {exc}")
            return
        checked = [
            f"daemon {record.engine_socket}: containers labelled "
            f"{LEASE_LABEL}={lease}: {len(by_label)}",
            f"daemon {record.engine_socket}: containers named {record.name}: "
            f"{len([c for c in by_name if '/' + record.name in (c.names or [])])}",
        ]
        if by_label or any("/" + record.name in (c.names or []) for c in by_name):
            await self._refuse(
                peer,
                "request",
                "; ".join(checked) + ": a container was "
                "observed, so this is not a tombstone to retire; run recover",
            )
            return
        await self._forget(lease)
        log(f"lease {lease}: tombstone retired by an operator ({'; '.join(checked)})")
        await peer.send(Report(lines=[*checked, f"retired {lease}"], remaining=len(self.records)))

    def _report_foreign(self, record: LeaseRecord, labels: dict[str, str]) -> None:
        if record.lease not in self.reported_foreign:
            self.reported_foreign.add(record.lease)
            log(
                f"lease {record.lease}: container {record.container_id} is labelled "
                f"{LEASE_LABEL}={labels.get(LEASE_LABEL)!r}; it belongs to another lease and is "
                "never removed; record kept for an operator"
            )

    async def _reap(self) -> None:
        while True:
            # A fresh event before the pass: a wake-up that arrives during it is kept.
            self.wake_reaper = trio.Event()
            await self.recover_once()
            with trio.move_on_after(self.config.reaper_interval_s):
                await self.wake_reaper.wait()

    def has_uncertain(self) -> bool:
        return any(r.state == "uncertain" for r in self.orphans())

    async def _watch_events(self) -> None:
        """While uncertain records exist, wake the reaper the moment a leased container appears."""
        while True:
            self.uncertain_changed = trio.Event()  # before the check: no change is missed
            if not self.has_uncertain():
                await self.uncertain_changed.wait()
                continue
            sockets = {r.engine_socket for r in self.orphans() if r.state == "uncertain"}
            try:
                async with trio.open_nursery() as nursery:
                    for socket_path in sockets:
                        nursery.start_soon(self._follow, socket_path, nursery.cancel_scope)
            except SbxError as exc:
                log(f"event stream failed ({exc}); polling continues")
                await trio.sleep(self.config.reaper_interval_s)

    async def _follow(self, socket_path: str, scope: trio.CancelScope) -> None:
        engine = await self.engine_for(socket_path)
        filters = {"type": ["container"], "event": ["create"], "label": [LEASE_LABEL]}
        async with engine.events(filters) as events:
            # Catch a container created between the last poll and the subscription.
            self.wake_reaper.set()
            async for event in events:
                lease = (event.actor.attributes or {}).get(LEASE_LABEL)
                record = self.records.get(lease or "")
                if record is not None and record.state == "uncertain":
                    self.wake_reaper.set()
                if not self.has_uncertain():
                    scope.cancel()
                    return

    async def _idle_exit(self, done: trio.CancelScope) -> None:
        while True:
            await trio.sleep(min(1.0, self.config.idle_exit_s))
            idle = not self.live and not self.records and self.connections == 0
            if idle and trio.current_time() - self.last_activity >= self.config.idle_exit_s:
                log(f"idle and record-free; exiting ({self.stats()})")
                done.cancel()
                return

    nursery: trio.Nursery


async def serve(config: Config) -> int:
    """Run the service until idle (or forever with ``persistent``). Returns an exit status."""
    try:
        state_path = await trio.to_thread.run_sync(
            lambda: check_state_dir(config.state_dir, create=True)
        )
    except StorageError as exc:
        log(f"refusing to start: {exc}")
        return 1
    state = StateDir(state_path)
    lock_fd = await trio.to_thread.run_sync(state.try_lock)
    if lock_fd is None:
        log(f"another supervisor holds {state.lock_path}; leaving it undisturbed")
        return 0
    try:
        return await _serve_locked(config, state)
    finally:
        os.close(lock_fd)


async def _serve_locked(config: Config, state: StateDir) -> int:
    stale = await trio.to_thread.run_sync(state.remove_stale_private_files)
    if stale:
        log(f"removed stale private files: {', '.join(stale)}")
    journal = Journal(state)
    service = Service(config, state, journal)
    for path in await trio.to_thread.run_sync(state.record_paths):
        try:
            record = await trio.to_thread.run_sync(state.read_record, path)
        except StorageError as exc:
            service.storage_errors.append(str(exc))
            log(f"blocking new execution: {exc}")
            continue
        service.records[record.lease] = record
        # Its container may exist: its memory stays reserved until recovery confirms it gone.
        service.admission.hold(record.lease, Need(record.memory_bytes, record.nano_cpus))
    if service.records:
        log(f"recovering {len(service.records)} lease record(s)")

    # We hold the lock, so a socket file left on disk belongs to a dead instance.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state.socket_path)
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await listener.bind(str(state.socket_path))
    finally:
        os.umask(old_umask)
    os.chmod(state.socket_path, 0o600)
    listener.listen(128)
    log(f"listening on {state.socket_path} (persistent={config.persistent})")
    try:
        async with trio.open_nursery() as nursery:
            service.nursery = nursery
            nursery.start_soon(journal.serve)
            nursery.start_soon(service._reap)
            nursery.start_soon(service._watch_events)
            if not config.persistent:
                nursery.start_soon(service._idle_exit, nursery.cancel_scope)
            await trio.serve_listeners(service.handle, [trio.SocketListener(listener)])
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(state.socket_path)
        for engine in service.engines.values():
            with trio.CancelScope(shield=True):
                await engine.aclose()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser("sbxkit-supervisor").parse_args(argv)
    sys.exit(trio.run(serve, config_from_args(args)))


__all__ = ["Capacity", "Config", "Service", "main", "serve"]
