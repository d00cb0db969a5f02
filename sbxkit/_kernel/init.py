"""A container's init as a verified pidfd, and how it ended.

``State.Pid`` names the init in the host's PID namespace (docker-init, which exits with its
payload's status: its code, or 128 + the signal). A pid is only a number: it is opened as a
pidfd, then ``/proc/PID/cgroup`` must name the container, and the pidfd must still be
unreadable afterwards — so the process read was the one opened, not a successor with a recycled
pid. From then on the pidfd is the kernel's handle on that one process: readable once it
exited, and (``pidfd.exit_status``) its wait status once reaped.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
from collections.abc import Awaitable, Callable

import trio

from sbxkit._kernel.memevents import (
    EventReads,
    hierarchical_events,
    kills_since,
    lasting_parent,
    oom_kill_count,
)
from sbxkit._kernel.pidfd import (
    exit_status,
    open_pidfd,
    reap_watch,
    status_code,
    still_running,
    zombie_status,
)
from sbxkit._util.unwrap import plain_async

__all__ = ["REAP_POLL_S", "ContainerInit", "InitUnverified"]

REAP_POLL_S = 0.01
"""The backstop between asks for the reaped status once the pidfd is readable; the wait
itself ends at the reap, which the pidfd reports (the shim reaps within a millisecond)."""
REAP_LIMIT_S = 5.0
REMOVAL_SIGNAL_S = 0.25
"""The longest wait for a removed memory cgroup's last eventfd signal. If it came before the
exit was read (the usual case when the cgroup is already gone) it never comes again, and the
daemon, whose exit path has run by then, notes a child's OOM instead."""
WATCH_BACKSTOP_S = 1.0
"""The longest between two reads of a v2 ``memory.events`` while the payload runs: a change
of it wakes the watch at once (``POLLPRI``); this only guards against a wake-up missed."""


class InitUnverified(Exception):
    """The pid is not (or no longer) the container's running init."""


def memory_cgroup_of(cgroups: str) -> tuple[str, str] | None:
    """A process's memory cgroup directory on the host and its version (``v1``/``v2``), from
    its ``/proc/PID/cgroup``; None when neither hierarchy is named."""
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return f"/sys/fs/cgroup/memory{path}", "v1"
    for line in cgroups.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            return f"/sys/fs/cgroup{path}", "v2"
    return None


def oom_kills(counter: str) -> int | None:
    """The ``oom_kill`` count of a memory cgroup, or None once it is gone."""
    try:
        with open(counter, encoding="ascii") as file:
            for line in file:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


class OomWatch:
    """Whether a process of the sandbox was OOM-killed, as its memory cgroup tells the host.

    The cgroup is removed in the daemon's exit path soon after the init's exit — on a loaded
    host sometimes before this process has run again — so its count cannot simply be read at
    the end. On cgroup v1 an eventfd is registered for the cgroup's OOM notifications
    (``cgroup.event_control``) while it runs: every OOM signals it at once, and its removal
    signals it once more. Read at the exit: 0 proves no OOM happened; 1 is an OOM if the
    cgroup was still there, else either; 2 or more, an OOM. Where that cannot decide (the
    registration failed) the ``oom_kill`` count is read at the exit, if still there. On v2
    (no eventfd) ``memory.events`` is watched while the init's exit is waited for
    (``EventsWatch``); ``container_id`` names the groups that go with the container."""

    def __init__(self, cgroups: str, container_id: str | None = None) -> None:
        found = memory_cgroup_of(cgroups) if cgroups else None
        self.directory = found[0] if found else None
        v1 = found is not None and found[1] == "v1"
        self.counter = f"{self.directory}/memory.oom_control" if v1 else None
        self.baseline = oom_kills(self.counter) if self.counter else None
        self.eventfd: int | None = None
        self.events: EventsWatch | None = None
        if found is not None and v1:
            self.eventfd = _register_oom_eventfd(found[0])
        elif found is not None:
            self.events = EventsWatch(found[0], lasting_parent(found[0], container_id))
        self._events: int | None = None
        self._count: int | None = None
        self._alive = False

    async def during(self, wait: Callable[[], Awaitable[object]]) -> None:
        """``await wait()`` — on v2, with the cgroup's ``memory.events`` watched meanwhile."""
        if self.events is None:
            await wait()
        else:
            await self.events.during(wait)

    def at_exit(self) -> None:
        """Read what the kernel counted, the moment the init's exit was seen."""
        if self.events is not None:
            self.events.at_exit()
            return
        if self.eventfd is not None:
            try:
                self._events = os.eventfd_read(self.eventfd)
            except BlockingIOError:
                self._events = 0
            except OSError:
                self._events = None
        if self.counter is not None:
            self._count = oom_kills(self.counter)
        self._alive = self._count is not None

    async def kills(self) -> int | None:
        """OOM kills seen in the sandbox while it ran (≥ 1 means at least one), or None when
        the kernel's counts cannot tell: then the daemon must."""
        if self.events is not None:
            await trio.lowlevel.checkpoint()
            return self.events.kills()
        if self._count is not None and self.baseline is not None:
            return self._count - self.baseline
        events = self._events
        if events is None or self.eventfd is None:
            return None
        if events == 0:
            return 0  # an OOM signals at once, while the payload runs: none came
        # The cgroup was gone at the exit: its removal signals once (the kernel's offline
        # work), maybe not yet. Wait for that signal; the rest were OOMs.
        with trio.move_on_after(REMOVAL_SIGNAL_S):
            while True:
                try:
                    events += os.eventfd_read(self.eventfd)
                except BlockingIOError:
                    if events >= 2:
                        break
                    await trio.lowlevel.wait_readable(self.eventfd)
                    continue
                except OSError:
                    return None
                break
            return events - 1
        return None

    def close(self) -> None:
        if self.eventfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.eventfd)
            self.eventfd = None
        if self.events is not None:
            self.events.close()


class EventsWatch:
    """A v2 memory cgroup's ``memory.events``, held open from the moment the init's cgroup is
    known: its ``oom_kill`` count read then (the baseline, with its parent's), at each change
    while the init's exit is waited for (a change wakes a poll for ``POLLPRI``), and after the
    exit with its parent's again. ``kills`` decides on those reads (``memevents.kills_since``):
    the cgroup is usually gone by the exit, and then the last count seen, or the parent's
    unchanged count, tells. ``parent``: the ancestor read (``memevents.lasting_parent``; the
    direct parent if not given)."""

    def __init__(self, directory: str, parent: str | None = None) -> None:
        self.parent = f"{parent or os.path.dirname(directory)}/memory.events"
        self.fd: int | None = None
        self.poller: select.epoll | None = None
        self.last: int | None = None
        with contextlib.suppress(OSError):
            self.fd = os.open(f"{directory}/memory.events", os.O_RDONLY | os.O_CLOEXEC)
        self.baseline = self.read()
        self.parent_before = _oom_kill_at(self.parent)
        self.hierarchical = _hierarchical(os.path.exists(f"{directory}/memory.events.local"))
        self.at_exit_count: int | None = None
        self.parent_after: int | None = None
        if self.fd is not None:
            with contextlib.suppress(OSError):  # no poll (not a cgroup file): the backstop alone
                self.poller = _priority_poller(self.fd)

    def read(self) -> int | None:
        """The count now through the open file (``last`` kept); None once the cgroup is gone."""
        if self.fd is None:
            return None
        try:
            text = os.pread(self.fd, 4096, 0).decode("ascii", "replace")
        except OSError:
            return None
        count = oom_kill_count(text)
        if count is not None:
            self.last = count
        return count

    async def watch(self) -> None:
        """Read the count at each change (or ``WATCH_BACKSTOP_S``) until the cgroup is gone."""
        while self.read() is not None:
            with trio.move_on_after(WATCH_BACKSTOP_S):
                if self.poller is None:
                    await trio.sleep_forever()
                else:
                    await trio.lowlevel.wait_readable(self.poller.fileno())
                    with contextlib.suppress(OSError):
                        self.poller.poll(0)

    @plain_async  # the watch raises nothing: only ``wait``'s own errors leave
    async def during(self, wait: Callable[[], Awaitable[object]]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.watch)
            await wait()
            nursery.cancel_scope.cancel()

    def at_exit(self) -> None:
        self.at_exit_count = self.read()
        self.parent_after = _oom_kill_at(self.parent)

    def kills(self) -> int | None:
        return kills_since(
            EventReads(
                baseline=self.baseline,
                last=self.last,
                at_exit=self.at_exit_count,
                parent_before=self.parent_before,
                parent_after=self.parent_after,
                hierarchical=self.hierarchical,
            )
        )

    def close(self) -> None:
        if self.poller is not None:
            self.poller.close()
            self.poller = None
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _priority_poller(fd: int) -> select.epoll:
    """An epoll that is readable once ``fd`` reports ``POLLPRI`` (a cgroup file changed)."""
    poller = select.epoll()
    try:
        poller.register(fd, select.EPOLLPRI)
    except BaseException:
        poller.close()
        raise
    return poller


def _oom_kill_at(path: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return oom_kill_count(file.read())
    except OSError:
        return None


@functools.cache
def _hierarchical(has_local_events: bool) -> bool:
    """``memevents.hierarchical_events`` of this host, read once per process (a remount of the
    cgroup2 hierarchy with ``memory_localevents`` needs a restart to be seen)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as file:
            return hierarchical_events(file.read(), has_local_events)
    except OSError:
        return False


def _register_oom_eventfd(directory: str) -> int | None:
    """An eventfd the memory cgroup signals on each OOM (and once at its removal)."""
    try:
        eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    except OSError:
        return None
    try:
        control = os.open(f"{directory}/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        try:
            with open(f"{directory}/cgroup.event_control", "w", encoding="ascii") as events:
                events.write(f"{eventfd} {control}")
        finally:
            os.close(control)
    except OSError:
        os.close(eventfd)
        return None
    return eventfd


class ContainerInit:
    """The container's init process, held as a pidfd; ``close`` releases it. ``oom``: what
    its memory cgroup tells the host about OOM kills in the sandbox (``OomWatch``)."""

    def __init__(
        self, pidfd: int, pid: int, cgroups: str = "", container_id: str | None = None
    ) -> None:
        self.pidfd = pidfd
        self.pid = pid
        self.oom = OomWatch(cgroups, container_id)

    async def oom_kills_since(self) -> int | None:
        """OOM kills in the sandbox while it ran; None when only the daemon can tell."""
        return await self.oom.kills()

    @classmethod
    def verified(cls, pid: int, container_id: str) -> ContainerInit:
        """Open ``pid`` and prove it is ``container_id``'s init, alive now."""
        if pid <= 0:
            raise InitUnverified("the container has no running init")
        try:
            pidfd = open_pidfd(pid)
        except (ProcessLookupError, PermissionError) as exc:
            raise InitUnverified(f"pid {pid}: {exc.strerror}") from None
        try:
            try:
                with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as file:
                    groups = file.read()
            except OSError as exc:
                raise InitUnverified(f"pid {pid}: {exc.strerror}") from None
            if container_id not in groups:
                raise InitUnverified(f"pid {pid} is not in the container's cgroup")
            init = cls(pidfd, pid, groups, container_id)
        except BaseException:
            os.close(pidfd)
            raise
        if not still_running(pidfd):
            init.close()  # its OOM watch's files with the pidfd
            raise InitUnverified(f"pid {pid} exited")
        return init

    @classmethod
    def adopt(cls, pidfd: int, container_id: str | None = None) -> ContainerInit:
        """A pidfd verified by someone else (a pool's parked container, handed over): its
        pid and memory cgroup are read again, for the OOM-kill count."""
        pid, groups = 0, ""
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as info:
                for line in info:
                    if line.startswith("Pid:"):
                        pid = int(line.split()[1])
            if pid > 0:
                with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as file:
                    groups = file.read()
        init = cls(pidfd, pid, groups if pid > 0 and still_running(pidfd) else "", container_id)
        return init

    def running(self) -> bool:
        return still_running(self.pidfd)

    async def exited(self) -> int:
        """Wait for the init to exit and be reaped; its status as Docker spells it."""
        await self.oom.during(functools.partial(trio.lowlevel.wait_readable, self.pidfd))
        self.oom.at_exit()  # before anything else: the cgroup goes soon
        status = exit_status(self.pidfd)
        if status is None:  # exited, not reaped yet: its zombie's record, or the reap's
            status = zombie_status(self.pid, self.pidfd)
        if status is None:
            with contextlib.closing(reap_watch(self.pidfd)) as watch:
                with trio.fail_after(REAP_LIMIT_S):
                    while (status := exit_status(self.pidfd)) is None:
                        with trio.move_on_after(REAP_POLL_S):
                            await trio.lowlevel.wait_readable(watch.fileno())
        return status_code(status)

    def close(self) -> None:
        self.oom.close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
