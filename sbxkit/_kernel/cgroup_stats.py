"""A running sandbox's counters, read from its cgroup on the host (``Sandbox.metrics``,
``sbxkit top``).

The host's kernel keeps them and nothing inside the sandbox can write them: no exec runs, and
the payload sees only its own cgroup namespace's read-only view. The container's init, named by
the daemon (``State.Pid``), is held as a pidfd while its ``/proc/PID/cgroup`` is read; that text
must name the container, and the pidfd must still be unreadable afterwards (as the kernel path
proves an init, ``sbxkit._kernel.init``). Its lines give one directory per controller:

- cgroup v1 (``ID:CONTROLLERS:PATH``, ``/sys/fs/cgroup/CONTROLLERS/PATH``):
  ``memory.usage_in_bytes`` and ``memory.max_usage_in_bytes``, ``cpuacct.usage``
  (nanoseconds), ``pids.current``, ``blkio.throttle.io_service_bytes_recursive``;
- cgroup v2 (``0::PATH``, one directory ``/sys/fs/cgroup/PATH``): ``memory.current`` and
  ``memory.peak`` (kernel 5.19 and later), ``cpu.stat`` ``usage_usec``, ``pids.current``,
  ``io.stat`` ``rbytes``/``wbytes``.

The daemon removes the cgroup when the container's init exits, so a memory directory gone is
the sandbox gone: ``read_sample`` says None. The parsers are pure; ``read_sample`` and
``read_cgroups`` are the thin file shells.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Literal, NamedTuple

from sbxkit._kernel.pidfd import open_pidfd, still_running
from sbxkit._model.result import Metrics

__all__ = [
    "CGROUP_ROOT",
    "CgroupPlaces",
    "cgroup_places",
    "parse_blkio_v1",
    "parse_counter",
    "parse_io_stat_v2",
    "parse_keyed",
    "read_cgroups",
    "read_sample",
]

CGROUP_ROOT = "/sys/fs/cgroup"
_V1_IO_FILES = ("blkio.throttle.io_service_bytes_recursive", "blkio.throttle.io_service_bytes")


class CgroupPlaces(NamedTuple):
    """Where a container's counters live on the host: one directory per controller (all the
    same one on v2); None for a controller its ``/proc/PID/cgroup`` does not name."""

    version: Literal["v1", "v2"]
    memory: str
    cpu: str | None
    pids: str | None
    io: str | None


def cgroup_places(cgroups: str, root: str = CGROUP_ROOT) -> CgroupPlaces | None:
    """A process's controller directories from its ``/proc/PID/cgroup`` (pure). v1 where a
    hierarchy has the memory controller (a hybrid host's empty ``0::`` line is then ignored),
    else v2's one ``0::`` line; None when neither is named."""
    v1: dict[str, str] = {}
    unified: str | None = None
    for line in cgroups.splitlines():
        if line.count(":") < 2:
            continue
        hierarchy, controllers, path = line.split(":", 2)
        if controllers:
            for controller in controllers.split(","):
                v1.setdefault(controller, f"{root}/{controllers}{path}")
        elif hierarchy == "0":
            unified = f"{root}{path}"
    if "memory" in v1:
        return CgroupPlaces("v1", v1["memory"], v1.get("cpuacct"), v1.get("pids"), v1.get("blkio"))
    if unified is not None:
        return CgroupPlaces("v2", unified, unified, unified, unified)
    return None


def parse_counter(text: str) -> int | None:
    """A one-number file (``memory.current``, ``pids.current``, ``cpuacct.usage``); None for
    ``max`` or anything else that is not a count (pure)."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_keyed(text: str) -> dict[str, int]:
    """A flat keyed file such as v2's ``cpu.stat`` (``KEY VALUE`` lines) (pure); lines that
    are not one are skipped."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            found[fields[0]] = int(fields[1])
    return found


def parse_io_stat_v2(text: str) -> tuple[int, int]:
    """Bytes read and written over every device of v2's ``io.stat`` (``MAJ:MIN rbytes=N
    wbytes=N rios=N ...`` lines) (pure)."""
    read = written = 0
    for line in text.splitlines():
        for field in line.split()[1:]:
            key, _, value = field.partition("=")
            if value.isdigit():
                if key == "rbytes":
                    read += int(value)
                elif key == "wbytes":
                    written += int(value)
    return read, written


def parse_blkio_v1(text: str) -> tuple[int, int]:
    """Bytes read and written over every device of v1's ``blkio.*io_service_bytes*``
    (``MAJ:MIN Read N`` lines; the ``Total`` line is not a device's) (pure)."""
    read = written = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3 or not fields[2].isdigit():
            continue
        if fields[1] == "Read":
            read += int(fields[2])
        elif fields[1] == "Write":
            written += int(fields[2])
    return read, written


def read_cgroups(pid: int, container_id: str) -> tuple[str | None, str]:
    """``/proc/PID/cgroup`` of ``container_id``'s init ``pid`` held as a pidfd, or None and
    why this host cannot read it as that container's."""
    if pid <= 0:
        return None, "it has no running init"
    try:
        pidfd = open_pidfd(pid)
    except ProcessLookupError:
        return None, (
            f"its init, pid {pid} as the daemon says, is no process of this host "
            "(a remote or VM-backed daemon, or another pid namespace)"
        )
    except PermissionError as exc:
        return None, f"pid {pid}: {exc.strerror}"
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as file:
            text = file.read()
        if not still_running(pidfd):
            return None, f"its init, pid {pid}, exited"
    except OSError as exc:
        return None, f"/proc/{pid}/cgroup: {exc.strerror}"
    finally:
        os.close(pidfd)
    if container_id not in text:
        return None, (
            f"pid {pid} of this host is not in the container's cgroup: the daemon's pids "
            "are not this host's (a remote or VM-backed daemon)"
        )
    if "/.." in text:
        return None, "its cgroup lies outside this process's cgroup namespace"
    return text, ""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV):  # gone, or going with its container
            return None
        raise


def read_sample(places: CgroupPlaces) -> Metrics | None:
    """The counters now, or None once the sandbox's memory cgroup is gone. A counter this
    kernel lacks is None; a file the caller may not read raises ``PermissionError``."""
    if places.version == "v1":
        current = _read(f"{places.memory}/memory.usage_in_bytes")
        peak = _read(f"{places.memory}/memory.max_usage_in_bytes")
        cpu = _read(f"{places.cpu}/cpuacct.usage") if places.cpu else None
        cpu_s = None if cpu is None or (n := parse_counter(cpu)) is None else n * 1e-9
        io_text = next(
            (t for name in _V1_IO_FILES if places.io and (t := _read(f"{places.io}/{name}"))),
            None,
        )
        io = parse_blkio_v1(io_text) if io_text is not None else None
    else:
        current = _read(f"{places.memory}/memory.current")
        peak = _read(f"{places.memory}/memory.peak")
        stat = _read(f"{places.memory}/cpu.stat")
        usec = parse_keyed(stat).get("usage_usec") if stat is not None else None
        cpu_s = None if usec is None else usec * 1e-6
        io_stat = _read(f"{places.memory}/io.stat")
        io = parse_io_stat_v2(io_stat) if io_stat is not None else None
    pids = _read(f"{places.pids}/pids.current") if places.pids else None
    memory = parse_counter(current) if current is not None else None
    if memory is None and not os.path.isdir(places.memory):
        return None  # removed with its container (a read racing the removal may find it so)
    return Metrics(
        at=time.time(),
        cgroup=places.version,
        cpu_time_s=cpu_s,
        cpu_rate=None,
        memory_bytes=memory,
        memory_peak_bytes=parse_counter(peak) if peak is not None else None,
        pids=parse_counter(pids) if pids is not None else None,
        io_read_bytes=io[0] if io is not None else None,
        io_write_bytes=io[1] if io is not None else None,
    )
