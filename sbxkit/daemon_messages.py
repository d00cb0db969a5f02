"""What sbxkit repeats of the daemon's error messages, and which of them mean "your input".

The daemon's messages name its own storage: a 5000-character workdir came back as ``lstat
/var/lib/docker/overlay2/<64 hex>/merged/aaaa...: file name too long``, telling a sandbox user
the host's data-root. ``scrub_daemon_paths`` rewrites such paths before any sbxkit error
carries them: a container's root filesystem path becomes the path inside the container, and
any other absolute path through a 64-hex id directory becomes ``<daemon>/<id-dir>/...``, and
a named volume's data directory (``<data-root>/volumes/NAME/_data``, which Docker 26 names when
a volume ``subpath`` is missing) becomes ``volume NAME``.

``is_refusal_status`` and ``create_refusal_in`` say which engine failures are refused input
(CLI exit 2, not 70; ``sbxkit/cli/daemon_refusal.py``): a 4xx answer to the container create,
other than 409 (the create's name is sbxkit's own), whether the create ran in-process or in
the supervisor (its ``create failed`` reason carries the daemon's status line). Pure: no
sbxkit imports, as ``sbxkit.errors`` imports this.
"""

from __future__ import annotations

import re

__all__ = ["create_refusal_in", "is_refusal_status", "scrub_daemon_paths"]

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
    """``message`` without the daemon's host paths (see the module doc)."""
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
