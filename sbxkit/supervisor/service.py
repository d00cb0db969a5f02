"""The supervisor service: an independent process that owns creation and cleanup of containers.

It journals every lease durably before asking Docker to create anything, so a caller that dies
— SIGKILL, power loss, a crashed interpreter — never leaks its container, and a supervisor that
dies recovers from the journal when it starts again.

The service is split by job (each a class of the ``Service`` chain, sharing ``ServiceCore``):
- here: the process (``serve``, ``main``), the listening socket and each connection's handshake
  and relay of the caller's intent; idle exit;
- ``admitting.py``: a registration's checks, the fair admission queue, launch slots, the
  journal write that makes a lease live;
- ``lifecycle.py``: one lease task per live lease: create (never cancelled by the caller), hand
  the id over, wait for close, caller EOF or the lifetime deadline, remove, delete the record;
- ``pooling.py``: pools of parked containers held for claims (a Claim instead of Register);
- ``adopting.py``: a lease re-adopted by its caller after a restart (an Adopt instead of
  Register), and the startup hold that keeps its container for it;
- ``recovery.py``: records no live task owns, at startup, in the reaper loop and from the
  daemon's event stream while uncertain records exist;
- ``core.py``: the shared state; ``lease.py``: the per-lease vocabulary.

Tasks in the service nursery: ``Journal.serve`` (the single writer of lease records, fsync in a
worker thread), one handler per connection, one lease task per live lease, ``_reap``,
``_watch_events`` and, without ``--persistent``, ``_idle_exit``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import struct
import sys
from collections.abc import Sequence

import trio

from sbxkit._lifecycle.admission import Need
from sbxkit._protocol.journal import Journal, StateDir, check_state_dir
from sbxkit._protocol.statedir import STARTUP_REFUSAL
from sbxkit._protocol.wire import (
    PROTOCOL_VERSION,
    Adopt,
    AskDenials,
    Claim,
    Close,
    Denials,
    Detach,
    EndPools,
    Govern,
    Governed,
    Hello,
    ListPools,
    Message,
    Pools,
    Recover,
    Register,
    Report,
    Retire,
    Run,
    RunResume,
    Started,
    Welcome,
    WireError,
)
from sbxkit.errors import StorageError
from sbxkit.supervisor.config import Capacity, Config, build_parser, config_from_args
from sbxkit.supervisor.detaching import Detaching
from sbxkit.supervisor.lease import (
    Intent,
    LiveLease,
    Peer,
    describe,
    log,
)
from sbxkit.supervisor.pooling import Pooling
from sbxkit.supervisor.recovery import Recovery

HANDSHAKE_TIMEOUT_S = 10.0
HANDOFF_MODULE = "sbxkit.supervisor.handoff.resume"
"""Imports everything the hand-off serves with (``sbxkit.supervisor.handoff.serve`` among it)."""


def peer_uid(stream: trio.SocketStream) -> int:
    creds = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class Service(Detaching, Pooling, Recovery):
    """The whole service: connections (here), admission, lease tasks, pools, re-adoption,
    detached leases and recovery."""

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
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await peer.flush()  # a held Registered is said before the close
            await trio.aclose_forcefully(stream)

    async def _converse(self, peer: Peer) -> None:
        uid = peer_uid(peer.stream)
        if uid != os.geteuid():
            await self._refuse(peer, "peer", f"peer uid {uid} is not the supervisor's uid")
            return
        if self.connections > self.config.capacity.max_connections and not self._evict_a_greeter():
            await self._refuse(peer, "capacity", "too many connections")
            return
        greeting = trio.CancelScope()
        self.greeting[id(peer)] = greeting
        try:
            with greeting:
                register = await self._greet(peer)
        finally:
            self.greeting.pop(id(peer), None)
        if greeting.cancelled_caught:
            log("dropped a connection still in its handshake: the connection cap was reached")
            return
        if register is None:
            return
        await self._serve_request(peer, register)

    def _evict_a_greeter(self) -> bool:
        """At the connection cap, the connection that has been greeting longest without a
        request goes (a caller whose handshake is cut retries on a new connection), so idle
        connections cannot hold every slot: True if there was one."""
        for scope in self.greeting.values():
            if not scope.cancel_called:
                scope.cancel()
                return True
        return False

    async def _greet(self, peer: Peer) -> Message | None:
        """Hello, Welcome and the request; None when the peer said nothing usable."""
        hello: Message | None = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            hello = await peer.receive()
        if not isinstance(hello, Hello):
            return None
        if hello.protocol != PROTOCOL_VERSION or hello.fingerprint != self.fingerprint:
            await self._refuse(
                peer,
                "version",
                f"client speaks protocol {hello.protocol} ({hello.fingerprint}), this supervisor "
                f"{PROTOCOL_VERSION} ({self.fingerprint}): drain the older supervisor before "
                "upgrading",
            )
            return None
        # Welcome before the request is read, never held back with its first answer: a caller
        # that never heard it sends its Register again on a new connection (connect_supervisor)
        # — safe only because nothing is journaled before this, else a restarted supervisor
        # would refuse "lease id already in use" where the caller should re-adopt.
        await peer.send(Welcome(protocol=PROTOCOL_VERSION, fingerprint=self.fingerprint))
        register: Message | None = None
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            register = await peer.receive()
        return register

    async def _serve_request(self, peer: Peer, register: Message) -> None:
        if isinstance(register, Recover):
            await self.recover_once()
            await peer.send(Report(lines=self.recovery_report(), remaining=len(self.records)))
            return
        if isinstance(register, Adopt):
            adopted = await self.adopt_lease(peer, register)
            if adopted is not None:
                await self._hold(peer, register.lease, adopted.intent, adopted)
            return
        if isinstance(register, Retire):
            await self._retire(peer, register.lease)
            return
        if isinstance(register, ListPools):
            await peer.send(Pools(pools=self.held_pools()))
            return
        if isinstance(register, EndPools):
            await peer.send(await self.end_pools(register.shape))
            return
        if isinstance(register, Run):
            await self.handoff_loaded()
            from sbxkit.supervisor.handoff.serve import (
                serve_run,  # loaded: a look-up in sys.modules
            )

            await serve_run(self, peer, register)
            return
        if isinstance(register, RunResume):  # a handed-off run whose supervisor died
            await self.handoff_loaded()
            from sbxkit.supervisor.handoff.resume import serve_resume

            await serve_resume(self, peer, register)
            return
        if isinstance(register, Claim):
            claimed = await self._claim(peer, register)
            if claimed is not None:
                await self._hold(peer, claimed.record.lease, claimed.intent, claimed)
            return
        if not isinstance(register, Register):
            return
        await self._hold(peer, register.lease, Intent(), register)

    async def _hold(
        self, peer: Peer, lease: str, intent: Intent, source: Register | LiveLease
    ) -> None:
        """Carry one lease on this connection until it is finished: a Register is admitted
        first, a claimed lease is live already; the caller's Close or EOF ends it — unless
        it detached the lease (detaching.py): then the connection ends and the lease lives on."""
        async with trio.open_nursery() as nursery:
            # Cancelled by ``_read_intent`` once the lease is detached (``intent.detached``):
            # the wait below then ends as a wait for either event would, with no task of its
            # own for each event.
            holding = trio.CancelScope()
            nursery.start_soon(self._read_intent, peer, lease, intent, holding)
            try:
                live: Register | LiveLease | None = source
                if isinstance(source, Register):
                    live = await self.admit_lease(peer, source, intent)
                if isinstance(live, LiveLease) and not intent.detached.is_set():
                    with holding:
                        await live.finished.wait()
            finally:
                if not intent.detached.is_set():
                    intent.request_stop("connection ended")
                nursery.cancel_scope.cancel()

    async def _read_intent(
        self, peer: Peer, lease: str, intent: Intent, holding: trio.CancelScope
    ) -> None:
        """Relay the caller's messages after Register: Started (and, for a governed network,
        Govern and AskDenials, answered here), then Close (or EOF), or Detach."""
        try:
            while True:
                message = await peer.receive()
                if message is None:
                    intent.request_stop("caller disconnected")
                    return
                if isinstance(message, Started) and message.lease == lease:
                    intent.started.set()
                    intent.nudge.set()
                elif isinstance(message, Govern) and message.lease == lease:
                    await peer.send(Governed(lease=lease, problem=await self.govern_lease(lease)))
                elif isinstance(message, AskDenials) and message.lease == lease:
                    live = self.live.get(lease)
                    governor = live.governor if live is not None else None
                    kept, dropped = governor.denied() if governor is not None else ((), 0)
                    ports = list(governor.ports) if governor is not None else []
                    await peer.send(
                        Denials(lease=lease, denials=list(kept), dropped=dropped, ports=ports)
                    )
                elif isinstance(message, Close) and message.lease == lease:
                    intent.request_stop("caller closed")
                    return
                elif isinstance(message, Detach) and message.lease == lease:
                    answer = await self.detach_lease(message)
                    await peer.send(answer)
                    if answer.problem is None:
                        intent.detached.set()  # the lease is the supervisor's to keep now
                        holding.cancel()
                        return
                else:
                    raise WireError(f"unexpected {type(message).__name__} after registration")
        except WireError as exc:
            log(f"lease {lease}: {exc}; treated as the caller leaving")
            intent.request_stop("protocol error")

    async def handoff_loaded(self) -> None:
        """Import what serves the hand-off (``Run``: the CLI's parser, the planning;
        ``RunResume``) once, in a worker thread, one import at a time: the startup's
        preload and the first connection that needs it wait for the same import. Two at
        once — the preload in its thread, a ``Run`` or ``RunResume`` on the event loop —
        entered the CLI package's import cycle from two threads, and one found a partly
        initialized module (ImportError, KeyError('sbxkit.cli')): the connection dropped,
        and a failed preload ended the whole supervisor."""
        async with self.handoff_import:
            if HANDOFF_MODULE not in sys.modules:
                await trio.to_thread.run_sync(importlib.import_module, HANDOFF_MODULE)

    def recovery_report(self) -> list[str]:
        """What ``sbxkit leases recover`` prints: each record no live lease owns (with what
        is left of a hold for re-adoption), the recent re-adoption outcomes, the counters."""
        now = trio.current_time()
        lines = []
        for record in self.orphans():
            until = self.held.get(record.lease)
            left = None if until is None else max(0.0, until - now)
            held = "" if left is None else f"; held {left:.1f} s more for re-adoption"
            lines.append(describe(record) + held)
        return lines + list(self.history) + [self.stats()]

    async def _stop_on_signal(self, done: trio.CancelScope) -> None:
        """SIGTERM or SIGINT: parked pool containers are removed and removals under way are
        finished before the process ends; every other lease keeps its record, and the next
        start recovers it (as after a crash)."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log(f"{signal.Signals(signum).name}: removing parked containers, then exiting")
                with trio.CancelScope(shield=True):
                    await self._drain_pools()
                    await self._finish_removals_under_way()
                done.cancel()
                return

    async def _finish_removals_under_way(self) -> None:
        """A lease whose caller is done (a run that returned at its payload's exit, a closed
        sandbox) is removed before the process ends, within ``self.remove_budget_s``: nobody
        will re-adopt it, so leaving it to the next start would strand its container until
        then. Leases still running keep their records for their callers to re-adopt."""
        ending = [live for live in self.live.values() if live.stop.is_set()]
        if not ending:
            return
        log(f"finishing {len(ending)} removal(s) under way")
        with trio.move_on_after(self.remove_budget_s):
            for live in ending:
                await live.finished.wait()

    async def _idle_exit(self, done: trio.CancelScope) -> None:
        while True:
            await trio.sleep(min(1.0, self.config.idle_exit_s))
            idle = not self.live and not self.records and self.connections == 0
            if idle and trio.current_time() - self.last_activity >= self.config.idle_exit_s:
                log(f"idle and record-free; exiting ({self.stats()})")
                done.cancel()
                return


async def serve(config: Config) -> int:
    """Run the service until idle (or forever with ``persistent``). Returns an exit status."""
    try:
        state_path = await trio.to_thread.run_sync(
            lambda: check_state_dir(config.state_dir, create=True)
        )
    except StorageError as exc:
        log(f"{STARTUP_REFUSAL} {exc}")
        return 1
    state = StateDir(state_path)
    try:
        lock_fd = await trio.to_thread.run_sync(state.try_lock)
    except StorageError as exc:
        log(f"{STARTUP_REFUSAL} {exc}")
        return 1
    if lock_fd is None:
        log(f"another supervisor holds {state.lock_path}; leaving it undisturbed")
        return 0
    try:
        return await _serve_locked(config, state)
    finally:
        os.close(lock_fd)


async def _serve_locked(config: Config, state: StateDir) -> int:
    odd, stale = await trio.to_thread.run_sync(state.remove_stale_private_files)
    if stale:
        log(f"removed stale private files: {', '.join(stale)}")
    journal = Journal(state)
    service = Service(config, state, journal)
    # Odd entries and unreadable records block new execution until removed: every admission
    # audits the directory afresh (StateDir.audit), so they are only logged here.
    for problem in odd:
        log(f"blocking new execution: {problem}")
    for path in await trio.to_thread.run_sync(state.record_paths):
        try:
            record = await trio.to_thread.run_sync(state.read_record, path)
        except StorageError as exc:
            log(f"blocking new execution: {exc}")
            continue
        service.records[record.lease] = record
        # Its container may exist: its memory stays reserved until recovery confirms it gone,
        # and its own uid held.
        service.admission.hold(record.lease, Need(record.memory_bytes, record.nano_cpus))
        service.hold_record_uid(record)
    if service.records:
        log(f"recovering {len(service.records)} lease record(s)")
    service.hold_for_adoption()

    # We hold the lock, so a socket file left on disk belongs to a dead instance.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state.socket_path)
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await listener.bind(str(state.socket_path))
    except OSError as exc:
        log(f"{STARTUP_REFUSAL} {state.socket_path}: cannot listen: {exc.strerror}")
        listener.close()
        return 1
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
            nursery.start_soon(service._stop_on_signal, nursery.cancel_scope)
            nursery.start_soon(_load_handoff, service)
            await trio.serve_listeners(service.handle, [trio.SocketListener(listener)])
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(state.socket_path)
        for engine in service.engines.values():
            with trio.CancelScope(shield=True):
                await engine.aclose()
    return 0


async def _load_handoff(service: Service) -> None:
    """Load what serves ``sbxkit run``'s hand-off in a worker thread once the socket listens:
    the first run handed off does not wait for the imports from scratch, and nothing else
    here is held up by them on the event loop. A failure is the connections' to report (each
    tries again, and is dropped with the error); the service and its leases go on."""
    try:
        await service.handoff_loaded()
    except Exception as exc:
        log(f"loading the hand-off failed: {exc!r}")


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser("sbxkit-supervisor").parse_args(argv)
    sys.exit(trio.run(serve, config_from_args(args)))


__all__ = ["Capacity", "Config", "Service", "main", "serve"]
