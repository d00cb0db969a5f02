"""Inbound ports, pure: the grammar as typed, the rules that refuse before create, and who a
loopback peer is (``find_peer``/``peer_problem`` on /proc/net/tcp text). The real thing —
the forward, another account refused, the SIGKILL — is tests/network/test_ports.py."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

from sbxkit._grammar.profile import apply_profile, decode_profile
from sbxkit._model.network_ports import PortForward, check_ports, parse_port_text
from sbxkit._model.network_terms import Network, NetworkTerms, check_network_spec
from sbxkit._model.rules import check_network
from sbxkit.errors import SpecError
from sbxkit.network.inbound import PeerSocket, _normal, _read_peer, find_peer, peer_problem


@pytest.mark.parametrize(
    ("typed", "address", "host", "inside"),
    [
        (8000, "127.0.0.1", 0, 8000),
        ("8000", "127.0.0.1", 0, 8000),
        ("8000/tcp", "127.0.0.1", 0, 8000),
        ("18000:8000", "127.0.0.1", 18000, 8000),
        ("127.0.0.1:18000:8000", "127.0.0.1", 18000, 8000),
        ("127.0.0.1::8000", "127.0.0.1", 0, 8000),
        ("127.0.0.2:0:8000", "127.0.0.2", 0, 8000),
        ("[::1]:18000:8000", "::1", 18000, 8000),
        ("[::1]::8000", "::1", 0, 8000),
    ],
)
def test_a_port_as_docker_spells_it(typed: object, address: str, host: int, inside: int) -> None:
    assert parse_port_text(typed, "f") == PortForward(
        address=address, host_port=host, sandbox_port=inside
    )


@pytest.mark.parametrize(
    ("typed", "words"),
    [
        (0, "the sandbox port must be a number from 1 to 65535"),
        (70000, "the sandbox port must be a number from 1 to 65535"),
        (-1, "the sandbox port must be a number from 1 to 65535"),
        ("", "the sandbox port must be"),
        ("70000:8000", "the host port must be a number from 1 to 65535"),
        ("x:1:8000", "the host address must be an IP address"),
        ("localhost:1:8000", "the host address must be an IP address"),
        ("8000/udp", "only tcp ports"),
        ("8000-8010", "the sandbox port must be"),
        ("1:2:3:4", "write [ADDRESS:][HOST_PORT:]PORT"),
        ("[::1]8000", "write an IPv6 address as"),
        ("٨٠٠٠", "the sandbox port must be"),  # Arabic-Indic digits: not ASCII
        (True, "must be a port number"),
        (8000.0, "must be a port number"),
    ],
)
def test_a_bad_port_names_what_was_typed_and_the_rule(typed: object, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_port_text(typed, "network.ports[0]")
    assert caught.value.field == "network.ports[0]"
    assert words in caught.value.rule


def test_beyond_loopback_needs_the_option_and_production_refuses_it() -> None:
    with pytest.raises(SpecError, match="is not loopback") as caught:
        check_ports(["0.0.0.0:18000:8000"], beyond_loopback=False)
    assert caught.value.field == "network.ports[0]"
    assert check_ports(["0.0.0.0:18000:8000"], beyond_loopback=True)[0].address == "0.0.0.0"
    network = Network(ports=["0.0.0.0:18000:8000"], ports_beyond_loopback=True)
    check_network(network, b"development")
    with pytest.raises(SpecError, match="refused in production") as caught:
        check_network(network, b"production")
    assert caught.value.field == "network.ports_beyond_loopback"
    with pytest.raises(SpecError, match="only meaningful"):
        check_network_spec(Network(ports_beyond_loopback=True))


def test_sbxkits_own_ports_inside_and_twice_named_host_ports_are_refused() -> None:
    for network in (
        Network(allow=["a.example"], ports=[3128]),
        Network(callback="http://h.example:8080", ports=[8080]),
        Network(allow=["127.0.0.1:9000"], ports=[9000]),
    ):
        with pytest.raises(SpecError, match="sbxkit's own listener"):
            check_network_spec(network)
    assert check_network_spec(Network(ports=[3128])).ports[0].sandbox_port == 3128  # no proxy
    with pytest.raises(SpecError, match="named twice"):
        check_network_spec(Network(ports=["18000:80", "18000:81"]))
    with pytest.raises(SpecError, match="a managed network routes"):
        check_network_spec(Network(mode="managed", ports=[80]))
    with pytest.raises(SpecError, match="at most 32"):
        check_network_spec(Network(ports=list(range(1, 34))))


def test_ports_alone_are_a_governed_network() -> None:
    terms = NetworkTerms(mode="none", allow=[], ports=[PortForward(sandbox_port=8000)])
    assert terms.needs_governor
    assert not NetworkTerms(mode="none", allow=[]).needs_governor


def _row(slot: int, local: str, remote: str, state: str, uid: int, inode: int) -> str:
    return (
        f"{slot:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 "
        f"{uid:5d}        0 {inode} 1 0000000000000000 20 4 30 10 -1"
    )


def _hex(address: str, port: int) -> str:
    packed = socket.inet_aton(address)
    return f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"


def test_the_peer_is_the_row_whose_ends_are_ours_swapped() -> None:
    loopback = ipaddress.ip_address("127.0.0.1")
    peer, ours = (loopback, 40000), (loopback, 39347)
    table = "\n".join(
        [
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid",
            _row(0, _hex("127.0.0.1", 39347), _hex("0.0.0.0", 0), "0A", 0, 11),
            _row(1, _hex("127.0.0.1", 39347), _hex("127.0.0.1", 40000), "01", 0, 12),
            _row(2, _hex("127.0.0.1", 40000), _hex("127.0.0.1", 39347), "01", 1001, 13),
        ]
    )
    assert find_peer(table, peer, ours) == PeerSocket(uid=1001, inode=13)
    assert find_peer(table, (loopback, 40001), ours) is None
    assert peer_problem(PeerSocket(uid=1001, inode=13), 1001) is None
    assert "uid 1001, not the sandbox owner's uid 0" in (
        peer_problem(PeerSocket(uid=1001, inode=13), 0) or ""
    )
    # a closed or TIME_WAIT end is listed as uid 0 with no inode: never taken for root's
    assert "closed" in (peer_problem(PeerSocket(uid=0, inode=0), 0) or "")
    assert "not a socket of this host" in (peer_problem(None, 0) or "")


def test_the_kernel_lists_a_live_peer_with_its_uid_and_a_closed_one_without() -> None:
    """The same lookup on this kernel's own tables: a live loopback client is found with this
    process's uid; once it closed, its end has no inode (and reads as uid 0), so it is
    refused rather than taken for root's."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, remote = server.accept()
        with accepted:
            peer = _normal(remote[0], remote[1])
            ours = _normal(*accepted.getsockname()[:2])
            found = _read_peer(peer, ours)
            assert found is not None
            assert found.uid == os.geteuid()
            assert found.inode > 0
            assert peer_problem(found, os.geteuid()) is None
            client.close()
            after = _read_peer(peer, ours)
            assert peer_problem(after, os.geteuid()) is not None


def test_a_profile_names_ports_and_a_bad_one_is_refused_by_its_path() -> None:
    text = (
        b'[sandbox.docker]\nimage = "i"\n[sandbox.docker.network]\nports = [8000, "18001:8001"]\n'
    )
    spec, _, _ = apply_profile(decode_profile(text, source="p"), ["true"])
    assert isinstance(spec.network, Network)
    assert check_network_spec(spec.network).ports == [
        PortForward(sandbox_port=8000),
        PortForward(host_port=18001, sandbox_port=8001),
    ]
    with pytest.raises(SpecError, match="the sandbox port must be") as caught:
        decode_profile(text.replace(b"8000,", b"0,"), source="p")  # checked as it is read
    assert caught.value.field == "sandbox.docker.network.ports[0]"
