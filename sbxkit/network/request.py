"""What a request to the allow-list proxy asks for, decided from its parsed head.

Pure: the method, the request target and the headers in (the I/O shell parses them with h11),
a ``ProxyRequest`` or a ``Refusal`` out. Two forms are proxied:

- ``CONNECT host:port`` — a tunnel; the TLS ClientHello that follows must name the same host
  (sbxkit/network/clienthello.py), so one allowed name cannot carry another (fronting by SNI);
- absolute-form plain HTTP, ``GET http://host[:port]/path`` — one request per connection; its
  ``Host`` header must be exactly the URI's authority, so a request cannot name an allowed
  host in one place and another in the other.

Anything else is refused with the status a client can read: an origin-form request (the client
does not know it talks to a proxy), ``https://`` in absolute form (use CONNECT), userinfo, a
fragment, a missing or repeated ``Host``.

``framing_problem`` judges the raw head's message framing (RFC 9112 §6.3) before anything is
forwarded: a request whose body length two parsers could read differently — ``Content-Length``
beside ``Transfer-Encoding``, a repeated or listed ``Content-Length``, a coding other than
``chunked``, a folded header line — is refused, never forwarded. Forwarded as it came, such a
request let an upstream that prefers ``Content-Length`` read the rest of the body as a second
request, one the proxy never decided on (its ``Host`` a denied name).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import msgspec

from sbxkit._model.network_names import Destination, parse_host, parse_port, split_host_port

__all__ = [
    "HOP_BY_HOP",
    "ProxyRequest",
    "Refusal",
    "decide_request",
    "forward_headers",
    "framing_problem",
]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"upgrade",
        b"expect",  # the proxy answers 100-continue itself; upstream gets the body at once
    }
)


class ProxyRequest(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["connect", "http"]
    destination: Destination
    target: bytes = b""
    """For plain HTTP: the origin-form target (path and query) sent upstream."""


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    reason: str
    destination: Destination | None = None


Headers = Sequence[tuple[bytes, bytes]]


def _authority(text: str, default_port: int | None) -> Destination | None:
    split = split_host_port(text)
    if split is None:
        return None
    host_text, port_text = split
    if port_text is None:
        if default_port is None:
            return None
        port = default_port
    else:
        parsed_port = parse_port(port_text)
        if parsed_port is None:
            return None
        port = parsed_port
    parsed = parse_host(host_text)
    if parsed is None:
        return None
    host, is_ip = parsed
    return Destination(host, port, is_ip)


def _host_headers(headers: Headers) -> list[bytes]:
    return [value for name, value in headers if name.lower() == b"host"]


def _decode(raw: bytes) -> str | None:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() and " " not in text else None


def _connect(target: bytes, headers: Headers) -> ProxyRequest | Refusal:
    text = _decode(target)
    destination = None if text is None else _authority(text, None)
    if destination is None:
        return Refusal(status=400, reason="CONNECT needs host:port (a DNS name or an address)")
    hosts = _host_headers(headers)
    if len(hosts) > 1:
        return Refusal(status=400, reason="more than one Host header", destination=destination)
    if hosts:
        given = _decode(hosts[0])
        named = None if given is None else _authority(given, destination.port)
        if named != destination:
            return Refusal(
                status=400,
                reason="the Host header names another destination than CONNECT",
                destination=destination,
            )
    return ProxyRequest(kind="connect", destination=destination)


def _absolute(target: bytes, headers: Headers) -> ProxyRequest | Refusal:
    text = _decode(target)
    if text is None:
        return Refusal(status=400, reason="the request target is not printable ASCII")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return Refusal(
            status=400,
            reason="not a proxy request: send absolute-form http://HOST/... or CONNECT",
        )
    if scheme.lower() != "http":
        return Refusal(
            status=400, reason=f"{scheme}:// is not proxied in absolute form; https goes by CONNECT"
        )
    if "#" in rest:
        return Refusal(status=400, reason="a request target has no fragment")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        return Refusal(status=400, reason="userinfo in the request target is refused")
    destination = _authority(authority, 80)
    if destination is None:
        return Refusal(status=400, reason=f"{authority!r} is not HOST[:PORT]")
    hosts = _host_headers(headers)
    if len(hosts) != 1:
        return Refusal(
            status=400, reason="exactly one Host header is required", destination=destination
        )
    given = _decode(hosts[0])
    if given is None or _authority(given, 80) != destination:
        return Refusal(
            status=400,
            reason="the Host header differs from the request target's authority",
            destination=destination,
        )
    if not path.startswith("/"):
        path = "/" + path
    return ProxyRequest(kind="http", destination=destination, target=path.encode("ascii"))


def decide_request(method: bytes, target: bytes, headers: Headers) -> ProxyRequest | Refusal:
    """The proxied destination a request head asks for, or why it is refused."""
    if method.upper() == b"CONNECT":
        return _connect(target, headers)
    return _absolute(target, headers)


def forward_headers(headers: Headers) -> list[tuple[bytes, bytes]]:
    """The headers sent upstream: hop-by-hop ones (and any ``Connection`` names) dropped, and
    ``Connection: close`` — one request per connection, so a second request on the same
    connection cannot reach the upstream under the first one's decision."""
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    kept = [
        (name, value)
        for name, value in headers
        if name.lower() not in HOP_BY_HOP and name.lower() not in named
    ]
    return [*kept, (b"Connection", b"close")]


_FRAMING = (b"content-length", b"transfer-encoding")
_DIGITS = re.compile(rb"[0-9]+")
_OWS = b" \t"


def framing_problem(head: bytes) -> str | None:
    """Why the framing of a request's body is ambiguous, or None (RFC 9112 §6.3).

    ``head`` is the request as received, from its request line through the blank line (what
    follows is ignored): the raw bytes, since a parser's normalised headers hide exactly what
    matters here (h11 joins a folded line and merges equal ``Content-Length`` values). Lines
    end in LF with an optional CR before it, as the parser reads them."""
    lengths: list[bytes] = []
    codings: list[bytes] = []
    for raw in head.split(b"\n")[1:]:
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if not line:
            break  # the blank line: the head ends here
        if line[:1] in (b" ", b"\t"):
            return "an obsolete line folding (a header line that starts with whitespace)"
        name, colon, value = line.partition(b":")
        if not colon:
            continue  # not a header the framing depends on (the parser refuses it anyway)
        lowered = name.lower()
        if lowered.strip(_OWS) in _FRAMING and lowered != lowered.strip(_OWS):
            return f"whitespace around the header name {name.strip(_OWS).decode('latin-1')!r}"
        if lowered == b"content-length":
            lengths.append(value.strip(_OWS))
        elif lowered == b"transfer-encoding":
            codings.append(value.strip(_OWS))
    if lengths and codings:
        return "both Content-Length and Transfer-Encoding: the body's length is ambiguous"
    if len(lengths) > 1:
        return "more than one Content-Length header"
    if lengths and _DIGITS.fullmatch(lengths[0]) is None:
        return "Content-Length must be one decimal number (a list is ambiguous)"
    if len(codings) > 1:
        return "more than one Transfer-Encoding header"
    if codings and codings[0].lower() != b"chunked":
        return "a Transfer-Encoding other than exactly chunked"
    return None
