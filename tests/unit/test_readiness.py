"""Descriptors from 1024 on, which a process running many sandboxes holds: every "is it readable
now" check answers for them as for low ones. ``select`` refuses them (``FD_SETSIZE``); each
check here raised ``ValueError`` (or, for a pooled daemon connection, took it for closed)
before they asked ``poll``."""

from __future__ import annotations

import os
import resource
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
import trio

from sbxkit._kernel.pidfd import still_running
from sbxkit._protocol.channel import FrameChannel
from sbxkit._util.readiness import readable, readable_now
from sbxkit.engine.transport import _Connection

HIGH = 1500


@pytest.fixture(autouse=True)
def room_for_high_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > HIGH + 10, f"the hard limit is {hard}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 10), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def moved_high(fd: int, offset: int = 0) -> int:
    """``fd`` moved to a descriptor number from ``HIGH`` on (the low one is closed)."""
    high = os.dup2(fd, HIGH + offset)
    os.close(fd)
    return high


def test_a_pipe_end_is_judged_at_any_number() -> None:
    read_end, write_end = os.pipe()
    read_end = moved_high(read_end)
    try:
        assert not readable_now(read_end)  # nothing written: a read would block
        os.write(write_end, b"R")
        assert readable_now(read_end)
        assert os.read(read_end, 1) == b"R"
        os.close(write_end)
        assert readable_now(read_end)  # the writer is gone: end of file is there to read
    finally:
        os.close(read_end)
        with suppress(OSError):
            os.close(write_end)


@contextmanager
def child_pidfd() -> Iterator[tuple[int, int]]:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child waits to be killed
        signal.pause()
        os._exit(0)
    pidfd = moved_high(os.pidfd_open(pid))
    try:
        yield pid, pidfd
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)
        os.close(pidfd)


def test_a_high_pidfd_says_whether_its_process_runs() -> None:
    with child_pidfd() as (pid, pidfd):
        assert still_running(pidfd)
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)  # it has exited, not reaped
        assert not still_running(pidfd)


def high_socket_pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    high = socket.socket(fileno=moved_high(ours.detach(), 1))
    return high, theirs


def test_a_supervisor_connection_sees_input_at_a_high_number() -> None:
    ours, theirs = high_socket_pair()
    channel = FrameChannel(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))
    try:
        assert not channel.has_input()
        theirs.sendall(b"\0")
        assert channel.has_input()
    finally:
        ours.close()
        theirs.close()


def test_a_pooled_daemon_connection_at_a_high_number_is_reused_until_the_daemon_closes_it() -> None:
    ours, theirs = high_socket_pair()
    connection = _Connection(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))
    try:
        assert not connection.looks_closed()  # idle and open: fit for reuse
        theirs.close()
        assert connection.looks_closed()
    finally:
        ours.close()


def test_the_command_lines_wait_for_its_supervisor_sees_a_high_socket() -> None:
    """``sbxkit run``'s hand-off (standard library only) waits on its supervisor's socket and
    its signal pipe; a parent may leave it descriptors from 1024 on."""
    ours, theirs = high_socket_pair()
    try:
        assert readable([ours.fileno()], 0.0) == set()
        theirs.sendall(b"\0")
        assert readable([ours.fileno()], 0.0) == {ours.fileno()}
        assert readable([ours.fileno()], None) == {ours.fileno()}  # waits only while unready
    finally:
        ours.close()
        theirs.close()
