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

import argparse
import contextlib
import math
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
import trio

from sbxkit.engine.client import Engine, connect
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import Conflict, EngineError, NotFound, SbxError
from sbxkit.policy import LEASE_LABEL
from sbxkit.supervisor import records as rec
from sbxkit.supervisor.channel import FrameChannel
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
    Recover,
    Refused,
    Register,
    Registered,
    Report,
    Retire,
    Welcome,
    WireError,
    decode_client,
    encode,
)

HANDSHAKE_TIMEOUT_S = 10.0
REMOVE_ATTEMPT_BUDGET_S = 5.0


class Capacity(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds; exhaustion refuses a registration explicitly ("capacity")."""

    max_records: int = 512
    max_connections: int = 256
    max_workers: int = 64
    memory_budget_bytes: int | None = None  # None: the daemon's MemTotal
    cpu_budget_nano: int | None = None  # None: the daemon's NCPU


class Config(msgspec.Struct, frozen=True, kw_only=True):
    state_dir: Path
    persistent: bool = False
    idle_exit_s: float = 10.0
    reaper_interval_s: float = 2.0
    capacity: Capacity = Capacity()
    docker_socket: str | None = None  # reach the daemon through this socket, whatever callers say


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


class LiveLease:
    def __init__(
        self,
        record: LeaseRecord,
        body: ContainerCreate,
        peer: Peer,
        startup_deadline: float,
        lifetime_deadline: float,
    ) -> None:
        self.record = record
        self.body = body
        self.peer = peer
        self.startup_deadline = startup_deadline  # trio clock
        self.lifetime_deadline = lifetime_deadline  # trio clock
        self.stop = trio.Event()  # close message, caller EOF
        self.stop_reason = ""
        self.finished = trio.Event()

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()


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
        lease = await self._admit(peer, register)
        if lease is None:
            return
        # Relay the caller's intent; the lease task does the work and replies.
        try:
            message = await peer.receive()
            if message is None:
                lease.request_stop("caller disconnected")
            elif isinstance(message, Close) and message.lease == lease.record.lease:
                lease.request_stop("caller closed")
            else:
                raise WireError(f"unexpected {type(message).__name__} after registration")
        finally:
            lease.request_stop("connection ended")
        await lease.finished.wait()

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

    def _capacity_problem(self, register: Register, engine: Engine) -> str | None:
        cap = self.config.capacity
        if len(self.records) >= cap.max_records:
            return f"{len(self.records)} lease records, the cap is {cap.max_records}"
        if len(self.live) >= cap.max_workers:
            return f"{len(self.live)} live sandboxes, the cap is {cap.max_workers}"
        memory_budget = cap.memory_budget_bytes or self.host_memory
        cpu_budget = cap.cpu_budget_nano or self.host_cpus_nano
        memory = sum(r.memory_bytes for r in self.records.values())
        cpus = sum(r.nano_cpus for r in self.records.values())
        if memory_budget and memory + register.reservation.memory_bytes > memory_budget:
            return (
                f"memory: {memory} reserved + {register.reservation.memory_bytes} asked "
                f"> budget {memory_budget}"
            )
        if cpu_budget and cpus + register.reservation.nano_cpus > cpu_budget:
            return (
                f"cpu: {cpus / 1e9:g} reserved + {register.reservation.nano_cpus / 1e9:g} "
                f"asked > budget {cpu_budget / 1e9:g}"
            )
        return None

    host_memory = 0
    host_cpus_nano = 0

    async def _admit(self, peer: Peer, register: Register) -> LiveLease | None:
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
            if not self.host_memory:
                info = await engine.info()
                self.host_memory, self.host_cpus_nano = info.mem_total, info.ncpu * 10**9
        except SbxError as exc:
            await self._refuse(peer, "request", f"engine unavailable: {exc}")
            return None
        problem = self._capacity_problem(register, engine)
        if problem:
            await self._refuse(peer, "capacity", f"capacity exhausted: {problem}")
            return None
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
            now + register.startup_deadline_s,
            now + register.lifetime_deadline_s,
        )
        # Live and counted before the first await: the reaper must never take a lease that is
        # being admitted for an orphan, and concurrent admissions must see each other.
        self.records[record.lease] = record
        self.live[record.lease] = live
        self.leases_admitted += 1
        try:
            await self.journal.write(record)
        except (OSError, StorageError) as exc:
            self.records.pop(record.lease, None)
            self.live.pop(record.lease, None)
            self.storage_errors.append(f"journal write failed: {exc}")
            await self._refuse(peer, "storage", f"journal write failed: {exc}")
            return None
        await peer.send(Registered(lease=record.lease))
        self.nursery.start_soon(self._lease_task, live, engine)
        return live

    # -- one lease ------------------------------------------------------------------------------

    async def _lease_task(self, live: LiveLease, engine: Engine) -> None:
        lease = live.record.lease
        try:
            container_id = await self._create(live, engine)
            if container_id is None:
                return
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
            self.live.pop(lease, None)
            live.finished.set()
            self.last_activity = trio.current_time()
            if lease in self.records:  # now an orphan: recovery and the event watcher own it
                self.uncertain_changed.set()
                self.wake_reaper.set()

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
        self.uncertain_changed.set()

    # -- recovery -------------------------------------------------------------------------------

    def stats(self) -> str:
        """Counters for operators and the benchmark (fsyncs per lease)."""
        return (
            f"leases admitted: {self.leases_admitted}, journal fsyncs: "
            f"{self.journal.fsyncs}, records: {len(self.records)}"
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


def build_parser(prog: str = "sbxkit supervisor") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Own sandbox creation and cleanup through a durable lease journal."
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="absolute private directory (default: $SBXKIT_STATE_DIR or ~/.sbxkit/leases)",
    )
    parser.add_argument(
        "--persistent", action="store_true", help="stay up while idle (for a service manager)"
    )
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="exit after this long idle and record-free (default: 10)",
    )
    parser.add_argument("--reaper-interval", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument(
        "--docker-socket",
        metavar="PATH",
        help="reach the daemon through this socket instead of the caller's "
        "(a local relay, or to pin one daemon)",
    )
    parser.add_argument("--max-workers", type=int, default=Capacity().max_workers)
    parser.add_argument("--max-records", type=int, default=Capacity().max_records)
    parser.add_argument("--memory-budget", type=int, default=None, metavar="BYTES")
    parser.add_argument("--cpu-budget", type=float, default=None, metavar="CPUS")
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    from sbxkit.supervisor.journal import default_state_dir

    cpu_budget = None if args.cpu_budget is None else round(args.cpu_budget * 1e9)
    return Config(
        state_dir=args.state_dir or default_state_dir(),
        persistent=args.persistent,
        idle_exit_s=args.idle_exit,
        reaper_interval_s=args.reaper_interval,
        capacity=Capacity(
            max_workers=args.max_workers,
            max_records=args.max_records,
            memory_budget_bytes=args.memory_budget,
            cpu_budget_nano=cpu_budget,
        ),
        docker_socket=args.docker_socket,
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser("sbxkit-supervisor").parse_args(argv)
    sys.exit(trio.run(serve, config_from_args(args)))


__all__ = ["Capacity", "Config", "Service", "main", "serve"]
