"""The ranges a name may not lead to: chosen one by one, and tested one by one.

Python's ``ipaddress`` calls the RFC 5737 documentation ranges private; sbxkit does not refuse
them (nobody's internal network by standard; the network tier's stand-in public servers live
there). Everything else that is not a public unicast address is refused, and IPv6 forms that
embed an IPv4 address are judged by what they embed.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit.network.addresses import REFUSED_V4, REFUSED_V6, address_problem

REFUSED = [
    ("0.0.0.0", "this network"),
    ("10.1.2.3", "RFC 1918"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.127.255.254", "carrier-grade NAT"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.255", "loopback"),
    ("169.254.169.254", "link-local"),
    ("172.16.0.1", "RFC 1918"),
    ("172.31.255.255", "RFC 1918"),
    ("192.0.0.170", "IETF protocol assignments"),
    ("192.168.1.1", "RFC 1918"),
    ("198.18.0.1", "benchmarking"),
    ("224.0.0.1", "multicast"),
    ("255.255.255.255", "reserved"),
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("::127.0.0.1", "IPv4-compatible"),
    ("fc00::1", "unique local"),
    ("fd12:3456::1", "unique local"),
    ("fe80::1", "link-local"),
    ("fec0::1", "site-local"),
    ("ff02::1", "multicast"),
    ("2001::1", "Teredo"),
    ("100::1", "discard-only"),
    ("::ffff:127.0.0.1", "loopback, embedded"),
    ("::ffff:10.0.0.1", "RFC 1918"),
    ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
    ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
]
ALLOWED = [
    "1.1.1.1",
    "8.8.8.8",
    "151.101.0.223",
    "100.63.255.255",
    "100.128.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "192.0.2.10",  # RFC 5737 TEST-NET-1: the network tier's stand-in servers
    "198.51.100.10",  # TEST-NET-2
    "203.0.113.10",  # TEST-NET-3
    "2001:db8::10",  # IPv6 documentation
    "2606:4700::1111",
    "::ffff:1.1.1.1",
    "64:ff9b::101:101",  # NAT64 of 1.1.1.1
]


@pytest.mark.parametrize(("text", "why"), REFUSED)
def test_each_refused_range_is_refused_and_named(text: str, why: str) -> None:
    problem = address_problem(ipaddress.ip_address(text))
    assert problem is not None
    assert why in problem


@pytest.mark.parametrize("text", ALLOWED)
def test_public_and_documentation_addresses_are_reached(text: str) -> None:
    assert address_problem(ipaddress.ip_address(text)) is None


def test_the_documentation_ranges_are_a_decision_not_an_accident() -> None:
    # ipaddress calls them private; sbxkit's list deliberately leaves them out.
    for text in ("192.0.2.10", "198.51.100.10", "203.0.113.10"):
        assert ipaddress.ip_address(text).is_private
        assert address_problem(ipaddress.ip_address(text)) is None


@given(st.integers(0, 2**32 - 1))
def test_every_ipv4_address_inside_a_refused_range_is_refused(value: int) -> None:
    address = ipaddress.IPv4Address(value)
    inside = any(address in network for network, _ in REFUSED_V4)
    assert (address_problem(address) is not None) == inside
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    assert (address_problem(mapped) is not None) == inside


@given(st.sampled_from(REFUSED_V6), st.integers(0, 2**128 - 1))
def test_every_ipv6_address_inside_a_refused_range_is_refused(
    refused: tuple[ipaddress.IPv6Network, str], bits: int
) -> None:
    network, _ = refused
    host_bits = bits & int(network.hostmask)
    address = ipaddress.IPv6Address(int(network.network_address) | host_bits)
    assert address_problem(address) is not None


@given(st.integers(0, 2**32 - 1))
def test_nat64_and_6to4_are_judged_by_the_ipv4_address_they_embed(value: int) -> None:
    inner = ipaddress.IPv4Address(value)
    nat64 = ipaddress.IPv6Address(f"64:ff9b::{inner}")
    six_to_four = ipaddress.IPv6Address((0x2002 << 112) | (value << 80))
    expected = address_problem(inner) is None
    assert (address_problem(nat64) is None) == expected
    assert (address_problem(six_to_four) is None) == expected


@given(st.integers(0, 2**32 - 1))
def test_what_is_reached_is_global_or_documentation(value: int) -> None:
    address = ipaddress.IPv4Address(value)
    if address_problem(address) is None:
        documentation_or_relay = any(
            address in ipaddress.IPv4Network(net)
            for net in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "192.88.99.0/24")
        )
        assert address.is_global or documentation_or_relay
