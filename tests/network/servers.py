"""The network tier's stand-ins for the world: upstream HTTP and HTTPS servers on the
namespace's RFC 5737 addresses, callback servers on its loopback, and a DNS witness.

They run in threads of the test process, which lives in the tier's namespace
(scripts/network-tier), as does every proxy that dials them. Each server records what reached
it, so a test can prove a refused request never did.
"""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trustme

ALLOWED = "allowed.sbxkit.test"  # 192.0.2.10 (the tier's hosts file)
OTHER_NAME = "other-name.sbxkit.test"  # the same address: a name served beside ALLOWED
DENIED = "denied.sbxkit.test"  # 198.51.100.10
PRIVATE = "private.sbxkit.test"  # 10.0.0.5: a name that resolves to a private address
METADATA = "metadata.sbxkit.test"  # 169.254.169.254
UNKNOWN = "unknown.sbxkit.test"  # in no hosts file: only DNS could answer (the witness)
CALLBACK = "callback.sbxkit.test"  # 127.0.0.1 in the tier's namespace
LITERAL = "203.0.113.10"  # reached only by an entry that is this address
BIG_BYTES = 256 * 1024


@dataclass
class Seen:
    """What one server was asked: (Host header, path, peer address)."""

    requests: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, host: str, path: str, peer: str) -> None:
        with self.lock:
            self.requests.append((host, path, peer))

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()


def _handler(label: str, seen: Seen) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen.add(self.headers.get("Host", ""), self.path, self.client_address[0])
            if self.path == "/big":
                body = b"x" * BIG_BYTES
            else:
                body = f"{label} {self.headers.get('Host', '')} {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@dataclass
class Servers:
    """Every stand-in server, by the name a test uses, and the CA their certificates chain to."""

    ca: trustme.CA
    ca_pem: str
    seen: dict[str, Seen]
    client_bundle: dict[str, Path]
    """The callback's client TLS bundle (ca, cert, key files) for the https callback."""

    def clear(self) -> None:
        for record in self.seen.values():
            record.clear()


def _serve(address: str, port: int, label: str, seen: Seen, tls: ssl.SSLContext | None) -> _Server:
    server = _Server((address, port), _handler(label, seen))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name=f"upstream {label}", daemon=True).start()
    return server


@contextmanager
def running_servers(directory: Path) -> Iterator[Servers]:
    ca = trustme.CA()
    seen = {name: Seen() for name in ("a", "b", "literal", "callback", "callback_tls")}

    def tls(*names: str, client_ca: trustme.CA | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*names).configure_cert(context)
        if client_ca is not None:
            client_ca.configure_trust(context)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    client = ca.issue_cert("sandbox-client")
    bundle = {
        "ca": directory / "ca.pem",
        "cert": directory / "client.pem",
        "key": directory / "client.key",
    }
    ca.cert_pem.write_to_path(str(bundle["ca"]))
    client.cert_chain_pems[0].write_to_path(str(bundle["cert"]))
    client.private_key_pem.write_to_path(str(bundle["key"]))
    for path in bundle.values():
        path.chmod(0o600)  # the host's copy is the operator's own: sbxkit copies it in
    servers = [
        _serve("192.0.2.10", 80, "A", seen["a"], None),
        _serve("192.0.2.10", 443, "A", seen["a"], tls(ALLOWED, OTHER_NAME)),
        _serve("198.51.100.10", 80, "B", seen["b"], None),
        _serve("198.51.100.10", 443, "B", seen["b"], tls(DENIED)),
        _serve(LITERAL, 80, "C", seen["literal"], None),
        _serve("127.0.0.1", 8080, "callback", seen["callback"], None),
        _serve(
            "127.0.0.1", 9443, "callback-tls", seen["callback_tls"], tls(CALLBACK, client_ca=ca)
        ),
    ]
    try:
        yield Servers(ca=ca, ca_pem=ca.cert_pem.bytes().decode(), seen=seen, client_bundle=bundle)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


class DnsWitness:
    """UDP 127.0.0.1:53 in the tier's namespace (its resolv.conf's nameserver): counts every
    query and answers NXDOMAIN, so a test proves which names were — and were not — looked up."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 53))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dns witness", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.queries.append(_qname(packet))
            if len(packet) >= 12:
                flags = bytes([packet[2] | 0x80, (packet[3] & 0xF0) | 0x03])  # QR, NXDOMAIN
                self._sock.sendto(packet[:2] + flags + packet[4:], peer)

    def seen(self) -> list[str]:
        with self._lock:
            return list(self.queries)

    def clear(self) -> None:
        with self._lock:
            self.queries.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def _qname(packet: bytes) -> str:
    labels: list[str] = []
    at = 12
    while at < len(packet) and packet[at]:
        size = packet[at]
        labels.append(packet[at + 1 : at + 1 + size].decode("ascii", "replace"))
        at += 1 + size
    return ".".join(labels)
