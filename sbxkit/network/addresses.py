"""Which resolved addresses a name may lead to: the refused ranges, chosen one by one.

Pure. A name on the allow-list must lead to a public address: the proxy resolves it itself
and refuses every result in a range below (DNS rebinding — ``allowed.example`` answering
``10.0.0.5`` or ``169.254.169.254`` — reaches nothing). Only an entry that *is* the literal
address reaches it.

The list is deliberate, not ``ipaddress``'s ``is_private``/``is_global``: those also count the
documentation ranges (RFC 5737's 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 and IPv6's
2001:db8::/32) as non-global, and those are nobody's internal network by standard: sbxkit's
network tests number their stand-in public servers from them. A deployment that numbers its
own internal network from a documentation range (some VM hosts do) should know that a name
resolving there is reached. IPv6 forms that embed an IPv4 address (IPv4-mapped, NAT64's
well-known prefix, 6to4) are judged by the address they embed.
"""

from __future__ import annotations

import ipaddress

from sbxkit._model.network_names import IPAddress

__all__ = ["REFUSED_V4", "REFUSED_V6", "address_problem"]

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

REFUSED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "'this network' (RFC 791)"),
    (_V4("10.0.0.0/8"), "private (RFC 1918)"),
    (_V4("100.64.0.0/10"), "carrier-grade NAT (RFC 6598)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local (cloud metadata lives here)"),
    (_V4("172.16.0.0/12"), "private (RFC 1918)"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments (RFC 6890)"),
    (_V4("192.168.0.0/16"), "private (RFC 1918)"),
    (_V4("198.18.0.0/15"), "benchmarking (RFC 2544), used by internal labs"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved (and the broadcast address)"),
)
REFUSED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("::/96"), "IPv4-compatible (deprecated)"),
    (_V6("100::/64"), "discard-only (RFC 6666)"),
    (_V6("2001::/32"), "Teredo (an IPv4 address hidden inside)"),
    (_V6("fc00::/7"), "unique local (ULA)"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local (deprecated)"),
    (_V6("ff00::/8"), "multicast"),
)
_NAT64 = _V6("64:ff9b::/96")
_SIX_TO_FOUR = _V6("2002::/16")


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    return None


def address_problem(address: IPAddress) -> str | None:
    """Why a name may not lead to ``address`` (the range it is in), or None when it may."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_v4(address)
        if embedded is not None:
            problem = address_problem(embedded)
            return None if problem is None else f"{problem}, embedded in {address}"
        for network, why in REFUSED_V6:
            if address in network:
                return f"{address} is {why}"
        return None
    for network4, why in REFUSED_V4:
        if address in network4:
            return f"{address} is {why}"
    return None
