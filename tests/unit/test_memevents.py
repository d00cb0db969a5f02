"""A sandbox's OOM kills on cgroup v2 (``sbxkit._kernel.memevents``, ``init.EventsWatch``): the
parse of ``memory.events``, whether a parent's count includes its children's, the verdict on
what the host read, and the watch's bookkeeping on files of this host. The kernel's own
notifications and a real v2 hierarchy are the cgroup v2 cell's (scripts/cgroup2-cell)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from sbxkit._kernel import init
from sbxkit._kernel.init import EventsWatch, OomWatch
from sbxkit._kernel.memevents import (
    EventReads,
    hierarchical_events,
    kills_since,
    lasting_parent,
    oom_kill_count,
    parse_events,
)

EVENTS = "low 0\nhigh 0\nmax 41\noom 2\noom_kill 3\noom_group_kill 0\n"
V2_ROOT = (
    "25 1 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
)
V2_LOCAL = V2_ROOT.replace("nsdelegate,", "nsdelegate,memory_localevents,")
HYBRID = (
    "26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
    "27 25 0:25 / /sys/fs/cgroup/memory rw,nosuid shared:11 - cgroup cgroup rw,memory\n"
)


def test_memory_events_parse_by_name() -> None:
    assert parse_events(EVENTS) == {
        "low": 0,
        "high": 0,
        "max": 41,
        "oom": 2,
        "oom_kill": 3,
        "oom_group_kill": 0,
    }
    assert oom_kill_count(EVENTS) == 3
    assert parse_events("oom_kill x\n\nbroken\noom 1 2\n") == {}  # no NAME COUNT line
    assert oom_kill_count("oom 1\n") is None  # a count never named is not a zero
    assert oom_kill_count("") is None


def test_a_parents_count_holds_its_childrens_only_on_a_hierarchical_v2_mount() -> None:
    assert hierarchical_events(V2_ROOT, has_local_events=True)
    assert not hierarchical_events(V2_LOCAL, has_local_events=True)  # memory_localevents
    assert not hierarchical_events(V2_ROOT, has_local_events=False)  # before Linux 5.2
    assert not hierarchical_events(HYBRID, has_local_events=True)  # not at /sys/fs/cgroup
    assert not hierarchical_events("garbage\n\n - \n", has_local_events=True)
    with open("/proc/self/mountinfo", encoding="utf-8") as file:
        here = file.read()
    on_v2 = any(
        line.split(" - ")[1].startswith("cgroup2 ") and line.split()[4] == "/sys/fs/cgroup"
        for line in here.splitlines()
    )
    assert hierarchical_events(here, has_local_events=True) == on_v2


def reads(**changed: int | bool | None) -> EventReads:
    """A run with no OOM kill anywhere whose cgroup was gone at the exit, then ``changed``."""
    base: dict[str, int | bool | None] = {
        "baseline": 4,
        "last": 4,
        "at_exit": None,
        "parent_before": 10,
        "parent_after": 10,
        "hierarchical": True,
    }
    base.update(changed)
    return EventReads(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changed", "kills"),
    [
        ({"at_exit": 4, "last": 4}, 0),  # read after the exit: exact
        ({"at_exit": 6, "last": 6, "parent_after": 12}, 2),
        ({"at_exit": 4, "parent_after": 11}, 0),  # a neighbour's kill: ours was read
        ({}, 0),  # gone; the parent counted nothing under it
        ({"last": 5, "parent_after": 11}, 1),  # gone; seen while it ran
        ({"last": 5, "parent_after": 10}, 1),  # (a parent read is never needed then)
        ({"parent_after": 11}, None),  # gone; someone's kill under the parent: ours?
        ({"hierarchical": False}, None),  # the parent counts only its own processes
        ({"parent_before": None}, None),  # the parent unreadable (the cgroup root)
        ({"parent_after": None}, None),
        ({"baseline": None, "last": None, "at_exit": 0}, None),  # never read: nothing known
    ],
)
def test_the_verdict_rests_only_on_what_the_kernel_counted(
    changed: dict[str, int | bool | None], kills: int | None
) -> None:
    assert kills_since(reads(**changed)) == kills


def write_events(path: Path, oom_kill: int | None) -> None:
    tail = "" if oom_kill is None else f"oom_kill {oom_kill}\n"
    path.write_text(f"low 0\nhigh 0\nmax 0\noom 0\n{tail}")


async def test_the_watch_keeps_the_last_count_once_the_file_reads_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files of this host stand in for a v2 cgroup's (a regular file has no ``POLLPRI``: the
    backstop reads alone). The count seen while the run went survives the file's end, which
    the parent's count alone cannot prove here: this host's /sys/fs/cgroup is not a
    hierarchical cgroup2 mount."""
    group = tmp_path / "system.slice" / "docker-abc.scope"
    group.mkdir(parents=True)
    write_events(group.parent / "memory.events", 7)
    write_events(group / "memory.events", 0)
    (group / "memory.events.local").write_text("oom_kill 0\n")
    monkeypatch.setattr(init, "WATCH_BACKSTOP_S", 0.05)
    watch = EventsWatch(str(group))
    try:
        assert (watch.baseline, watch.parent_before, watch.poller) == (0, 7, None)
        ended = trio.Event()

        async def payload() -> None:
            await trio.sleep(0.1)
            write_events(group / "memory.events", 2)  # two kills while it runs
            await trio.sleep(0.5)  # past a backstop read
            write_events(group / "memory.events", None)  # removed: reads nothing from now
            ended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(payload)
            await watch.during(ended.wait)
        watch.at_exit()
        assert (watch.last, watch.at_exit_count, watch.parent_after) == (2, None, 7)
        assert watch.kills() == 2
        assert watch.hierarchical is False  # this host: v1
        write_events(group / "memory.events", 2)
        quiet = EventsWatch(str(group))  # a run that saw no kill: baseline 2, parent 7
        try:
            write_events(group / "memory.events", None)
            quiet.at_exit()
            assert (quiet.baseline, quiet.last, quiet.at_exit_count) == (2, 2, None)
            assert (quiet.parent_before, quiet.parent_after) == (7, 7)
            assert quiet.kills() is None  # an unchanged parent proves nothing here: the daemon's
        finally:
            quiet.close()
    finally:
        watch.close()
    assert watch.fd is None


async def test_a_v2_init_waits_with_its_memory_events_watched() -> None:
    """``OomWatch`` takes the v2 path from a ``0::`` line of ``/proc/PID/cgroup`` and watches
    only while ``during`` waits; no v2 file at all reads as unknown, never as none."""
    watch = OomWatch("0::/system.slice/docker-gone.scope\n")
    try:
        assert watch.directory == "/sys/fs/cgroup/system.slice/docker-gone.scope"
        assert watch.events is not None
        assert watch.eventfd is None
        await watch.during(trio.lowlevel.checkpoint)
        watch.at_exit()
        assert await watch.kills() is None
    finally:
        watch.close()


RUNC_V2 = f"/sys/fs/cgroup/system.slice/docker-{'a' * 64}.scope"
CRUN_V2 = f"{RUNC_V2}/container"


def test_the_parent_read_at_the_exit_outlives_the_container() -> None:
    """Under the systemd driver runc's group is the container's scope and crun's a
    ``container`` child of it; the scope goes with the container, so both read the slice."""
    slice_ = "/sys/fs/cgroup/system.slice"
    assert lasting_parent(RUNC_V2, "a" * 64) == slice_
    assert lasting_parent(CRUN_V2, "a" * 64) == slice_
    assert lasting_parent(f"/sys/fs/cgroup/docker/{'a' * 64}", "a" * 64) == "/sys/fs/cgroup/docker"
    assert lasting_parent(CRUN_V2, None) == RUNC_V2  # no id (nothing to tell): the direct parent
    assert lasting_parent(CRUN_V2, "b" * 64) == RUNC_V2
    assert lasting_parent(f"/{'a' * 64}", "a" * 64) == "/"


def test_crun_watches_the_slice_not_its_own_scope() -> None:
    """``OomWatch`` with the container's id reads the slice above crun's scope at the exit."""
    watch = OomWatch(f"0::{CRUN_V2.removeprefix('/sys/fs/cgroup')}\n", "a" * 64)
    try:
        assert watch.events is not None
        assert watch.events.parent == "/sys/fs/cgroup/system.slice/memory.events"
    finally:
        watch.close()
    bare = OomWatch(f"0::{CRUN_V2.removeprefix('/sys/fs/cgroup')}\n")
    try:
        assert bare.events is not None
        assert bare.events.parent == f"{RUNC_V2}/memory.events"
    finally:
        bare.close()
