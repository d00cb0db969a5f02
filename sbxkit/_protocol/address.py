"""Where a caller finds its supervisor: the state directory and the socket in it (standard
library only: ``sbxkit run``'s hand-off reads this before anything else is loaded)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

__all__ = ["SOCKET_NAME", "STANDARD_SOCKETS", "docker_host_socket", "state_dir_text"]

SOCKET_NAME = "supervisor.sock"


STANDARD_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
"""The daemon a state directory serves when none is named: ``~/.sbxkit/leases``, the layout
sbxkit always had."""


def state_dir_text(environ: Mapping[str, str] = os.environ, socket: str | None = None) -> str:
    """``SBXKIT_STATE_DIR`` (trimmed), else one state directory per daemon: ``~/.sbxkit/leases``
    for the standard socket or none named, ``~/.sbxkit/leases-HASH`` for another one named by
    ``socket`` (``--socket``) or ``DOCKER_HOST`` — its supervisor serves that daemon, so
    switching ``DOCKER_HOST`` as docker users do never meets another daemon's supervisor."""
    configured = environ.get("SBXKIT_STATE_DIR", "").strip()
    if configured:
        return configured
    base = os.path.join(os.path.expanduser("~"), ".sbxkit")
    named = socket if socket is not None else docker_host_socket(environ)
    if named is None or os.path.normpath(named) in STANDARD_SOCKETS:
        return os.path.join(base, "leases")
    digest = hashlib.sha256(os.fsencode(os.path.normpath(named))).hexdigest()[:12]
    return os.path.join(base, f"leases-{digest}")


def docker_host_socket(environ: Mapping[str, str]) -> str | None:
    """The socket path a ``unix://`` ``DOCKER_HOST`` names, else None (discovery refuses other
    schemes by name, later)."""
    value = environ.get("DOCKER_HOST", "").strip()
    if value.startswith("unix://") and value[len("unix://") :].startswith("/"):
        return value[len("unix://") :]
    return None
