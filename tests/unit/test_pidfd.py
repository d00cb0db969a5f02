"""The exit status of a process we hold as a pidfd but are not the parent of reaping: its
zombie's record before the reap, the reap's record after it, and the reap as an event.

Each test forks a child and plays its parent (the container's shim): it decides when the
child is reaped, and reads the status ``waitpid`` gives it to compare. As root, like the
kernel path (for others the kernel shows no zombie's record).
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest

from sbxkit._kernel.pidfd import exit_status, reap_watch, status_code, wait_reaped, zombie_status


@contextmanager
def exited_child(how: str) -> Iterator[tuple[int, int]]:
    """A child that exited (``exit 7`` or SIGKILL) and is not reaped yet; its pid and pidfd.
    Reaped when the block ends if the test did not."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(7)
    pidfd = os.pidfd_open(pid)
    select.select([pidfd], [], [], 5.0)  # readable: it exited
    try:
        yield pid, pidfd
    finally:
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)
        os.close(pidfd)


@pytest.mark.parametrize(("how", "code"), [("exit", 7), ("killed", 137)])
def test_a_zombies_record_is_the_status_its_reap_gives(how: str, code: int) -> None:
    with exited_child(how) as (pid, pidfd):
        assert exit_status(pidfd) is None  # exited, not reaped: the ioctl has nothing yet
        zombie = zombie_status(pid, pidfd)
        assert zombie is not None
        _, reaped = os.waitpid(pid, 0)
        assert zombie == reaped
        assert status_code(zombie) == code
        assert exit_status(pidfd) == reaped  # the reap's record, for a non-parent too


def test_a_reaped_process_has_no_zombie_record_to_read() -> None:
    """Once reaped its pid may be another process's: the zombie path declines, and the
    ioctl answers instead."""
    with exited_child("exit") as (pid, pidfd):
        os.waitpid(pid, 0)
        assert zombie_status(pid, pidfd) is None
        status = exit_status(pidfd)
        assert status is not None
        assert status_code(status) == 7


def test_a_running_process_has_no_zombie_record() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        time.sleep(5)
        os._exit(0)
    pidfd = os.pidfd_open(pid)
    try:
        assert zombie_status(pid, pidfd) is None
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(pidfd)


def test_the_reap_is_an_event_the_watch_wakes_for() -> None:
    """A zombie's pidfd is readable but has not hung up: the watch stays quiet until the reap,
    and then wakes at once, instead of the event loop's millisecond timer."""
    with exited_child("exit") as (pid, pidfd):
        watch = reap_watch(pidfd)
        try:
            assert watch.poll(0.05) == []
            started = time.monotonic()
            wait_reaped(pidfd, 0.05)
            assert time.monotonic() - started >= 0.04  # nothing to wake for yet
            os.waitpid(pid, 0)
            assert watch.poll(1.0) != []
            started = time.monotonic()
            wait_reaped(pidfd, 5.0)
            assert time.monotonic() - started < 0.5
        finally:
            watch.close()
