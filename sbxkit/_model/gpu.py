"""GPU requests through CDI (Container Device Interface) device requests — pure.

A sandbox asks for GPUs either by an explicit list of fully qualified CDI device names
(``nvidia.com/gpu=0``) or by a count. A count is satisfied from the devices the daemon
discovered (``/info`` ``DiscoveredDevices``, Engine API 1.48 / Docker 28, entries whose
``Source`` is ``cdi``), chosen round-robin so consecutive sandboxes spread over the GPUs.
The round-robin cursor is state, so it lives in a small ``GpuCursor`` the I/O shell owns;
``select_gpus`` itself takes the cursor and returns the next one.

Selectable devices for a count are the discovered CDI devices of class ``gpu``
(``<vendor>/gpu=<name>``). ``<vendor>/gpu=all`` names every GPU at once, so it is selectable
only when it is all the daemon offers (the WSL2 "all-only" case), and then it counts as one
device. When a vendor spec lists each GPU under both an index (``=0``) and another name (a
UUID), only the index names are selectable, so one GPU is never handed out twice in one request.

A daemon without CDI (no ``CDISpecDirs`` and no ``DiscoveredDevices`` — Docker 20.10, for one)
is refused before any container exists. This module is unit-tested only; it has not been
verified on a host with real GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from sbxkit._util.public import publish
from sbxkit.engine.models import DeviceRequest, InfoReply
from sbxkit.errors import SpecError

MAX_GPUS = 64

_CDI_NAME_RE = re.compile(
    r"(?P<vendor>[A-Za-z0-9][A-Za-z0-9.-]*)/(?P<cls>[A-Za-z0-9][A-Za-z0-9_.-]*)"
    r"=(?P<name>[A-Za-z0-9][A-Za-z0-9_.:-]*)"
)
"""A fully qualified CDI device name, ``vendor/class=name`` (CDI spec's qualified name)."""


class GpuRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """GPUs for one sandbox: explicit CDI ``devices``, or a ``count`` chosen by sbxkit.

    Both may be given only if they agree (``count == len(devices)``).
    """

    count: int | None = None
    devices: list[str] | None = None


class GpuCursor:
    """Round-robin position over the selectable devices; owned by the I/O shell (one per
    process by default), never by the pure functions."""

    def __init__(self, position: int = 0) -> None:
        self.position = position


def validate_gpu_request(request: object, field: str = "gpus") -> None:
    """Refuse empty, duplicate, malformed or inconsistent requests (no daemon needed)."""
    if not isinstance(request, GpuRequest):
        raise SpecError(field, "must be a GpuRequest (count and/or devices)")
    count, devices = request.count, request.devices
    if count is None and devices is None:
        raise SpecError(field, "give a count or a list of CDI devices")
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, int):
            raise SpecError(f"{field}.count", "must be an integer")
        if count <= 0:
            raise SpecError(f"{field}.count", "must be > 0 (omit gpus for none)")
        if count > MAX_GPUS:
            raise SpecError(f"{field}.count", f"must be <= {MAX_GPUS}")
    if devices is None:
        return
    if not isinstance(devices, list):
        raise SpecError(f"{field}.devices", "must be a list of CDI device names")
    if not devices:
        raise SpecError(f"{field}.devices", "must not be empty (omit gpus for none)")
    if len(devices) > MAX_GPUS:
        raise SpecError(f"{field}.devices", f"at most {MAX_GPUS} devices")
    seen: dict[str, int] = {}
    for index, device in enumerate(devices):
        where = f"{field}.devices[{index}]"
        if not isinstance(device, str) or _CDI_NAME_RE.fullmatch(device) is None:
            raise SpecError(where, "must be a fully qualified CDI device name, vendor/class=name")
        if device in seen:
            raise SpecError(where, f"duplicate device {device!r} (also devices[{seen[device]}])")
        seen[device] = index
    if count is not None and count != len(devices):
        raise SpecError(
            f"{field}.count",
            f"count {count} does not match the {len(devices)} devices listed",
        )


def discovered_cdi_devices(info: InfoReply) -> list[str] | None:
    """CDI device ids the daemon discovered, or None if it does not report discovery."""
    if info.discovered_devices is None:
        return None
    return [d.id for d in info.discovered_devices if d.source == "cdi" and d.id]


def cdi_supported(info: InfoReply) -> bool:
    """The daemon resolves CDI device requests (it reports spec dirs or discovered devices)."""
    return bool(info.cdi_spec_dirs) or info.discovered_devices is not None


def selectable_gpus(discovered: Sequence[str]) -> list[str]:
    """The devices a count may be served from, in a stable order (see the module doc)."""
    gpus: list[tuple[str, str]] = []
    for device in dict.fromkeys(discovered):
        match = _CDI_NAME_RE.fullmatch(device)
        if match is not None and match["cls"] == "gpu":
            gpus.append((device, match["name"]))
    specific = [(d, n) for d, n in gpus if n != "all"]
    if not specific:
        return sorted(d for d, _ in gpus)  # all-only: each "all" counts as one device
    indexed = [(d, n) for d, n in specific if n.isdigit()]
    chosen = indexed or specific
    return [d for d, _ in sorted(chosen, key=lambda dn: (dn[0].split("=")[0], _order(dn[1])))]


def _order(name: str) -> tuple[int, int | str]:
    """Numeric names in numeric order (gpu=2 before gpu=10), then the rest by text."""
    return (0, int(name)) if name.isdigit() else (1, name)


def select_gpus(available: Sequence[str], count: int, cursor: int) -> tuple[list[str], int]:
    """``count`` devices round-robin from ``cursor``; returns (ids, next cursor).

    The caller guarantees ``0 < count <= len(available)``, so no device repeats.
    """
    total = len(available)
    if not 0 < count <= total:
        raise ValueError(f"count {count} outside 1..{total}")
    start = cursor % total
    ids = [available[(start + offset) % total] for offset in range(count)]
    return ids, (start + count) % total


def resolve_gpus(request: GpuRequest, info: InfoReply, cursor: int) -> tuple[list[str], int]:
    """The CDI device ids to request for ``request`` on this daemon, and the next cursor."""
    validate_gpu_request(request)
    if not cdi_supported(info):
        version = info.server_version or "this daemon"
        raise SpecError(
            "gpus",
            f"the Docker daemon ({version}) has no CDI support (no CDISpecDirs and no "
            "DiscoveredDevices in /info); enable CDI on the daemon (Docker 25+) to request GPUs",
        )
    discovered = discovered_cdi_devices(info)
    if request.devices is not None:
        if discovered is not None:
            for index, device in enumerate(request.devices):
                if device not in discovered:
                    raise SpecError(
                        f"gpus.devices[{index}]",
                        f"{device!r} is not among the daemon's CDI devices: "
                        + (", ".join(discovered) or "(none)"),
                    )
        return list(request.devices), cursor
    assert request.count is not None
    if discovered is None:
        raise SpecError(
            "gpus.count",
            "this daemon does not report DiscoveredDevices (Engine API 1.48, Docker 28), so "
            "GPUs cannot be chosen by count; list CDI device names in gpus.devices",
        )
    available = selectable_gpus(discovered)
    if request.count > len(available):
        raise SpecError(
            "gpus.count",
            f"asks for {request.count} GPU(s); the daemon offers {len(available)} selectable "
            "CDI GPU(s): " + (", ".join(available) or "(none)"),
        )
    return select_gpus(available, request.count, cursor)


def device_request(ids: Sequence[str]) -> DeviceRequest:
    """The HostConfig.DeviceRequests entry for CDI devices (the ``cdi`` driver, ids only)."""
    return DeviceRequest(driver="cdi", device_ids=list(ids))


publish(__name__, globals())  # public names show as sbxkit.NAME
