"""A sandbox's OOM kills on cgroup v2, from ``memory.events`` read on the host (pure).

v2 has no OOM eventfd. Its ``memory.events`` counts ``oom_kill`` (processes the OOM killer
killed; ``oom`` counts the killer's invocations, killing or not) and is hierarchical: a
cgroup's counts include every descendant's, unless the hierarchy is mounted with
``memory_localevents`` (and on kernels before 5.2, which also lack ``memory.events.local``).
The kernel adds to the counts of the cgroup and of every ancestor at the kill itself, before
the victim dies, so before its sandbox's init can exit on it.

The sandbox's cgroup is often removed (its scope stopped) before the host reads the init's
exit, so its file is watched while the payload runs (``sbxkit._kernel.init``) and, at the exit,
its parent's is read too. ``kills_since`` decides on those reads. Only the kernel writes these
files: the payload can change a count only by an OOM kill, which is what they count.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "EventReads",
    "hierarchical_events",
    "kills_since",
    "lasting_parent",
    "oom_kill_count",
    "parse_events",
]

LOCAL_EVENTS_OPTION = "memory_localevents"


def parse_events(text: str) -> dict[str, int]:
    """A ``memory.events`` file's counts by name (``oom``, ``oom_kill``, ...); a line that is
    not ``NAME COUNT`` is left out."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name and value.strip().isdigit():
            counts[name] = int(value)
    return counts


def oom_kill_count(text: str) -> int | None:
    """The ``oom_kill`` count of a ``memory.events`` file, or None when it has none."""
    return parse_events(text).get("oom_kill")


def hierarchical_events(mountinfo: str, has_local_events: bool) -> bool:
    """A v2 ``memory.events`` under ``/sys/fs/cgroup`` counts its descendants' events: the
    cgroup2 mount there (``/proc/self/mountinfo``) lacks ``memory_localevents`` and the kernel
    has ``memory.events.local`` (5.2+, where the counts became hierarchical)."""
    if not has_local_events:
        return False
    for line in mountinfo.splitlines():
        mount, separator, filesystem = line.partition(" - ")
        fields, fs_fields = mount.split(), filesystem.split()
        if not separator or len(fields) < 5 or len(fs_fields) < 3:
            continue
        if fields[4] == "/sys/fs/cgroup" and fs_fields[0] == "cgroup2":
            return LOCAL_EVENTS_OPTION not in fs_fields[2].split(",")
    return False


def lasting_parent(directory: str, container_id: str | None) -> str:
    """The cgroup above ``directory`` whose count is read at the exit: the nearest ancestor
    above every component named after the container, which goes with it (under the systemd
    driver runc's group is the ``docker-ID.scope``, crun's a ``container`` child of it: the
    slice above outlives both); the direct parent when no component names it."""
    parts = directory.rstrip("/").split("/")
    named = [index for index, part in enumerate(parts) if container_id and container_id in part]
    return "/".join(parts[: named[0] if named else -1]) or "/"


@dataclass(frozen=True)
class EventReads:
    """What the host read of ``oom_kill`` counts for one run; None where a read failed.

    ``baseline``: the sandbox's cgroup's, once its init was verified (before the payload's go);
    ``last``: the last one read while the payload ran (at its exit included); ``at_exit``:
    read just after the init's exit (None: the cgroup was gone); ``parent_before`` and
    ``parent_after``: its parent cgroup's, with the baseline and after the exit;
    ``hierarchical``: the parent's count includes the sandbox's (``hierarchical_events``)."""

    baseline: int | None
    last: int | None
    at_exit: int | None
    parent_before: int | None
    parent_after: int | None
    hierarchical: bool


def kills_since(reads: EventReads) -> int | None:
    """OOM kills in the sandbox while it ran (≥ 1: at least that many), or None when the
    counts cannot tell — then the daemon must.

    - its cgroup read after the exit: that count less the baseline, exactly;
    - gone by then, but a kill was counted while the payload ran: at least those;
    - gone, none seen, and the parent's hierarchical count unchanged across the run: none,
      anywhere under that parent (a change may be a neighbour's: not ours to guess)."""
    if reads.baseline is None:
        return None
    if reads.at_exit is not None:
        return reads.at_exit - reads.baseline
    if reads.last is not None and reads.last > reads.baseline:
        return reads.last - reads.baseline
    if (
        reads.hierarchical
        and reads.parent_before is not None
        and reads.parent_before == reads.parent_after
    ):
        return 0
    return None
