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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from sbxkit.network.names import Destination, parse_host, parse_port, split_host_port

__all__ = ["HOP_BY_HOP", "ProxyRequest", "Refusal", "decide_request", "forward_headers"]

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
