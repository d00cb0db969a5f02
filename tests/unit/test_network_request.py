"""What a request to the allow-list proxy asks for: CONNECT and absolute-form HTTP, decided
from the parsed head; every other shape refused with a status and a reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit.network.names import Destination
from sbxkit.network.request import ProxyRequest, Refusal, decide_request, forward_headers


def decide(method: bytes, target: bytes, *headers: tuple[bytes, bytes]) -> ProxyRequest | Refusal:
    return decide_request(method, target, list(headers))


def test_connect_names_host_and_port() -> None:
    decided = decide(b"CONNECT", b"PyPI.org:443", (b"Host", b"pypi.org:443"))
    assert decided == ProxyRequest(kind="connect", destination=Destination("pypi.org", 443))
    assert decide(b"CONNECT", b"[2001:db8::1]:443") == ProxyRequest(
        kind="connect", destination=Destination("2001:db8::1", 443, True)
    )


@pytest.mark.parametrize(
    ("target", "headers", "reason"),
    [
        (b"pypi.org", [], "CONNECT needs host:port"),
        (b"pypi.org:99999", [], "CONNECT needs host:port"),
        (b"127.1:443", [], "CONNECT needs host:port"),
        (b"pypi.org:443", [(b"Host", b"evil.example:443")], "another destination"),
        (b"pypi.org:443", [(b"Host", b"pypi.org:8443")], "another destination"),
        (b"pypi.org:443", [(b"Host", b"a"), (b"host", b"b")], "more than one Host"),
    ],
)
def test_bad_connects_are_refused(
    target: bytes, headers: list[tuple[bytes, bytes]], reason: str
) -> None:
    decided = decide_request(b"CONNECT", target, headers)
    assert isinstance(decided, Refusal)
    assert decided.status == 400
    assert reason in decided.reason


def test_absolute_form_http_is_one_origin_form_request() -> None:
    decided = decide(b"GET", b"http://Example.org/a/b?q=1", (b"Host", b"example.org"))
    assert decided == ProxyRequest(
        kind="http", destination=Destination("example.org", 80), target=b"/a/b?q=1"
    )
    decided = decide(b"POST", b"http://example.org:8080", (b"Host", b"example.org:8080"))
    assert isinstance(decided, ProxyRequest)
    assert decided.destination.port == 8080
    assert decided.target == b"/"
    decided = decide(b"GET", b"http://example.org?x", (b"Host", b"example.org:80"))
    assert isinstance(decided, ProxyRequest)
    assert decided.target == b"/?x"


@pytest.mark.parametrize(
    ("target", "headers", "reason"),
    [
        (b"/index.html", [(b"Host", b"example.org")], "not a proxy request"),
        (b"https://example.org/", [(b"Host", b"example.org")], "https goes by CONNECT"),
        (b"ftp://example.org/", [(b"Host", b"example.org")], "not proxied"),
        (b"http://user:pw@example.org/", [(b"Host", b"example.org")], "userinfo"),
        (b"http://example.org/#frag", [(b"Host", b"example.org")], "fragment"),
        (b"http://example.org/", [], "exactly one Host"),
        (b"http://example.org/", [(b"Host", b"a"), (b"Host", b"a")], "exactly one Host"),
        (b"http://example.org/", [(b"Host", b"evil.example")], "differs from the request"),
        (b"http://example.org/", [(b"Host", b"example.org:8080")], "differs from the request"),
        (b"http://example.org:8080/", [(b"Host", b"example.org")], "differs from the request"),
        (b"http://exa_mple.org/", [(b"Host", b"exa_mple.org")], "is not HOST[:PORT]"),
        (b"http://\xff/", [(b"Host", b"x")], "not printable ASCII"),
    ],
)
def test_every_other_shape_is_refused(
    target: bytes, headers: list[tuple[bytes, bytes]], reason: str
) -> None:
    decided = decide_request(b"GET", target, headers)
    assert isinstance(decided, Refusal)
    assert decided.status == 400
    assert reason in decided.reason


def test_forwarded_headers_lose_hop_by_hop_and_close_the_connection() -> None:
    headers = [
        (b"Host", b"example.org"),
        (b"Connection", b"keep-alive, X-Secret"),
        (b"Proxy-Authorization", b"Basic x"),
        (b"Proxy-Connection", b"keep-alive"),
        (b"X-Secret", b"1"),
        (b"Upgrade", b"websocket"),
        (b"Expect", b"100-continue"),
        (b"Content-Length", b"3"),
        (b"Accept", b"*/*"),
    ]
    assert forward_headers(headers) == [
        (b"Host", b"example.org"),
        (b"Content-Length", b"3"),
        (b"Accept", b"*/*"),
        (b"Connection", b"close"),
    ]


@given(
    st.sampled_from([b"GET", b"CONNECT", b"POST", b"connect"]),
    st.binary(max_size=80),
    st.lists(st.tuples(st.binary(max_size=12), st.binary(max_size=40)), max_size=4),
)
def test_any_head_is_decided_never_raises(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    decided = decide_request(method, target, headers)
    assert isinstance(decided, ProxyRequest | Refusal)
