"""The supervisor's shared state and the helpers every part uses.

Its side of the hand-off (``sbxkit.supervisor.handoff``) serves a run in-process through four
calls only, the same a connection's requests go through: ``admit_lease`` (a Register),
``take_parked`` (a Claim), ``govern_lease`` (the listeners of a started lease) and
``adopt_lease`` (an Adopt, for ``RunResume``); besides, it reads ``live``, ``state``, ``config``
and ``allowed_sockets`` and reaches the daemon through ``engine_for``.

``ServiceCore`` holds what the parts share — the records, the live leases, the admission queue,
the engines — and the few operations all of them need: reach an engine, refuse a peer, pump the
admission queue, remove a container with retries, forget a record.
"""

from __future__ import annotations

import os
from collections import deque
from functools import partial

import trio

from sbxkit._kernel.fifos import remove_io_dir
from sbxkit._kernel.scripts import io_root
from sbxkit._lifecycle.admission import AdmissionQueue, Budget
from sbxkit._lifecycle.ownership import Removal, remove_until_gone
from sbxkit._lifecycle.uid_holds import UidHold, hold_uid
from sbxkit._model.bounds import REMOVE_ATTEMPT_BUDGET_S, SLOWNESS_ENV, scaled
from sbxkit._model.uids import reserved_range_of
from sbxkit._plan.policy import container_name
from sbxkit._protocol.fingerprint import implementation_fingerprint
from sbxkit._protocol.journal import Journal, StateDir
from sbxkit._protocol.records import LeaseRecord
from sbxkit._protocol.wire import Refused
from sbxkit.engine.client import Engine, connect
from sbxkit.supervisor.config import Config
from sbxkit.supervisor.lease import (
    Caller,
    Intent,
    LiveLease,
    log,
)
from sbxkit.supervisor.recheck import allowed_engine_sockets

REMOVE_RETRY_CEILING_S = 0.5
HISTORY_LINES = 64
"""Re-adoption outcomes kept for ``sbxkit leases recover`` (the log has every one)."""


class ServiceCore:
    def __init__(self, config: Config, state: StateDir, journal: Journal) -> None:
        self.config = config
        self.state = state
        self.journal = journal
        self.records: dict[str, LeaseRecord] = {}
        self.live: dict[str, LiveLease] = {}
        self.engines: dict[str, Engine] = {}
        self.storage_errors: list[str] = []  # journal writes that failed: sticky until restart
        self.slot_waiters: list[str] = []  # leases waiting for a launch slot, in arrival order
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
        # Read once at start (docs/operations.md, "The supervisor's environment").
        self.environment = os.environb.get(b"SBXKIT_ENV")
        self.allowed_sockets = allowed_engine_sockets(config, os.environ)
        # A bad SBXKIT_HOST_SLOWNESS stops the start, named (its launcher checked it too).
        self.remove_budget_s = scaled(REMOVE_ATTEMPT_BUDGET_S, os.environ.get(SLOWNESS_ENV))
        # Re-adoption (adopting.py): records held for their callers, and who works on which.
        self.held: dict[str, float] = {}  # lease → trio time its hold for re-adoption ends
        self.held_told: set[str] = set()  # leases whose hold was logged
        self.adopting: set[str] = set()  # leases an Adopt is taking over (not orphans)
        self.recovering: set[str] = set()  # leases a recovery pass is resolving
        self.recovery_done = trio.Event()  # set (and renewed) as one leaves ``recovering``
        self.history: deque[str] = deque(maxlen=HISTORY_LINES)
        self.handoff_import = trio.Lock()  # service.py, ``handoff_loaded``
        self.uid_holds: dict[str, UidHold] = {}  # lease → its own uid, held until it is gone
        self.greeting: dict[int, trio.CancelScope] = {}  # connections before their request

    async def engine_for(self, socket_path: str) -> Engine:
        engine = self.engines.get(socket_path)
        if engine is None:
            engine = self.engines[socket_path] = await connect(socket_path)
        return engine

    async def _refuse(self, peer: Caller, code: str, reason: str) -> None:
        await peer.send(Refused(code=code, reason=reason))  # type: ignore[arg-type]

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

    async def _remove_container(self, engine: Engine, lease: str, container_id: str) -> str | None:
        """Remove with retries for a short budget; None once the daemon confirmed it gone,
        else the last error (the record stays and the reaper retries)."""
        removal = Removal()
        with trio.move_on_after(self.remove_budget_s) as budget:
            await remove_until_gone(
                engine,
                lease,
                container_name(lease),
                container_id,
                removal,
                ceiling_s=REMOVE_RETRY_CEILING_S,
            )
        if budget.cancelled_caught:
            return removal.last_error or "not confirmed"
        return None

    def hold_record_uid(self, record: LeaseRecord) -> None:
        """A recorded lease's own uid, held again (a restarted supervisor's records: their
        containers may still run). One another process took meanwhile is only logged."""
        if record.uid is None or record.lease in self.uid_holds:
            return
        uids = reserved_range_of(record.uid)
        held = "not in a sandbox range" if uids is None else hold_uid(record.uid, uids)
        if isinstance(held, str):
            log(f"lease {record.lease}: its uid {record.uid} cannot be held again: {held}")
            return
        self.uid_holds[record.lease] = held

    def let_uid_go(self, lease: str) -> None:
        held = self.uid_holds.pop(lease, None)
        if held is not None:
            held.release()

    async def _forget(self, lease: str, *, durable: bool = True) -> None:
        # The container is confirmed gone: its kernel path FIFOs (sbxkit/kernel) go too,
        # whoever made them — a killed caller leaves none behind. So does the hold on its uid.
        # Removed in the journal's worker thread, just before the record's unlink: off the
        # event loop, where it waited behind the journal's fsyncs on the same filesystem.
        # ``durable=False``: the daemon removed the container (``Journal.delete``).
        await self.journal.delete(
            lease, first=partial(remove_io_dir, io_root(self.state.path), lease), durable=durable
        )
        self.let_uid_go(lease)
        record = self.records.pop(lease, None)
        self.held.pop(lease, None)
        self._release(lease)  # its memory is free only once the container is confirmed gone
        # Only an uncertain record's end is news to the event watcher: any other's woke it
        # once a lease for nothing (a record removed never makes one uncertain).
        if record is not None and record.state == "uncertain":
            self.uncertain_changed.set()

    def stats(self) -> str:
        """Counters for operators and the benchmark (fsyncs per lease, admission waits)."""
        return (
            f"leases admitted: {self.leases_admitted}, journal fsyncs: "
            f"{self.journal.fsyncs}, records: {len(self.records)}, "
            f"queued: {self.queued_total} (waiting now: {self.admission.waiting})"
        )

    def orphans(self) -> list[LeaseRecord]:
        """Records no live lease owns and no adoption is taking over: recovery's."""
        return [
            r
            for lease, r in self.records.items()
            if lease not in self.live and lease not in self.adopting
        ]

    def note(self, line: str) -> None:
        """Log a re-adoption outcome and keep it for ``sbxkit leases recover``."""
        log(line)
        self.history.append(line)

    nursery: trio.Nursery
