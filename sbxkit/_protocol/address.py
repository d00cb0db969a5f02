"""Where a caller finds its supervisor: the state directory and the socket in it (standard
library only: ``sbxkit run``'s hand-off reads this before anything else is loaded)."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["SOCKET_NAME", "state_dir_text"]

SOCKET_NAME = "supervisor.sock"


def state_dir_text(environ: Mapping[str, str] = os.environ) -> str:
    """``SBXKIT_STATE_DIR`` (trimmed), else ``~/.sbxkit/leases``: the default state directory."""
    configured = environ.get("SBXKIT_STATE_DIR", "").strip()
    if configured:
        return configured
    return os.path.join(os.path.expanduser("~"), ".sbxkit", "leases")
