"""Which hosts get the kernel's evidence, and which the daemon's: decided once (pure).

The kernel path needs the daemon's containers to live in this process's kernel and PID
namespace, with uids as the host sees them: the FIFOs are made on this host and chowned to the
sandbox user, and the container's init is opened as a pidfd from the daemon's ``State.Pid``.
Every condition below that fails names itself; the run then takes the daemon's path, and its
result says so (``RunResult.evidence``). A container's own init is verified again per run
(``init.py``: its cgroup names the container), so a condition this cannot see from ``/info``
— another PID namespace — still falls back rather than trusting the wrong process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from sbxkit._kernel.scripts import shell_carries
from sbxkit._model.result import Evidence
from sbxkit._model.uids import remapping

__all__ = ["Evidence", "HostFacts", "daemon_path_reason", "run_path_reason"]

KERNEL_RUNTIMES = (None, "runc", "crun")
"""Runtimes whose container init is a host process in the daemon's PID namespace (gVisor's
is its own sandbox kernel's)."""


class HostFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What this process found out about itself, once."""

    exit_info: bool
    """``PIDFD_GET_INFO`` answers exit information (Linux ≥ 6.15)."""
    can_chown: bool
    """It may give the FIFOs to the sandbox user (root or ``CAP_CHOWN``)."""
    kernel_release: str
    """``uname -r`` here: a daemon reporting another kernel is remote or in a VM."""


def daemon_path_reason(
    host: HostFacts,
    *,
    podman: bool,
    daemon_kernel: str,
    operating_system: str,
    security_options: Sequence[str],
) -> str | None:
    """Why no run on this host and daemon can take the kernel path, or None if runs can."""
    if not host.exit_info:
        return "the kernel has no pidfd exit information (PIDFD_GET_INFO, Linux >= 6.15)"
    if podman:
        return "Podman's service (its containers' stdio and init are its own)"
    if daemon_kernel and daemon_kernel != host.kernel_release:
        return (
            f"the daemon runs another kernel ({daemon_kernel}; here {host.kernel_release}): "
            "a remote or VM-backed daemon"
        )
    if "Desktop" in operating_system:
        return f"a VM-backed daemon ({operating_system})"
    kind = remapping(security_options)
    if kind is not None:
        return f"the daemon runs with {kind} (the sandbox's uids are not the host's)"
    if not host.can_chown:
        return "this process cannot give the FIFOs to the sandbox user (not root, no CAP_CHOWN)"
    return None


def run_path_reason(
    *,
    runtime: str | None,
    command: Sequence[str],
    has_shell: bool | None,
    env_keys: Iterable[str] = (),
) -> str | None:
    """Why this one run takes the daemon's path on a host that has the kernel's, or None.
    ``env_keys``: the container's environment (the image's and the spec's)."""
    odd = sorted(key for key in env_keys if not shell_carries(key))
    if odd:
        return f"env keys a shell would drop on exec ({', '.join(map(repr, odd[:3]))})"
    if runtime not in KERNEL_RUNTIMES:
        return f"runtime {runtime} (its init is not a host process in the daemon's namespace)"
    if not command or command[0].startswith("-"):
        return "a command the shell's exec would take for an option"
    if has_shell is False:
        return "the image has no /bin/sh to put the payload's stdio on the FIFOs"
    return None
