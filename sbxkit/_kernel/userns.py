"""Whether root inside a started container is root on the host, as the host's kernel says.

A workspace with root inside (``Workspace.root``) is planned only where a witness says its
root is not the host's (``sbxkit._plan.preflight.root_inside_witness``: the daemon remaps user
namespaces or runs rootless, the runtime is gVisor, or rootful Podman was asked for a user
namespace of the container's own, ``--userns=auto``). Once its container runs, and before
its payload does (a one-shot run waits behind its gate, a session's keep-alive is sbxkit's),
the host's kernel is asked too: the container's init, proven the container's by its cgroup
(as the kernel path proves it), has its ``/proc/PID/uid_map`` read, and no line of it may map
any id onto host uid 0. Under gVisor the init the daemon names is gVisor's sandbox process:
the same rule holds for it, since the payload's root lives in gVisor's kernel, not the host's.

Where the host cannot see the container's processes (a remote or VM-backed daemon), the
daemon's word stands alone; ``host_root_problem`` says so instead of guessing. On rootful
Podman the daemon's word is also read before the start: the maps Podman recorded at the create
(``recorded_maps_problem``).
"""

from __future__ import annotations

import os

from sbxkit._kernel.pidfd import open_pidfd, still_running

__all__ = [
    "IdMap",
    "host_root_problem",
    "maps_host_root",
    "outside_id",
    "parse_id_map",
    "read_uid_map",
    "recorded_maps_problem",
]

IdMap = tuple[tuple[int, int, int], ...]
"""``(first id inside, first id outside, count)`` lines of ``/proc/PID/uid_map``."""


def parse_id_map(text: str) -> IdMap:
    """The lines of an id map (pure); ValueError for anything that is not one."""
    lines = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3:
            raise ValueError(f"not an id map line: {line!r}")
        inside, outside, count = (int(field) for field in fields)
        if min(inside, outside) < 0 or count <= 0:
            raise ValueError(f"not an id map line: {line!r}")
        lines.append((inside, outside, count))
    if not lines:
        raise ValueError("an empty id map")
    return tuple(lines)


def maps_host_root(id_map: IdMap) -> bool:
    """Some id inside maps onto host uid 0 (pure). An identity map (the host's own user
    namespace: ``0 0 4294967295``) does, for root inside is then root."""
    return any(outside == 0 for _inside, outside, _count in id_map)


def outside_id(id_map: IdMap, inside: int) -> int | None:
    """The host's id for ``inside`` under ``id_map`` (pure); None where it maps nowhere."""
    for first_inside, first_outside, count in id_map:
        if first_inside <= inside < first_inside + count:
            return first_outside + inside - first_inside
    return None


def read_uid_map(pid: int, container_id: str) -> str | None:
    """``/proc/PID/uid_map`` of ``container_id``'s process ``pid``, or None when this host
    cannot tell: the pid is not one of its processes in that container's cgroup (another
    machine's pid), or it is gone. Held by a pidfd while read, so a reused pid is caught."""
    if pid <= 0:
        return None
    try:
        pidfd = open_pidfd(pid)
    except (ProcessLookupError, PermissionError):
        return None
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as file:
            if container_id not in file.read():
                return None
        with open(f"/proc/{pid}/uid_map", encoding="ascii") as file:
            text = file.read()
        return text if still_running(pidfd) else None
    except OSError:
        return None
    finally:
        os.close(pidfd)


def host_root_problem(uid_map: str | None, witness: str) -> str | None:
    """Why the kernel contradicts ``witness`` (pure): its map reaches host uid 0, or it is not
    one. None when it agrees, or when the host could not read it (``uid_map`` None): then the
    daemon's word, checked before the create, stands alone."""
    if uid_map is None:
        return None
    try:
        id_map = parse_id_map(uid_map)
    except ValueError as exc:
        return f"the container's uid map cannot be read as one ({exc})"
    if maps_host_root(id_map):
        return (
            f"the host's kernel maps the container's ids onto host root ({uid_map.strip()!r}), "
            f"though the daemon said {witness}: root inside would be root on the host"
        )
    return None


def recorded_maps_problem(uid_map: list[str] | None, gid_map: list[str] | None) -> str | None:
    """Why the maps a daemon recorded for a container asked for a user namespace of its own
    (Podman's ``IDMappings``: ``INSIDE:HOST:COUNT`` lines) do not keep root inside off host root
    (pure): none at all (it runs in the host's user namespace), or a line onto host id 0."""
    for kind, lines in (("uid", uid_map), ("gid", gid_map)):
        if not lines:
            return (
                f"the daemon recorded no {kind} map for it: it runs in the host's user "
                "namespace, though a user namespace of its own was asked for"
            )
        try:
            id_map = parse_id_map("\n".join(line.replace(":", " ") for line in lines))
        except ValueError as exc:
            return f"the daemon's {kind} map cannot be read as one ({exc})"
        if maps_host_root(id_map):
            return f"the daemon's {kind} map {lines!r} reaches host id 0"
    return None
