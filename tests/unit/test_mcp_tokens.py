"""``sbxkit mcp --http``'s door, its pure parts: token files and how a presented token is
checked, the request-size and connection bounds, the refusal log, and the kernel's socket table
that names a refused peer's account. (tests/engine/test_mcp_server.py attacks the real server
from another account.)"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import stat
from collections.abc import Iterator
from typing import Any

import pytest

from sbxkit._grammar.mcp_options import request_body_limit
from sbxkit.errors import SpecError
from sbxkit.mcp.connections import accept_backlog, connection_limit
from sbxkit.mcp.gate import RateLimitedLog, modern_route, peer_uid
from sbxkit.mcp.tokens import (
    DEFAULT_NAME,
    MIN_TOKEN_CHARS,
    Credentials,
    file_problem,
    generated,
    new_token,
    parse_tokens,
)
from sbxkit.network.inbound import _endpoint as _address

A = "a" * 20 + "Bcdefghijklmnopqrstu_-~+/"
B = "z" * 40 + "=="
WHERE = "--token-file /etc/tokens"


def test_one_bare_token_is_the_default_client() -> None:
    [credential] = parse_tokens(f"# the operator's\n\n  {A}  \n", WHERE)
    assert credential.name == DEFAULT_NAME
    assert Credentials((credential,)).verify(f"Bearer {A}".encode()) == (DEFAULT_NAME, "")


def test_named_tokens_are_told_apart() -> None:
    credentials = Credentials(parse_tokens(f"desktop {A}\nci {B}\n", WHERE))
    assert credentials.names == ("desktop", "ci")
    assert credentials.verify(f"Bearer {A}".encode())[0] == "desktop"
    assert credentials.verify(f"bearer   {B}".encode())[0] == "ci"  # the scheme: any case
    assert credentials.verify(f"Bearer {A}x".encode()) == (None, "a wrong bearer token")
    assert credentials.verify(f"Bearer {A[:-1]}".encode()) == (None, "a wrong bearer token")
    assert credentials.verify(None) == (None, "no Authorization header")
    assert credentials.verify(f"Basic {A}".encode()) == (
        None,
        "the Authorization header is not a bearer token",
    )
    assert credentials.verify(b"Bearer") == (None, "a wrong bearer token")


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("", "holds no token"),
        ("# only a comment\n", "holds no token"),
        ("short", f"line 1: the token is 5 characters; at least {MIN_TOKEN_CHARS}"),
        (f"a b {A}", "line 1: expected TOKEN or NAME TOKEN"),
        (f"{A}\n{B}\n", "line 1: name each token (NAME TOKEN) when the file holds several"),
        (f"one {A}\n{B}\n", "line 2: name each token"),
        (f"ci {A}\nci {B}\n", "line 2: the name 'ci' is on line 1 too"),
        (f"ci {A}\ncd {A}\n", "line 2: repeats the token of line 1"),
        (f"-x {A}", "line 1: a client name is 1-64 letters"),
        ("ä" * 40, "line 1: a token holds only letters, digits"),
        ("a:b" * 20, "line 1: a token holds only letters, digits"),
    ],
)
def test_a_bad_token_file_is_refused_by_line(text: str, rule: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_tokens(text, WHERE)
    assert refused.value.field == WHERE
    assert refused.value.rule.startswith(rule), refused.value.rule
    for word in text.split():
        if len(word) >= 8:
            assert word not in str(refused.value)  # a refusal never quotes a token


@pytest.mark.parametrize(
    ("mode", "owner", "problem"),
    [
        (stat.S_IFREG | 0o600, 1000, None),
        (stat.S_IFREG | 0o400, 1000, None),
        (stat.S_IFREG | 0o640, 1000, "is open to group or others (mode 0640)"),
        (stat.S_IFREG | 0o604, 1000, "is open to group or others (mode 0604)"),
        (stat.S_IFREG | 0o620, 1000, "is open to group or others (mode 0620)"),
        (stat.S_IFREG | 0o600, 1001, "is owned by uid 1001, not by the account"),
        (stat.S_IFDIR | 0o700, 1000, "is not a regular file"),
        (stat.S_IFIFO | 0o600, 1000, "is not a regular file"),
    ],
)
def test_only_a_private_file_holds_tokens(mode: int, owner: int, problem: str | None) -> None:
    found = file_problem(mode, owner, 1000)
    assert found == problem if problem is None else (found or "").startswith(problem)


def test_a_generated_token_is_long_and_fresh() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    assert all(len(token) >= MIN_TOKEN_CHARS for token in tokens)
    token = tokens.pop()
    credentials = Credentials(generated(token))
    assert credentials.verify(f"Bearer {token}".encode()) == (DEFAULT_NAME, "")
    assert parse_tokens(token, WHERE)[0].digest == generated(token)[0].digest


def test_requests_have_room_for_every_call_within_max_file_bytes() -> None:
    """Two payloads (a run's stdin and files) of max_file_bytes, every byte escaped at
    JSON's longest (\\u001f), and the rest of the call: base64 (4/3) fits many times over."""
    four_mib = 4 * 1024 * 1024
    assert request_body_limit(four_mib) == 2 * 6 * four_mib + 1024 * 1024
    assert request_body_limit(1) > 4 * 1024 * 1024 // 4
    assert request_body_limit(four_mib) > 2 * (four_mib * 4 // 3 + 4096)


def test_connections_hold_at_most_half_the_file_limit() -> None:
    for files in (64, 256, 1024, 4096, 65536, 1 << 20):
        limit = connection_limit(files)
        assert limit <= 256
        if files >= 64:
            assert limit + 2 * accept_backlog(limit) <= files // 2 + 16
    assert connection_limit(1024) == 256
    assert accept_backlog(256) == 128


def test_the_refusal_log_says_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = RateLimitedLog(burst=3, window=10.0, clock=lambda: now[0])
    made: list[int] = []

    def line(number: int) -> str:
        made.append(number)
        return f"refused {number}"

    with caplog.at_level("WARNING", logger="sbxkit.mcp"):
        for number in range(10):
            log.warning(lambda n=number: line(n))
        now[0] = 10.0
        log.warning(lambda: line(10))
    assert [record.getMessage() for record in caplog.records] == [
        "refused 0",
        "refused 1",
        "refused 2",
        "refused 10 (and 7 more not shown)",
    ]
    assert made == [0, 1, 2, 10]  # a line not logged is never made


def test_modern_requests_are_routed_as_the_sdk_routes_them() -> None:
    assert modern_route([(b"mcp-protocol-version", b"2026-07-28")])
    assert modern_route([(b"mcp-protocol-version", b"1999-01-01")])  # the SDK's: not handshake
    assert not modern_route([(b"mcp-protocol-version", b"2025-11-25")])
    assert not modern_route([])


def test_the_kernels_socket_table_is_read_as_the_kernel_writes_it() -> None:
    assert _address("0100007F:1F90") == _ip_port("127.0.0.1", 8080)
    six = "00000000000000000000000001000000:0050"  # ::1 in host-order words
    assert _address(six) == _ip_port("::1", 80)
    mapped = "0000000000000000FFFF00000100007F:0050"  # ::ffff:127.0.0.1
    assert _address(mapped) == _ip_port("127.0.0.1", 80)


@contextlib.contextmanager
def loopback_pair() -> Iterator[tuple[socket.socket, socket.socket, socket.socket, Any]]:
    """A real connection on this machine: the listener, the client, the accepted end and the
    client's address as the listener sees it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    accepted, peer = server.accept()
    try:
        yield server, client, accepted, peer
    finally:
        for sock in (client, accepted, server):
            sock.close()


def test_a_loopback_peers_account_is_found() -> None:
    """Its client end is ours (this process's uid)."""
    with loopback_pair() as (server, _client, _accepted, peer):
        assert peer_uid(peer, server.getsockname()) == os.geteuid()
        assert peer_uid(("127.0.0.1", 1), server.getsockname()) is None


def test_a_closed_peer_has_no_account() -> None:
    """The client closes first, so its end lingers in TIME_WAIT, which the kernel lists as
    uid 0 with no inode: that is nobody's account (it read as root's before)."""
    with loopback_pair() as (server, client, accepted, peer):
        client.close()
        accepted.recv(1)  # the client's FIN: its end leaves ESTABLISHED
        accepted.close()
        assert peer_uid(peer, server.getsockname()) is None


def _ip_port(ip: str, port: int) -> tuple[object, int]:
    return ipaddress.ip_address(ip), port
