"""Destinations by name: the grammar of hosts and ports every network rule shares.

Pure. A host is a DNS name (ASCII, lowercase, labels of ``[a-z0-9-]``) or an IP literal
(IPv4 dotted quad, IPv6 in brackets where a port follows). Anything else is refused rather
than guessed at: a resolver reads ``2130706433``, ``127.1`` and ``0x7f.0.0.1`` as addresses,
so a name whose last label is all digits is no name; a non-ASCII name would need IDNA, which
sbxkit does not do (write the ``xn--`` form). One trailing dot (the root) is dropped, so
``pypi.org.`` and ``pypi.org`` are the same destination everywhere they are compared.
"""

from __future__ import annotations

import ipaddress
import re

import msgspec

__all__ = [
    "Destination",
    "IPAddress",
    "destination_text",
    "normalize_name",
    "parse_host",
    "parse_ip",
    "parse_port",
    "split_host_port",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_NAME_BYTES = 253
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_DIGITS = re.compile(r"[0-9]{1,5}")


class Destination(msgspec.Struct, frozen=True):
    """A host and port as a client asked for them, normalised: ``host`` is a lowercase DNS
    name, or an IP literal in its compressed form (``is_ip``)."""

    host: str
    port: int
    is_ip: bool = False


def normalize_name(text: str) -> str | None:
    """``text`` as a lowercase DNS name without the root's dot, or None if it is not one."""
    if not isinstance(text, str) or not text.isascii():
        return None
    name = text.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > MAX_NAME_BYTES:
        return None
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return None
    if labels[-1].isdigit():
        return None  # 127.1, 2130706433: a resolver would read an address
    return name


def parse_ip(text: str) -> IPAddress | None:
    """A strict IP literal (no zone id, no leading zeros, no short IPv4 forms), or None."""
    if not isinstance(text, str) or not text.isascii() or "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def parse_port(text: str) -> int | None:
    """A decimal port 1..65535 in ASCII digits, or None."""
    if not isinstance(text, str) or _DIGITS.fullmatch(text) is None:
        return None
    port = int(text)
    if text != str(port) or not 1 <= port <= 65535:
        return None
    return port


def split_host_port(text: str) -> tuple[str, str | None] | None:
    """``host[:port]`` or ``[v6][:port]`` into its two texts (the port None when absent); None
    when the shape is wrong (an unbracketed IPv6 literal with a port is ambiguous)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        host, rest = text[1:end], text[end + 1 :]
        if parse_ip(host) is None or ":" not in host:
            return None  # brackets hold an IPv6 literal and nothing else
        if not rest:
            return host, None
        if not rest.startswith(":"):
            return None
        return host, rest[1:]
    if text.count(":") > 1:
        return (text, None) if parse_ip(text) is not None else None
    host, colon, port = text.partition(":")
    return host, (port if colon else None)


def parse_host(text: str) -> tuple[str, bool] | None:
    """``(normalised host, is_ip)`` for a DNS name or an IP literal, or None."""
    address = parse_ip(text)
    if address is not None:
        return str(address), True
    name = normalize_name(text)
    return None if name is None else (name, False)


def destination_text(destination: Destination) -> str:
    """``host:port``, IPv6 in brackets (how logs and results print a destination)."""
    host = destination.host
    if destination.is_ip and ":" in host:
        host = f"[{host}]"
    return f"{host}:{destination.port}"
