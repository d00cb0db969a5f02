"""One admitted lease's life in the supervisor: create (never cancelled by the caller), hand the
id over, hand the launch slot on once started, wait for close, caller EOF or the lifetime
deadline, remove, delete the record."""

from __future__ import annotations

import trio

from sbxkit._lifecycle.ownership import carries_lease
from sbxkit._model.spec import body_ids
from sbxkit._plan.policy import watched_container, watched_disk
from sbxkit._protocol import records as rec
from sbxkit._protocol.wire import Closed, Created, Expiring, Failed, Launched, Orphaned
from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerInspect
from sbxkit.errors import ContainerMismatch, EngineError, NetworkUnavailable, SbxError, SpecError
from sbxkit.network.governor import Governor
from sbxkit.supervisor.core import ServiceCore
from sbxkit.supervisor.lease import (
    LaunchSlot,
    LiveLease,
    first_of,
    is_definite_create_failure,
    log,
)

DISK_POLL_S = 0.5
"""How often a writable root filesystem without a kernel quota is measured (``SizeRw``, a walk
of its layer): what it may write past its bound is what it writes in this long."""
REGISTERED_HELD_S = 1.0
"""How long a lease's ``Registered`` waits to go out with its ``Created`` (its caller waits
``REPLY_TIMEOUT_S`` for it, then the startup deadline for the container)."""


class Leases(ServiceCore):
    async def _lease_task(
        self,
        live: LiveLease,
        engine: Engine,
        slot: LaunchSlot | None,
        adopted_id: str | None = None,
    ) -> None:
        """Create (or, ``adopted_id``, take over a re-adopted lease's container), then own
        it until close, caller EOF or the lifetime deadline, and remove it."""
        lease = live.record.lease
        try:
            container_id = adopted_id
            if container_id is None:
                assert slot is not None  # a create holds a launch slot
                container_id = await self._create(live, engine)
                if container_id is None:
                    return
                self.nursery.start_soon(self._hand_on_launch_slot, live, slot)
                if live.on_created is not None:
                    await live.on_created(container_id)  # parked until claimed, idle or stopped
            bound = await self._disk_to_watch(live, engine, container_id)
            with trio.move_on_at(live.lifetime_deadline):
                if bound is None:  # no watch to run beside the wait: no nursery to pay for
                    await live.stop.wait()
                else:
                    async with trio.open_nursery() as watching:
                        watching.start_soon(self._watch_disk, live, engine, container_id, bound)
                        await live.stop.wait()
                        watching.cancel_scope.cancel()
            if not live.stop.is_set():
                live.request_stop("lifetime deadline")
                log(f"lease {lease}: lifetime deadline reached; removing its container")
                # Said before the removal's kill, so the caller judges that exit as sbxkit's.
                reason = "the supervisor's lifetime deadline for the lease passed"
                await live.peer.send(Expiring(lease=lease, reason=reason))
            live.close_governor()
            await self._remove_live(live, engine, container_id)
        except (SbxError, OSError) as exc:
            # The record (if any) stays in the journal; the reaper owns it from here.
            log(f"lease {lease}: {exc}; the reaper takes over")
            self.wake_reaper.set()
            await live.peer.send(Orphaned(lease=lease, reason=f"supervisor error: {exc}"))
        finally:
            live.close_governor()
            if slot is not None:
                slot.release()
            self.live.pop(lease, None)
            live.finished.set()
            self.last_activity = trio.current_time()
            if lease in self.records:  # now an orphan: recovery and the event watcher own it
                self.admission.stop_running(lease)
                self._pump()
                self.uncertain_changed.set()
                self.wake_reaper.set()

    async def _disk_to_watch(
        self, live: LiveLease, engine: Engine, container_id: str
    ) -> int | None:
        """The bound of a writable root filesystem no kernel quota holds (``watched_disk``):
        from the registered body, or, for a re-adopted lease, the container's own record."""
        if live.body is not None:
            return watched_disk(live.body)
        try:
            info = await engine.container_inspect(container_id)
        except SbxError:
            return None  # gone, or no answer: the removal that follows says which
        return watched_container(info)

    async def _watch_disk(
        self, live: LiveLease, engine: Engine, container_id: str, bound: int
    ) -> None:
        """End the lease once the daemon measures more than ``bound`` bytes written to the
        container's layer (``SizeRw``): said first (``Expiring``, ``disk_exceeded``), so the
        caller judges the removal's kill as sbxkit's. A failed measurement is tried again."""
        lease = live.record.lease
        while True:
            await trio.sleep(DISK_POLL_S)
            try:
                written = (await engine.container_inspect(container_id, size=True)).size_rw
            except SbxError as exc:
                log(f"lease {lease}: measuring its disk failed: {exc}")
                continue
            if written is None or written <= bound:
                continue
            reason = (
                f"its image's filesystem held {written} bytes written, past the workspace's "
                f"bound of {bound} (the daemon's SizeRw)"
            )
            log(f"lease {lease}: {reason}; removing its container")
            # Said before the stop: the stop cancels this watch, and the removal's kill follows.
            await live.peer.send(Expiring(lease=lease, reason=reason, status="disk_exceeded"))
            live.request_stop("disk bound")
            return

    async def govern_lease(self, lease: str) -> str | None:
        """Put a live lease's listeners in place (its container started, its payload waits);
        why not, or None. The governor serves in the service's nursery until the lease ends."""
        live = self.live.get(lease)
        if live is None or live.record.container_id is None:
            return "the lease has no started container"
        if live.network is None or not live.network.needs_governor:
            return "the lease registered no governed network"
        if live.governor is not None:
            return None
        try:
            user = body_ids((live.body.user if live.body is not None else None) or "")
            engine = await self.engine_for(live.record.engine_socket)
            governor = Governor(lease, live.network, user=user)
            await self.nursery.start(governor.run, engine, live.record.container_id)
        except (SbxError, OSError) as exc:
            log(f"lease {lease}: governed network refused: {exc}")
            if isinstance(exc, NetworkUnavailable):
                return exc.reason
            return str(exc.rule if isinstance(exc, SpecError) else exc)
        live.governor = governor
        if live.stop.is_set():
            governor.close()  # ended meanwhile: nothing to serve
        return None

    async def _hand_on_launch_slot(self, live: LiveLease, slot: LaunchSlot) -> None:
        """The daemon's launch work ends when the caller has started the container (or gives
        up) — or, when this supervisor started it (``launch``), when the daemon answered; a
        caller that never says so holds its slot at most until the startup deadline."""
        with trio.move_on_at(live.startup_deadline):
            if live.launching is not None:
                # Set by ``_launch`` whatever becomes of the start (its ``finally``; the
                # engine's start deadline bounds it), and the lease's removal waits for it:
                # ``finished`` needs no task of its own watching it too.
                await live.launching.wait()
            else:
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
            assert live.body is not None  # only a re-adopted lease has none, and it is created
            try:
                outcome.append(await engine.container_create(live.body, name=live.record.name))
            except SbxError as exc:
                outcome.append(exc)
            created.set()

        self.nursery.start_soon(send_create)
        with trio.move_on_after(REGISTERED_HELD_S):
            await created.wait()
        startup_missed = False
        # The usual create is answered within REGISTERED_HELD_S: it waits no further (each
        # wait on a set event is still a trip through the scheduler).
        if not created.is_set():  # a slow create: the caller hears Registered now
            await live.peer.flush()
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
        # The created record's fsync and the post-create inspection overlap: both are done
        # before anyone hears Created, and a crash in between leaves the creating record,
        # which recovery resolves by the container's name as before. A ``launch`` lease's
        # container starts as soon as the inspection verified it: the start overlaps the
        # record's fsync and the caller's wake (its payload waits for the caller's go line).
        written = self.journal.start_write(live.record)
        try:
            problem, inspected = await self._check_reservation(engine, live, container_id)
            if not (problem or startup_missed or live.stop.is_set()):
                self._launch_if_verified(live, engine, container_id, inspected)
        finally:
            await self.journal.finish(written)
        if startup_missed or live.stop.is_set():
            live.request_stop("startup deadline" if startup_missed else live.stop_reason)
            await self._remove_live(live, engine, container_id)
            return None
        if problem:
            await live.peer.send(Failed(lease=lease, reason=problem))
            live.request_stop(problem)
            await self._remove_live(live, engine, container_id)
            return None
        await live.peer.send(Created(lease=lease, container_id=container_id, inspected=inspected))
        return container_id

    def _launch_if_verified(
        self, live: LiveLease, engine: Engine, container_id: str, inspected: ContainerInspect | None
    ) -> None:
        """Start a ``launch`` lease's container now if its inspection shows the caller's plan
        (``check_created``: the limits, the hardening, exactly the planned mounts and image).
        One that does not is never started here: the caller's own verification of ``Created``
        refuses it precisely (an image moved meanwhile is planned again)."""
        launch = live.launch
        if launch is None or inspected is None or live.body is None:
            return
        try:
            live.check_created(
                inspected,
                container_id,
                expected_mounts=launch.expected_mounts,
                podman=engine.is_podman,
                image_id=launch.image_id,
            )
        except ContainerMismatch:
            return
        live.launching = trio.Event()
        self.nursery.start_soon(self._launch, live, engine, container_id)

    async def _launch(self, live: LiveLease, engine: Engine, container_id: str) -> None:
        """Start the container, then hand the launch slot on and tell the caller the daemon's
        answer (``Launched``). Its removal waits for this answer (``_remove_live``)."""
        assert live.launching is not None
        said = Launched(lease=live.record.lease)
        try:
            await engine.container_start(container_id)
        except EngineError as exc:
            said = Launched(
                lease=live.record.lease, status=exc.status, path=exc.path, message=exc.message
            )
        except SbxError as exc:  # no answer from the daemon: a lost connection, a deadline
            said = Launched(lease=live.record.lease, status=0, message=str(exc))
        finally:
            live.launching.set()
            live.intent.started.set()  # its launch slot goes to the next lease
        if said.status is not None:
            log(f"lease {live.record.lease}: start failed: {said.message}")
        await live.peer.send(said)

    async def _check_reservation(
        self, engine: Engine, live: LiveLease, container_id: str
    ) -> tuple[str | None, ContainerInspect | None]:
        """The container's actual limits must be what was admitted, before it may start:
        the problem if they are not, and the inspection (the caller verifies its plan on it)."""
        try:
            info = await engine.container_inspect(container_id)
        except SbxError as exc:
            return f"post-create inspection failed: {exc}", None
        record = live.record
        host = info.host_config
        problem: str | None = None
        if not carries_lease(info.config.labels or {}, record.lease):
            problem = "the created container does not carry this lease's label"
        elif host.memory != record.memory_bytes:
            problem = (
                f"container memory {host.memory} differs from the reservation {record.memory_bytes}"
            )
        elif host.nano_cpus != record.nano_cpus:
            problem = (
                f"container NanoCpus {host.nano_cpus} differs from the reservation "
                f"{record.nano_cpus}"
            )
        elif info.state.running or info.state.status != "created":
            problem = f"the container is {info.state.status}, not a stopped 'created' container"
        return problem, info

    async def _create_failed(self, live: LiveLease, error: SbxError) -> None:
        lease = live.record.lease
        if is_definite_create_failure(error):
            await self._forget(lease)
            await live.peer.send(Failed(lease=lease, reason=f"create failed: {error}"))
            await live.peer.send(Closed(lease=lease))
            return
        # Its caller hears Failed and Orphaned: it never comes back to re-adopt the lease.
        live.record = rec.uncertain(live.record, f"create failed: {error}", adoptable=False)
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
        # A start this supervisor sent is answered first (usually it was already).
        if live.launching is not None and not live.launching.is_set():
            with trio.move_on_after(engine.deadlines.start):
                await live.launching.wait()
        error = await self._remove_container(engine, lease, container_id)
        if error is None:
            # A created record whose container is gone: its deletion's fsync is grouped
            # with the next write's (a lost unlink is a record recovery finds gone).
            await self._forget(lease, durable=False)
            await live.peer.send(Closed(lease=lease))
            return
        log(f"lease {lease}: removal failed ({error}); record kept, the reaper retries")
        self.wake_reaper.set()
        await live.peer.send(
            Orphaned(lease=lease, reason=f"removal failed, record kept for retry: {error}")
        )
