"""The OCI runtimes the conformance subset runs under, and what a test may expect of each.

A test joins the conformance subset by taking the ``runtime`` fixture: it then runs once per
runtime in ``SBXKIT_TEST_RUNTIMES`` (default ``runc,crun,runsc``) and is marked ``conformance``
(``pytest -m conformance`` runs the subset alone, e.g. against another engine). Each named cell
asks for its runtime by name: a spec that names none runs under crun where the daemon's default is
runc and it registers crun (``sbxkit._model.runtimes.plan_runtime``), so only ``runtime="runc"``
runs runc there. The ``default`` cell passes no runtime at all, as a default run does.

Every expectation that differs by runtime lives here, so the list of differences is one table
(docs/security.md explains each, naming the test that shows it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from sbxkit._model.runtimes import GVISOR_MIN_PIDS, GVISOR_RUNTIME

if TYPE_CHECKING:
    from tests.witness import Witness

DEFAULT_RUNTIMES = "runc,crun,runsc"
DAEMON_DEFAULT = ("default",)
"""Cell names that mean "ask for no runtime": the daemon's own default."""


def runtime_cells() -> list[str]:
    names = [n.strip() for n in os.environ.get("SBXKIT_TEST_RUNTIMES", DEFAULT_RUNTIMES).split(",")]
    return [n for n in names if n]


def spec_runtime(cell: str) -> str | None:
    """What a spec asks for in this cell: None for the daemon default."""
    return None if cell in DAEMON_DEFAULT else cell


def planned_default_runtime(witness: Witness) -> str:
    """The runtime a spec that names none runs under on the witness's daemon, from its own
    ``/info``: crun where a Docker daemon's default is runc, it registers crun and it does not
    remap container uids (userns-remap, rootless); Podman runs its service's default (its
    compat API ignores the runtime); else the daemon's default."""
    info = witness.get("/info")
    default = str(info.get("DefaultRuntime") or "runc")
    security = " ".join(info.get("SecurityOptions") or [])
    remapped = "name=userns" in security or "name=rootless" in security
    crun = "crun" in (info.get("Runtimes") or {})
    if not witness.is_podman() and default == "runc" and crun and not remapped:
        return "crun"
    return default


def is_gvisor(runtime: str | None) -> bool:
    return runtime in (GVISOR_RUNTIME, "gvisor")


def read_only_error(runtime: str | None) -> str:
    """strerror of a write to the read-only root: gVisor answers EACCES, Linux EROFS."""
    return "Permission denied" if is_gvisor(runtime) else "Read-only file system"


def min_pids(runtime: str | None) -> int:
    """The smallest pids ceiling sbxkit accepts under this runtime."""
    return GVISOR_MIN_PIDS if is_gvisor(runtime) else 1


def pty_device_name(runtime: str | None) -> bytes:
    """What ``tty`` prints in a PTY sandbox: gVisor hands the payload the host's terminal as a
    host fd (``/proc/self/fd/0 -> host:[1]``), with no /dev/pts entry, so ``ttyname`` fails
    while every terminal ioctl (size, resize, raw mode) works."""
    return b"not a tty" if is_gvisor(runtime) else b"/dev/pts/"
