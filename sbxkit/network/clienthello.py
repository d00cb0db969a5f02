"""The server name a TLS ClientHello asks for (SNI), read from the first bytes of a tunnel.

Pure and incremental: ``read_client_hello(buffer)`` says ``NEED_MORE``, or gives a ``Hello``
with the SNI host (None when the client sent none), or a problem: bytes that are not a TLS
handshake, a malformed hello, two server names. The hello may span several TLS records (a
large hello with post-quantum key shares does); at most ``MAX_HELLO_BYTES`` are buffered.

The proxy requires the SNI to be the CONNECT host: otherwise one allowed name (``CONNECT
allowed.example:443``) could carry a TLS session for another served from the same address
(fronting by SNI). What the SNI cannot show — an HTTP ``Host`` inside the encrypted session, or
the inner name of an Encrypted ClientHello — is fronting through an allowed CDN, which no
proxy that does not decrypt can see (docs/network.md).
"""

from __future__ import annotations

import msgspec

from sbxkit._model.network_names import normalize_name

__all__ = ["MAX_HELLO_BYTES", "NEED_MORE", "Hello", "HelloProblem", "read_client_hello"]

MAX_HELLO_BYTES = 64 * 1024
_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME = 0
_HOST_NAME = 0
_MAX_RECORD = 16384 + 2048


class Hello(msgspec.Struct, frozen=True):
    sni: str | None


class HelloProblem(msgspec.Struct, frozen=True):
    reason: str


class _NeedMore:
    def __repr__(self) -> str:
        return "NEED_MORE"


NEED_MORE = _NeedMore()


class _Malformed(Exception):
    pass


def _handshake_bytes(buffer: bytes) -> bytes | _NeedMore | HelloProblem:
    """The handshake message bytes of the records so far, once the first message is whole."""
    payload = bytearray()
    offset = 0
    while True:
        if len(payload) >= 4:
            needed = 4 + int.from_bytes(payload[1:4], "big")
            if len(payload) >= needed:
                return bytes(payload[:needed])
        if len(buffer) - offset < 5:
            return NEED_MORE
        kind, major = buffer[offset], buffer[offset + 1]
        length = int.from_bytes(buffer[offset + 3 : offset + 5], "big")
        if kind != _HANDSHAKE or major != 3:
            return HelloProblem(
                "the tunnel did not start with a TLS handshake (CONNECT carries TLS)"
            )
        if length == 0 or length > _MAX_RECORD:
            return HelloProblem(f"a TLS record of {length} bytes")
        if len(buffer) - offset - 5 < length:
            return NEED_MORE
        payload += buffer[offset + 5 : offset + 5 + length]
        offset += 5 + length
        if payload and payload[0] != _CLIENT_HELLO:
            return HelloProblem("the first handshake message is not a ClientHello")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise _Malformed("truncated")
        chunk = self.data[self.at : self.at + count]
        self.at += count
        return chunk

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, size: int) -> bytes:
        return self.take(self.number(size))

    @property
    def done(self) -> bool:
        return self.at == len(self.data)


def _server_name(extension: bytes) -> str:
    reader = _Reader(extension)
    names = _Reader(reader.vector(2))
    if not reader.done:
        raise _Malformed("bytes after the server name list")
    found: list[bytes] = []
    while not names.done:
        kind = names.number(1)
        raw = names.vector(2)
        if kind == _HOST_NAME:
            found.append(raw)
    if len(found) != 1:
        raise _Malformed(f"{len(found)} host names in server_name (exactly one is allowed)")
    try:
        text = found[0].decode("ascii")
    except UnicodeDecodeError:
        raise _Malformed("a server name that is not ASCII") from None
    normalized = normalize_name(text)
    if normalized is None:
        raise _Malformed(f"{text!r} is not a DNS name")
    return normalized


def _parse(message: bytes) -> Hello:
    reader = _Reader(message)
    reader.take(4)  # type and length, checked by the caller
    reader.take(2 + 32)  # legacy_version, random
    reader.vector(1)  # legacy_session_id
    suites = reader.vector(2)
    if not suites or len(suites) % 2:
        raise _Malformed("cipher suites")
    reader.vector(1)  # legacy_compression_methods
    if reader.done:
        return Hello(sni=None)
    extensions = _Reader(reader.vector(2))
    if not reader.done:
        raise _Malformed("bytes after the extensions")
    sni: str | None = None
    seen: set[int] = set()
    while not extensions.done:
        kind = extensions.number(2)
        data = extensions.vector(2)
        if kind in seen:
            raise _Malformed(f"extension {kind} appears twice")
        seen.add(kind)
        if kind == _SERVER_NAME:
            sni = _server_name(data)
    return Hello(sni=sni)


def read_client_hello(buffer: bytes) -> Hello | HelloProblem | _NeedMore:
    """What the bytes read so far say (call again with more bytes on ``NEED_MORE``)."""
    if len(buffer) > MAX_HELLO_BYTES:
        return HelloProblem(f"no complete ClientHello in {MAX_HELLO_BYTES} bytes")
    message = _handshake_bytes(buffer)
    if not isinstance(message, bytes):
        return message
    try:
        return _parse(message)
    except _Malformed as exc:
        return HelloProblem(f"malformed ClientHello: {exc}")
