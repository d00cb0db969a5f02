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
import os

import trio

from sbxkit._kernel.pidfd import (
    exit_status,
    open_pidfd,
    reap_watch,
    status_code,
    still_running,
    zombie_status,
)

__all__ = ["REAP_POLL_S", "ContainerInit", "InitUnverified"]

REAP_POLL_S = 0.01
"""The backstop between asks for the reaped status once the pidfd is readable; the wait
itself ends at the reap, which the pidfd reports (the shim reaps within a millisecond)."""
REAP_LIMIT_S = 5.0
REMOVAL_SIGNAL_S = 0.25
"""The longest wait for a removed memory cgroup's last eventfd signal. If it came before the
exit was read (the usual case when the cgroup is already gone) it never comes again, and the
daemon, whose exit path has run by then, notes a child's OOM instead."""


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
    cgroup was still there, else either; 2 or more, an OOM. Where that cannot decide (v2, or
    the registration failed) the ``oom_kill`` count is read at the exit, if still there."""

    def __init__(self, cgroups: str) -> None:
        found = memory_cgroup_of(cgroups) if cgroups else None
        self.directory = found[0] if found else None
        control = "memory.oom_control" if found and found[1] == "v1" else "memory.events"
        self.counter = f"{self.directory}/{control}" if self.directory else None
        self.baseline = oom_kills(self.counter) if self.counter else None
        self.eventfd: int | None = None
        if found is not None and found[1] == "v1":
            self.eventfd = _register_oom_eventfd(found[0])
        self._events: int | None = None
        self._count: int | None = None
        self._alive = False

    def at_exit(self) -> None:
        """Read what the kernel counted, the moment the init's exit was seen."""
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

    def __init__(self, pidfd: int, pid: int, cgroups: str = "") -> None:
        self.pidfd = pidfd
        self.pid = pid
        self.oom = OomWatch(cgroups)

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
            init = cls(pidfd, pid, groups)
            if not still_running(pidfd):
                raise InitUnverified(f"pid {pid} exited")
        except BaseException:
            os.close(pidfd)
            raise
        return init

    @classmethod
    def adopt(cls, pidfd: int) -> ContainerInit:
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
        init = cls(pidfd, pid, groups if pid > 0 and still_running(pidfd) else "")
        return init

    def running(self) -> bool:
        return still_running(self.pidfd)

    async def exited(self) -> int:
        """Wait for the init to exit and be reaped; its status as Docker spells it."""
        await trio.lowlevel.wait_readable(self.pidfd)
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
