"""Recovery: records no live task owns (after a crash, a failed removal, an uncertain create)
are resolved by observing the daemon — at startup, in the reaper loop, and while uncertain
records exist, at once when the event stream shows their container appear."""

from __future__ import annotations

import time

import trio

from sbxkit._kernel.fifos import remove_io_dir, stale_io_dirs
from sbxkit._kernel.scripts import io_root
from sbxkit._lifecycle.ownership import carries_lease, find_lease_container
from sbxkit._plan.policy import LEASE_LABEL
from sbxkit._protocol import records as rec
from sbxkit._protocol.records import LeaseRecord
from sbxkit._protocol.wire import Report
from sbxkit.errors import NotFound, SbxError
from sbxkit.supervisor.core import ServiceCore
from sbxkit.supervisor.lease import (
    Peer,
    log,
)

STALE_IO_MARGIN_S = 60.0
"""How much older than the longest admission wait a FIFO directory with no lease must be."""


class Recovery(ServiceCore):
    async def recover_once(self) -> None:
        for record in self.orphans():
            lease = record.lease
            # An adoption may have taken it over (or it ended) while an earlier one was done.
            record_now = self.records.get(lease)
            if record_now is None or lease in self.live or lease in self.adopting:
                continue
            self.recovering.add(lease)
            try:
                await self._recover(record_now)
            except SbxError as exc:
                log(f"lease {lease}: recovery attempt failed: {exc}")
            except OSError as exc:
                log(f"lease {lease}: journal error during recovery: {exc}")
            finally:
                self.recovering.discard(lease)
                self.recovery_done.set()  # an Adopt waiting for this lease's verdict goes on
                self.recovery_done = trio.Event()
        self.sweep_io_dirs()

    def sweep_io_dirs(self) -> None:
        """Remove the FIFO directories no lease can use any more. A caller makes its lease's
        directory just before it registers, and nothing is journaled until admission: one
        killed while it waited leaves the directory behind. Removed once no record, live,
        queued, admitted or adopting lease has its name and it is older than the longest
        admission wait (so no caller still waiting can be using it)."""
        root = io_root(self.state.path)
        older_than_s = self.config.capacity.admission_timeout_s + STALE_IO_MARGIN_S
        for lease in stale_io_dirs(root, older_than_s=older_than_s, now=time.time()):
            if (
                lease in self.records
                or lease in self.live
                or lease in self.adopting
                or lease in self.admission
            ):
                continue
            try:
                remove_io_dir(root, lease)
            except OSError as exc:  # not what sbxkit made (another file in it): left alone
                log(f"lease {lease}: its stale FIFO directory could not be removed: {exc}")
                continue
            log(f"lease {lease}: removed its FIFO directory (its caller never registered)")

    def hold_left(self, record: LeaseRecord) -> float | None:
        """Seconds its hold for re-adoption has left, or None: not held (any more). A hold
        ends at the grace period's end, or sooner at the lease's lifetime deadline."""
        until = self.held.get(record.lease)
        if until is None:
            return None
        left = min(until - trio.current_time(), record.lifetime_deadline - time.time())
        if left > 0:
            return left
        del self.held[record.lease]
        grace = self.config.adopt_grace_s
        why = (
            "its lifetime deadline passed"
            if record.lifetime_deadline <= time.time()
            else "it was detached and nobody reattached it by its keep deadline"
            if record.detached_until is not None
            else f"no caller re-adopted it within the {grace:g} s grace period"
        )
        self.note(f"lease {record.lease}: expired unclaimed: {why}; recovery removes it")
        return None

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
            if not carries_lease(info.config.labels, record.lease):
                self._report_foreign(record, info.config.labels or {})
                return
            left = self.hold_left(record)
            if left is not None:  # live and verified: its caller may still re-adopt it
                if record.lease not in self.held_told:
                    self.held_told.add(record.lease)
                    log(
                        f"lease {record.lease}: container {record.container_id[:12]} is "
                        f"{info.state.status}; held {left:.1f} s for its caller to re-adopt"
                    )
                return
            error = await self._remove_container(engine, record.lease, record.container_id)
            if error is None:
                await self._forget(record.lease)
                log(
                    f"lease {record.lease}: recovered, container {record.container_id[:12]} removed"
                )
            return
        # uncertain: resolved only by observing and removing the owned container.
        late = await find_lease_container(engine, record.lease, record.name)
        if late is None:
            return
        error = await self._remove_container(engine, record.lease, late)
        if error is None:
            await self._forget(record.lease)
            resolved = "uncertain record resolved"
            log(f"lease {record.lease}: late container {late[:12]} removed; {resolved}")

    async def _retire(self, peer: Peer, lease: str) -> None:
        """Delete a tombstone only if its container was never observed: checked now, by label
        and by name, on the daemon the record names."""
        record = self.records.get(lease)
        if record is None or lease in self.live or lease in self.adopting:
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
            wait = self.config.reaper_interval_s
            if self.held:  # a hold that ends is recovered at once, not at the next interval
                wait = min(wait, max(0.0, min(self.held.values()) - trio.current_time()) + 0.01)
            with trio.move_on_after(wait):
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
