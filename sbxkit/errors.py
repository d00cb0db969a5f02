"""One error root for everything sbxkit raises.

Every public function raises an `SbxError` subclass, never a bare trio, OS or h11 exception.
Each subclass carries the context a user needs to act: the field and rule for refused input,
the HTTP method, path, status and daemon message for engine errors, the container and lease
for cleanup failures.
"""

from __future__ import annotations

import re


class SbxError(Exception):
    """Root of every error sbxkit raises."""


class SpecError(SbxError):
    """Refused input: a field of the spec breaks a rule. Raised before any container exists."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class NeverFits(SpecError):
    """The sandbox is larger than the host's whole budget (memory above the memory budget,
    CPUs above the daemon's count or an operator's CPU budget): it could never start, so it is
    refused at once, before anything is queued or created. CLI exit status 2."""

    def __init__(self, field: str, rule: str, *, lease: str | None = None) -> None:
        super().__init__(field, rule)
        self.lease = lease


class EngineUnavailable(SbxError):
    """No usable Docker engine at the socket (absent, not answering, or too old)."""

    def __init__(self, socket_path: str, reason: str) -> None:
        super().__init__(f"Docker engine at {socket_path} is unavailable: {reason}")
        self.socket_path = socket_path
        self.reason = reason


class EngineConnectionError(SbxError):
    """The connection to the daemon broke in the middle of a call (daemon gone or reset)."""

    def __init__(self, method: str, path: str, reason: str) -> None:
        super().__init__(f"{method} {path}: connection to the Docker engine lost: {reason}")
        self.method = method
        self.path = path
        self.reason = reason


class EngineProtocolError(SbxError):
    """The daemon's bytes broke HTTP/1.1 or the stream framing: the connection is unusable."""


class EngineTimeout(SbxError):
    """An Engine API call did not finish before its deadline."""

    def __init__(self, method: str, path: str, seconds: float) -> None:
        super().__init__(f"{method} {path}: no answer within {seconds:g} s")
        self.method = method
        self.path = path
        self.seconds = seconds


class EngineError(SbxError):
    """The daemon answered an Engine API call with an error status."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        message = scrub_daemon_paths(message)  # the daemon's data-root is not the user's business
        super().__init__(f"{method} {path} -> {status}: {message}")
        self.method = method
        self.path = path
        self.status = status
        self.message = message


class NotFound(EngineError):
    """404 from the daemon."""


class Conflict(EngineError):
    """409 from the daemon."""


class ImageError(SbxError):
    """The image cannot be used: missing locally (sbxkit never pulls) or refused by policy."""

    def __init__(self, image: str, reason: str) -> None:
        super().__init__(f"image {image!r}: {reason}")
        self.image = image
        self.reason = reason


class ContainerMismatch(SbxError):
    """The created container is not what was asked for; it was removed without starting."""

    def __init__(self, container_id: str, what: str) -> None:
        super().__init__(f"container {container_id[:12]}: {what}")
        self.container_id = container_id
        self.what = what


class ImageChanged(ContainerMismatch):
    """The container was created from another image than the one its run was planned on (the
    name was moved to another image since it was inspected); removed without starting."""


class CleanupError(SbxError):
    """Removing a sandbox's container failed. The lease is kept so removal can be retried."""

    def __init__(self, lease: str, container_id: str | None, reason: str) -> None:
        target = container_id[:12] if container_id else "(id unknown)"
        super().__init__(f"lease {lease}: removing container {target} failed: {reason}")
        self.lease = lease
        self.container_id = container_id
        self.reason = reason


class UidTaken(SbxError):
    """The uid a lease's sandbox would run as (``sbxkit._model.uids``) is a host account's, in a
    subordinate range, or held by another owner: nothing was created. A run is planned again
    under a new lease, and so a new uid, a few times (``UID_ATTEMPTS``) before this is raised."""

    def __init__(self, lease: str, reason: str) -> None:
        super().__init__(f"lease {lease}: no uid of its own: {reason}")
        self.lease = lease
        self.reason = reason


UID_ATTEMPTS = 8
"""How many leases (each with its own uid) a sandbox is planned under before ``UidTaken``."""


# -- the daemon's messages, as sbxkit repeats them ---------------------------------------------
#
# What sbxkit repeats of the daemon's error messages, and which of them mean "your input".
#
# The daemon's messages name its own storage: a 5000-character workdir came back as ``lstat
# /var/lib/docker/overlay2/<64 hex>/merged/aaaa...: file name too long``, telling a sandbox user
# the host's data-root. ``scrub_daemon_paths`` rewrites such paths before any sbxkit error
# carries them: a container's root filesystem path becomes the path inside the container, and
# any other absolute path through a 64-hex id directory becomes ``<daemon>/<id-dir>/...``, and
# a named volume's data directory (``<data-root>/volumes/NAME/_data``, which Docker 26 names when
# a volume ``subpath`` is missing) becomes ``volume NAME``.
#
# ``is_refusal_status`` and ``create_refusal_in`` say which engine failures are refused input (CLI
# exit 2, not 70; ``sbxkit/_grammar/daemon_refusal.py``): a 4xx answer to the container create,
# other than 409 (the create's name is sbxkit's own), whether the create ran in-process or in the
# supervisor (its ``create failed`` reason carries the daemon's status line). Pure.


_ID = r"[0-9a-f]{64}"
_ROOTFS = re.compile(
    rf"/[^\s:'\"]*?/(?:overlay2?|fuse-overlayfs|vfs/dir|aufs/mnt|btrfs/subvolumes|zfs/graph"
    rf"|devicemapper/mnt)/{_ID}(?:-init)?(?:/merged|/diff|/rootfs)?(?=/|[\s:'\"]|$)"
)
"""A container's root filesystem as the storage driver mounts it under the data-root."""
_ID_DIR = re.compile(rf"/[^\s:'\"]*?/({_ID})(?:-init)?(?=/|[\s:'\"]|$)")
"""Any other absolute path reaching into a 64-hex id directory (containers/, image/ ...)."""

_VOLUME_DATA = re.compile(
    r"/[^\s:'\"]*?/volumes/([a-zA-Z0-9][a-zA-Z0-9_.-]+)/_data(?=/|[\s:'\"]|$)"
)
"""A named volume's data directory under the data-root."""

_CREATE_LINE = re.compile(r"\bPOST \S*/containers/create\S* -> (?P<status>\d{3}):")


def scrub_daemon_paths(message: str) -> str:
    """``message`` without the daemon's host paths (see the section above)."""
    inside = _ROOTFS.sub(lambda m: "" if m.string[m.end() : m.end() + 1] == "/" else "/", message)
    volumes = _VOLUME_DATA.sub(lambda m: f"volume {m[1]}", inside)
    return _ID_DIR.sub(lambda m: f"<daemon>/{m[1][:12]}", volumes)


def is_refusal_status(status: int) -> bool:
    """A 4xx other than 409 (the create's name is sbxkit's own, not the user's input)."""
    return 400 <= status < 500 and status != 409


def create_refusal_in(reason: str) -> bool:
    """Whether a supervisor's ``create failed: ...`` reason carries a refusal status."""
    match = _CREATE_LINE.search(reason)
    return (
        reason.startswith("create failed:")
        and match is not None
        and is_refusal_status(int(match["status"]))
    )
