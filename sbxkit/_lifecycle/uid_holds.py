"""Holding a sandbox's own uid host-wide for as long as its container may exist.

The owner of a lease (the supervisor, or an in-process owner) holds its uid before the create
and lets it go once the container is confirmed gone. A hold is a Unix socket bound to the
abstract name ``sbxkit-uid-UID``: the kernel lets one socket at a time have a name, and frees
it when the holder closes it or dies, so two owners — two supervisors of different accounts
included — never hand out one uid together, and a dead one leaves nothing to clean up.
Abstract names are per network namespace: every supervisor of a host must run in the same one
(the host's). Another local account can bind such names too; it can keep a uid from sbxkit
(then the lease is planned again under another one), never share one with a sandbox.

Where the container's uids are the host's (``HOST_UIDS``), a uid is also refused while a host
account or group has it, or a subordinate range (``/etc/subuid``, ``/etc/subgid``: other
users' rootless containers) covers it.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import socket

from sbxkit._model.uids import HOST_UIDS, UidRange, own_range, uid_for_lease
from sbxkit.engine.models import ContainerCreate

__all__ = [
    "SUBORDINATE_FILES",
    "UidHold",
    "abstract_name",
    "hold_own_uid",
    "hold_uid",
    "host_id_problem",
]

SUBORDINATE_FILES = ("/etc/subuid", "/etc/subgid")


def abstract_name(uid: int) -> bytes:
    return b"\0sbxkit-uid-%d" % uid


class UidHold:
    """A held uid; ``release`` lets it go (idempotent)."""

    def __init__(self, uid: int, sock: socket.socket) -> None:
        self.uid = uid
        self._sock: socket.socket | None = sock

    def release(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    @property
    def held(self) -> bool:
        return self._sock is not None


def _subordinate_owner(uid: int, path: str) -> str | None:
    """The name whose subordinate range in ``path`` covers ``uid``, if any."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            lines = file.read(1 << 20).splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        start, _, count = rest.partition(":")
        if start.isdigit() and count.isdigit() and int(start) <= uid < int(start) + int(count):
            return name
    return None


def host_id_problem(uid: int) -> str | None:
    """Why ``uid`` (as uid and gid) is the host's already, or None."""
    try:
        return f"uid {uid} is the host account {pwd.getpwuid(uid).pw_name!r}"
    except KeyError:
        pass
    try:
        return f"gid {uid} is the host group {grp.getgrgid(uid).gr_name!r}"
    except KeyError:
        pass
    for path in SUBORDINATE_FILES:
        owner = _subordinate_owner(uid, path)
        if owner is not None:
            return f"uid {uid} is in {owner!r}'s subordinate ids ({path})"
    return None


def hold_uid(uid: int, uids: UidRange) -> UidHold | str:
    """A hold on ``uid`` of ``uids``, or why it cannot be had now."""
    if uids == HOST_UIDS:
        problem = host_id_problem(uid)
        if problem is not None:
            return problem
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(abstract_name(uid))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return f"uid {uid} is held by another process (another sandbox's owner)"
        return f"uid {uid} cannot be held: {os.strerror(exc.errno or 0)}"
    return UidHold(uid, sock)


def hold_own_uid(lease: str, body: ContainerCreate) -> UidHold | str | None:
    """The hold on the uid ``body`` runs as when it is ``lease``'s own (``own_range``); None
    when the body names a user of the spec's, which is not held."""
    uids = own_range(body.user, lease)
    if uids is None:
        return None
    return hold_uid(uid_for_lease(lease, uids), uids)
