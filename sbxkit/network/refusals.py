"""Where a governed network cannot work, said by name before any container exists.

Pure: what the daemon's ``/info`` says, what this host is, in; a ``SpecError`` (field
``network``) or None out. sbxkit enters the sandbox's namespaces from this host, so the daemon
must run its containers on this host's kernel, as real processes of this host, with this
process allowed to enter them:

- a remote daemon or one in a VM (Docker Desktop, Colima, Lima, Rancher Desktop, OrbStack, or
  any whose kernel is not this host's) runs containers where this host cannot enter;
- a rootless daemon's containers live in a user namespace this host's sbxkit does not own;
- Podman's compatible API is not verified for it (its containers are real processes too, but
  nothing here proves the listeners hold there): refused until it is;
- without CAP_SYS_ADMIN this process cannot call ``setns``.

``desktop_kind`` also decides the managed network's host aliases: Docker's ``host-gateway``
on those desktop daemons, the bridge's gateway address on native Linux (the reference's rule).
"""

from __future__ import annotations

from collections.abc import Sequence

from sbxkit.errors import SpecError

__all__ = ["desktop_kind", "governed_refusal"]

_DESKTOPS = (
    ("docker desktop", "Docker Desktop"),
    ("rancher desktop", "Rancher Desktop"),
    ("orbstack", "OrbStack"),
    ("boot2docker", "boot2docker"),
)
_VM_NAMES = (("colima", "Colima"), ("lima-", "Lima"), ("rancher-desktop", "Rancher Desktop"))


def desktop_kind(operating_system: str, name: str) -> str | None:
    """The desktop VM product a daemon's ``/info`` names, or None for a native daemon."""
    system, host = operating_system.lower(), name.lower()
    for marker, product in _DESKTOPS:
        if marker in system:
            return product
    for marker, product in _VM_NAMES:
        if host == marker.rstrip("-") or host.startswith(marker):
            return product
    return None


def governed_refusal(
    *,
    operating_system: str,
    name: str,
    kernel_version: str,
    security_options: Sequence[str],
    local_kernel: str,
    podman: bool,
    can_enter: bool,
    what: str = "a governed network",
) -> SpecError | None:
    """Why sbxkit cannot govern this daemon's sandboxes from this host, or None."""
    desktop = desktop_kind(operating_system, name)
    if desktop is not None:
        return SpecError(
            "network",
            f"{what} is refused on {desktop}: its containers run in a VM, where this host cannot "
            "enter their network namespace",
        )
    if kernel_version and kernel_version != local_kernel:
        return SpecError(
            "network",
            f"{what} is refused: the daemon runs kernel {kernel_version}, this host "
            f"{local_kernel} (a remote or VM-backed daemon; sbxkit enters each sandbox from "
            "this host)",
        )
    if any("rootless" in option for option in security_options):
        return SpecError(
            "network",
            f"{what} is refused on a rootless daemon: its sandboxes live in a user namespace "
            "this host's sbxkit does not own",
        )
    if podman:
        return SpecError(
            "network",
            f"{what} is refused on Podman: it is not verified there (use Docker for it)",
        )
    if not can_enter:
        return SpecError(
            "network",
            f"{what} needs CAP_SYS_ADMIN on this host to enter the sandbox's network namespace "
            "(run sbxkit and its supervisor as root)",
        )
    return None
