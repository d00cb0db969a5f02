"""Where a started container's init is, read on the host instead of asked of the daemon.

The first container of a daemon whose init was verified (``State.Pid``, then its
``/proc/PID/cgroup``) shows where that daemon puts its containers' memory cgroups: the same
path with another container's id is that container's. Its ``cgroup.procs`` lists the host pids
in it; the init is the one whose parent is not among them (the shell waiting for the go line,
and anything it started, descend from it). One daemon round trip less on every cold run; the
pid found is verified like any other (``ContainerInit.verified``), and where the layout is not
known or the list does not answer, ``State.Pid`` does.

The layout is kept per daemon socket **and runtime**: on cgroup v2 with the systemd driver runc
leaves the init in the container's scope while crun moves it into a child of it, so one runtime's
layout would send every run of the other to ``State.Pid``.
"""

from __future__ import annotations

__all__ = ["cgroup_layout_known", "init_pid_on_host", "learn_cgroup_layout", "pick_init"]

_ID = "\0id\0"
_layouts: dict[tuple[str, str | None], str] = {}
"""Per daemon socket and runtime (None: the daemon's default): its containers' memory cgroup
directory, the id replaced by ``_ID``."""


def learn_cgroup_layout(
    socket_path: str, runtime: str | None, cgroup_directory: str | None, container_id: str
) -> None:
    """Remember where ``socket_path``'s daemon put ``container_id``'s memory cgroup (its
    verified init's, ``OomWatch.directory``) under ``runtime``."""
    if cgroup_directory is not None and cgroup_directory.count(container_id) == 1:
        _layouts[socket_path, runtime] = cgroup_directory.replace(container_id, _ID)


def cgroup_layout_known(socket_path: str, runtime: str | None) -> bool:
    """``init_pid_on_host`` can answer for ``socket_path``'s containers under ``runtime``."""
    return (socket_path, runtime) in _layouts


def pick_init(pids: list[int], parents: dict[int, int]) -> int | None:
    """The one pid of ``pids`` whose parent is not among them, or None (pure)."""
    inside = set(pids)
    roots = [pid for pid in pids if parents.get(pid, 0) not in inside]
    return roots[0] if len(roots) == 1 else None


def init_pid_on_host(socket_path: str, runtime: str | None, container_id: str) -> int | None:
    """The host pid of ``container_id``'s init from its cgroup's process list, or None."""
    layout = _layouts.get((socket_path, runtime))
    if layout is None:
        return None
    try:
        with open(f"{layout.replace(_ID, container_id)}/cgroup.procs", encoding="ascii") as file:
            pids = [int(line) for line in file if line.strip()]
        parents = {pid: _parent(pid) for pid in pids}
    except (OSError, ValueError):
        return None
    return pick_init(pids, parents)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
        stat = file.read()
    return int(stat[stat.rindex(")") + 2 :].split()[1])
