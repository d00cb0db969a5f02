"""Inbound ports: a host address that forwards into the sandbox's own loopback (pure).

A network table's ``ports`` lists what the host may reach inside the sandbox, in docker's
spelling (``-p``): ``8000`` (the host's 127.0.0.1, a free port), ``"18000:8000"`` (that host
port), ``"127.0.0.1:18000:8000"`` or ``"[::1]::8000"`` (that address; an empty host port is a
free one), an optional ``/tcp``. The lease's owner listens there and passes each connection,
from a peer it identified as the owner's own account, to ``127.0.0.1:PORT`` inside the sandbox
through its network namespace: no route, no bridge (docs/network.md, "Inbound ports").
An address other than loopback needs ``ports_beyond_loopback`` (which production refuses).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import msgspec

from sbxkit._util.public import publish
from sbxkit.errors import SpecError

__all__ = ["MAX_PORTS", "PortForward", "check_ports", "parse_port_text", "port_text"]

MAX_PORTS = 32
LOOPBACK_HOST = "127.0.0.1"


class PortForward(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One inbound port: the host's ``address:host_port`` forwards to the sandbox's
    ``127.0.0.1:sandbox_port``. Asked for, ``host_port`` 0 means a free one; once bound (a
    session's ``ports()``, a listing), it is the port the host listens on."""

    address: str = LOOPBACK_HOST
    host_port: int = 0
    sandbox_port: int

    @property
    def url_host(self) -> str:
        return f"[{self.address}]" if ":" in self.address else self.address

    def __str__(self) -> str:
        return port_text(self)


def port_text(port: PortForward) -> str:
    """``ADDRESS:HOST_PORT->SANDBOX_PORT`` as listings show it."""
    return f"{port.url_host}:{port.host_port}->{port.sandbox_port}"


def _number(text: str, value: str, field: str, what: str, *, zero: bool) -> int:
    low = 0 if zero else 1
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= 65535:
        rule = "a number from 1 to 65535" + (" (or empty, or 0: a free port)" if zero else "")
        raise SpecError(field, f"{value!r}: the {what} must be {rule}")
    return int(text)


def parse_port_text(value: object, field: str) -> PortForward:
    """One entry as typed: an int, or ``[ADDRESS:][HOST_PORT:]SANDBOX_PORT[/tcp]``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SpecError(field, "must be a port number or 'ADDRESS:HOST_PORT:PORT' text")
    if isinstance(value, int):
        value = str(value)
    text, slash, protocol = value.partition("/")
    if slash and protocol != "tcp":
        raise SpecError(field, f"{value!r}: only tcp ports are forwarded")
    address = LOOPBACK_HOST
    if text.startswith("["):
        inner, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise SpecError(field, f"{value!r}: write an IPv6 address as [ADDRESS]:HOST_PORT:PORT")
        address, text = inner, rest[1:]
        parts = text.split(":")
        if len(parts) != 2:
            raise SpecError(field, f"{value!r}: write [ADDRESS]:HOST_PORT:PORT")
    else:
        parts = text.split(":")
        if len(parts) == 3:
            address = parts.pop(0)
        elif len(parts) > 3:
            raise SpecError(field, f"{value!r}: write [ADDRESS:][HOST_PORT:]PORT")
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        raise SpecError(
            field, f"{value!r}: the host address must be an IP address ({address!r} is not)"
        ) from None
    sandbox = _number(parts[-1], value, field, "sandbox port", zero=False)
    host = 0
    if len(parts) == 2 and parts[0]:
        host = _number(parts[0], value, field, "host port", zero=True)
    return PortForward(address=str(parsed), host_port=host, sandbox_port=sandbox)


def check_ports(
    ports: Sequence[object], *, beyond_loopback: bool, reserved: Sequence[int] = ()
) -> list[PortForward]:
    """Every entry parsed; ``reserved`` are the sandbox ports sbxkit's own listeners take
    inside (the proxy's, the callback's, the loopback entries'), which would reach sbxkit's
    forwarders instead of the payload."""
    if len(ports) > MAX_PORTS:
        raise SpecError("network.ports", f"at most {MAX_PORTS} ports")
    found: list[PortForward] = []
    for index, value in enumerate(ports):
        field = f"network.ports[{index}]"
        port = parse_port_text(value, field)
        if not ipaddress.ip_address(port.address).is_loopback and not beyond_loopback:
            raise SpecError(
                field,
                f"{value!r}: the host address {port.address} is not loopback; a forwarded port "
                "is on 127.0.0.1 unless network.ports_beyond_loopback (--port-beyond-loopback) "
                "asks for more, which production refuses",
            )
        if port.sandbox_port in reserved:
            raise SpecError(
                field,
                f"{value!r}: 127.0.0.1:{port.sandbox_port} inside the sandbox is sbxkit's own "
                "listener (the proxy, the callback's or a loopback entry's forwarder)",
            )
        for other in found:
            if port.host_port and (other.address, other.host_port) == (
                port.address,
                port.host_port,
            ):
                raise SpecError(field, f"{value!r}: host port {port.host_port} is named twice")
        found.append(port)
    return found


publish(__name__, globals())  # public names show as sbxkit.NAME
