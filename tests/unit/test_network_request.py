"""What a request to the allow-list proxy asks for: CONNECT and absolute-form HTTP, decided
from the parsed head; every other shape refused with a status and a reason; a head whose body
framing two parsers could read differently refused (RFC 9112 §6.3)."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._model.network_names import Destination
from sbxkit.network.request import (
    ProxyRequest,
    Refusal,
    decide_request,
    forward_headers,
    framing_problem,
)


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


def head(*lines: bytes, end: bytes = b"\r\n") -> bytes:
    return end.join([b"POST http://allowed.test/ HTTP/1.1", *lines, b"", b""])


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        # the finding: both lengths, the smuggled request riding in what one parser calls body
        ([b"Content-Length: 4", b"Transfer-Encoding: chunked"], "both Content-Length and"),
        ([b"transfer-encoding: chunked", b"content-length: 0"], "both Content-Length and"),
        ([b"Content-Length: 4", b"Transfer-Encoding: identity"], "both Content-Length and"),
        ([b"Content-Length: 4", b"Content-Length: 4"], "more than one Content-Length"),
        ([b"Content-Length: 4", b"Content-Length: 5"], "more than one Content-Length"),
        ([b"Content-Length: 4, 4"], "one decimal number"),
        ([b"Content-Length: +4"], "one decimal number"),
        ([b"Content-Length: 0x4"], "one decimal number"),
        ([b"Content-Length:"], "one decimal number"),
        ([b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"], "more than one Transfer"),
        ([b"Transfer-Encoding: gzip, chunked"], "other than exactly chunked"),
        ([b"Transfer-Encoding: chunked, chunked"], "other than exactly chunked"),
        ([b"Transfer-Encoding: identity"], "other than exactly chunked"),
        ([b"Transfer-Encoding: xchunked"], "other than exactly chunked"),
        ([b"Transfer-Encoding:", b" chunked"], "obsolete line folding"),
        ([b"X-Note: a", b"\tTransfer-Encoding: chunked"], "obsolete line folding"),
        ([b"Content-Length: 4", b"X-Note: a", b" b"], "obsolete line folding"),
        ([b"Transfer-Encoding : chunked"], "whitespace around the header name"),
        ([b"Content-Length\t: 4"], "whitespace around the header name"),
    ],
)
def test_an_ambiguous_framing_is_named(lines: list[bytes], reason: str) -> None:
    problem = framing_problem(head(*lines))
    assert problem is not None
    assert reason in problem
    assert framing_problem(head(*lines, end=b"\n")) == problem  # bare LF lines alike


@pytest.mark.parametrize(
    "lines",
    [
        [],
        [b"Content-Length: 0"],
        [b"Content-Length:  12 "],
        [b"Transfer-Encoding: chunked"],
        [b"Transfer-Encoding: Chunked"],  # coding names are case-insensitive
        [b"Content-Type: text/plain", b"X-Content-Length: 4", b"X-Transfer-Encoding: gzip"],
    ],
)
def test_a_single_clear_framing_passes(lines: list[bytes]) -> None:
    assert framing_problem(head(*lines)) is None


def test_only_the_head_is_judged() -> None:
    smuggled = b"GET / HTTP/1.1\r\nHost: denied.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert framing_problem(head(b"Content-Length: 47") + smuggled) is None
    assert framing_problem(b"") is None
    assert framing_problem(b"CONNECT a.test:443 HTTP/1.1\r\nContent-Length: 1, 2\r\n") is not None


FRAMING_LINES = st.sampled_from(
    [
        b"Content-Length: 4",
        b"content-length: 7",
        b"Content-Length: 4, 4",
        b"Content-Length: 4,5",
        b"Transfer-Encoding: chunked",
        b"TRANSFER-ENCODING: CHUNKED",
        b"Transfer-Encoding: gzip, chunked",
        b"Transfer-Encoding:",
        b" chunked",
        b"\tContent-Length: 4",
        b"Transfer-Encoding : chunked",
        b"Host: allowed.test",
        b"X-Any: value",
    ]
)


def _framing_of(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [name.lower() for name, _ in headers if name.lower() in _FRAMING_NAMES]


_FRAMING_NAMES = (b"content-length", b"transfer-encoding")


@given(st.lists(FRAMING_LINES, max_size=6), st.sampled_from([b"\r\n", b"\n"]))
def test_what_passes_is_framed_one_way_for_every_parser(lines: list[bytes], end: bytes) -> None:
    """Whatever head a payload builds: one carrying both a length and a coding is refused,
    and one that passes, as h11 reads it, is forwarded with at most one framing header —
    the one h11 framed its body by — so an upstream cannot read another body length."""
    raw = head(*lines, end=end)
    problem = framing_problem(raw)
    names = {line.partition(b":")[0].strip().lower() for line in lines}
    if {b"content-length", b"transfer-encoding"} <= names:
        assert problem is not None
    if problem is not None:
        return
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    try:
        request = conn.next_event()
    except h11.RemoteProtocolError:
        return  # h11 refuses it too (the proxy answers 400)
    assert isinstance(request, h11.Request)
    forwarded = _framing_of(forward_headers(list(request.headers)))
    assert len(forwarded) <= 1
    assert forwarded == _framing_of(list(request.headers))


@given(st.binary(max_size=300))
def test_any_bytes_are_judged_never_raise(data: bytes) -> None:
    assert framing_problem(data) is None or isinstance(framing_problem(data), str)
