"""The SNI of a TLS ClientHello, read incrementally: real hellos from Python's ssl module,
split anywhere and across records; what is not one hello for one name is a problem, never an
exception."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit.network.clienthello import (
    MAX_HELLO_BYTES,
    NEED_MORE,
    Hello,
    HelloProblem,
    read_client_hello,
)


def real_hello(server_hostname: str | None) -> bytes:
    """What a client's ssl sends first (its ClientHello record)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


HELLO = real_hello("files.pythonhosted.org")


def test_a_real_hello_names_its_server() -> None:
    assert read_client_hello(HELLO) == Hello(sni="files.pythonhosted.org")
    assert read_client_hello(real_hello("PyPI.org")) == Hello(sni="pypi.org")


def test_a_hello_without_a_name_says_so() -> None:
    assert read_client_hello(real_hello(None)) == Hello(sni=None)


@given(st.integers(0, len(HELLO) - 1))
def test_every_prefix_asks_for_more(cut: int) -> None:
    assert read_client_hello(HELLO[:cut]) is NEED_MORE


def rerecord(hello: bytes, sizes: list[int]) -> bytes:
    """The same handshake bytes in several TLS records (a large hello spans records)."""
    header, payload = hello[:5], hello[5:]
    out = b""
    while payload:
        size = sizes.pop(0) if sizes else len(payload)
        size = max(1, min(size, len(payload)))
        out += header[:3] + size.to_bytes(2, "big") + payload[:size]
        payload = payload[size:]
    return out


@given(st.lists(st.integers(1, 200), max_size=8))
def test_a_hello_split_over_records_is_read_whole(sizes: list[int]) -> None:
    assert read_client_hello(rerecord(HELLO, sizes)) == Hello(sni="files.pythonhosted.org")


def test_what_follows_the_hello_does_not_matter() -> None:
    assert read_client_hello(HELLO + b"\x17\x03\x03junk") == Hello(sni="files.pythonhosted.org")


def with_server_names(*names: tuple[int, bytes]) -> bytes:
    """A minimal ClientHello whose server_name extension lists ``names``."""
    entries = b"".join(bytes([kind]) + len(n).to_bytes(2, "big") + n for kind, n in names)
    sni = len(entries).to_bytes(2, "big") + entries
    extensions = b"\x00\x00" + len(sni).to_bytes(2, "big") + sni
    body = (
        b"\x03\x03"
        + b"\x00" * 32
        + b"\x00"
        + b"\x00\x02\x13\x01"
        + b"\x01\x00"
        + len(extensions).to_bytes(2, "big")
        + extensions
    )
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "did not start with a TLS handshake"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "did not start with a TLS handshake"),
        (b"\x16\x03\x01\x00\x00", "a TLS record of 0 bytes"),
        (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "not a ClientHello"),
        (with_server_names((0, b"a.example"), (0, b"b.example")), "2 host names"),
        (with_server_names(), "0 host names"),
        (with_server_names((0, b"bad_name.example")), "not a DNS name"),
        (with_server_names((0, b"\xc3\xa9.example")), "not ASCII"),
        (HELLO[:9] + b"\xff" * (len(HELLO) - 9), "malformed"),
    ],
)
def test_what_is_not_one_hello_for_one_name_is_a_problem(data: bytes, reason: str) -> None:
    outcome = read_client_hello(data)
    assert isinstance(outcome, HelloProblem)
    assert reason in outcome.reason


def test_the_buffer_is_bounded() -> None:
    endless = b"\x16\x03\x01\x40\x00\x01\xff\xff\xff" + b"\x00" * (MAX_HELLO_BYTES + 10)
    assert isinstance(read_client_hello(endless), HelloProblem)


def test_a_minimal_hello_with_one_name_is_read() -> None:
    assert read_client_hello(with_server_names((0, b"a.example"))) == Hello(sni="a.example")


@given(st.binary(max_size=300))
def test_any_bytes_are_judged_never_raise(data: bytes) -> None:
    outcome = read_client_hello(data)
    assert outcome is NEED_MORE or isinstance(outcome, Hello | HelloProblem)


@given(st.binary(max_size=200))
def test_a_corrupted_real_hello_is_judged_never_raises(noise: bytes) -> None:
    data = HELLO[:40] + noise + HELLO[40 + len(noise) :]
    outcome = read_client_hello(data)
    assert outcome is NEED_MORE or isinstance(outcome, Hello | HelloProblem)
