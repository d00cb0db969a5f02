"""Each sandbox runs as a uid of its own: the ranges, and a lease's uid in them (pure).

A spec that names no ``user`` gets a uid:gid (the same number twice) that no host account and
no other live sandbox uses. Shared ids made one sandbox's ``/proc/PID/environ`` and memory
readable by any host process of that uid, and put every sandbox under one set of per-uid kernel
limits (inotify instances, ``RLIMIT_NPROC``): one payload could use them up for all.

The uid is a function of the lease id (128 random bits, hashed), so a lease's plan, its pooled twin
and a restarted supervisor all name the same uid with nothing to look up; the owner reserves it
host-wide before anything is created (``sbxkit._lifecycle.uid_holds``) and a lease whose uid is
taken is planned again under a new lease id. Two ranges, by what the daemon's uids are:

- ``HOST_UIDS``: the container's uids are the host's (rootful Docker or Podman): 65,536 ids
  from ``0x70000000`` (1879048192), a block no distribution, systemd or ``useradd`` hands out.
- ``MAPPED_UIDS``: the daemon maps container uids to subordinate host ids (``userns-remap``, a
  rootless engine), which cover 0–65535 by default: 4,094 ids at the top of that block
  (61440–65533), below ``nobody``.

A spec may still name a user, outside both ranges: such a uid is shared by whatever names it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

import msgspec

from sbxkit.engine.models import ContainerCreate

__all__ = [
    "HOST_UIDS",
    "MAPPED_UIDS",
    "RESERVED_RANGES",
    "UidRange",
    "body_with_uid",
    "own_range",
    "ranges_shown",
    "reserved_range_of",
    "uid_for_lease",
]


class UidRange(msgspec.Struct, frozen=True):
    """``count`` ids from ``first``."""

    first: int
    count: int
    name: str

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def shown(self) -> str:
        return f"{self.first}-{self.last}"


HOST_UIDS = UidRange(0x7000_0000, 0x1_0000, "host")
MAPPED_UIDS = UidRange(0xF000, 0xFFFE - 0xF000, "mapped")
RESERVED_RANGES = (HOST_UIDS, MAPPED_UIDS)


def uid_for_lease(lease: str, uids: UidRange) -> int:
    """The uid (and gid) of ``lease``'s sandbox in ``uids``: 64 bits of the lease id's
    sha256, reduced (any lease name maps; a random one maps uniformly)."""
    digest = hashlib.sha256(lease.encode("utf-8", "surrogateescape")).digest()
    return uids.first + int.from_bytes(digest[:8], "big") % uids.count


def reserved_range_of(uid: int) -> UidRange | None:
    """The sandbox range ``uid`` lies in, if any."""
    return next((uids for uids in RESERVED_RANGES if uid in uids), None)


def own_range(user: str | None, lease: str) -> UidRange | None:
    """The range in which ``user`` is ``lease``'s own uid:gid, or None: a body whose user is
    ``uid_for_lease(lease, R)`` twice over runs as a uid of its own, to be reserved."""
    if user is None:
        return None
    uid, _, gid = user.partition(":")
    if not (uid.isdigit() and uid == gid):
        return None
    for uids in RESERVED_RANGES:
        if uid_for_lease(lease, uids) == int(uid):
            return uids
    return None


_OWNER_OPTION = re.compile(r"(?<![^,])(uid|gid)=[0-9]+(?![^,])")


def _owned_options(options: str, old: int, new: int) -> str:
    """A tmpfs option string whose ``uid=``/``gid=`` were ``old``, now ``new``."""
    return _OWNER_OPTION.sub(
        lambda m: f"{m.group(1)}={new}" if m.group(0).endswith(f"={old}") else m.group(0), options
    )


def body_with_uid(body: ContainerCreate, old: int, new: int) -> ContainerCreate:
    """``body`` with its own uid ``old`` replaced by ``new``: ``User`` and the ``uid=``/``gid=``
    options of every tmpfs (a pooled container planned under one lease, parked under another)."""
    host = body.host_config
    if host is not None and host.tmpfs:
        tmpfs = {path: _owned_options(opts, old, new) for path, opts in host.tmpfs.items()}
        host = msgspec.structs.replace(host, tmpfs=tmpfs)
    return msgspec.structs.replace(body, user=f"{new}:{new}", host_config=host)


def ranges_shown(ranges: Iterable[UidRange] = RESERVED_RANGES) -> str:
    return " and ".join(uids.shown() for uids in ranges)


def remapping(security_options: Iterable[str]) -> str | None:
    """How a Docker daemon's ``/info`` ``SecurityOptions`` say it maps container uids to
    subordinate host ids — ``userns`` (``userns-remap``) or ``rootless`` — or None: its
    containers' uids are the host's (pure)."""
    options = list(security_options)
    for kind in ("userns", "rootless"):
        if any(f"name={kind}" in option for option in options):
            return kind
    return None
