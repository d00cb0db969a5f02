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
NAIVE_PORT = 8081  # on ALLOWED's address: the upstream that prefers Content-Length
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


class _Server6(_Server):
    address_family = socket.AF_INET6


class NaiveUpstream:
    """An upstream as lenient as many behind a CDN: it keeps reading requests on a connection
    whatever ``Connection`` says (until 1 s of silence), and frames a body by
    ``Content-Length`` when there is one, ``Transfer-Encoding: chunked`` only otherwise. A
    request that carries both is where it and a parser that prefers the coding part ways: the
    rest of the body becomes a request of its own here. Records (method, target, Host, body)."""

    IDLE_S = 1.0

    def __init__(self, address: str, port: int) -> None:
        self.requests: list[tuple[str, str, str, bytes]] = []
        self._lock = threading.Lock()
        self._sock = socket.create_server((address, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="naive upstream", daemon=True)
        self._thread.start()

    def seen(self) -> list[tuple[str, str, str, bytes]]:
        with self._lock:
            return list(self.requests)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            self._read_requests(connection)
        except ValueError:  # a length it cannot read: the connection ends
            connection.close()

    def _read_requests(self, connection: socket.socket) -> None:
        connection.settimeout(self.IDLE_S)
        buffer = b""

        def more() -> bool:
            nonlocal buffer
            try:
                data = connection.recv(65536)
            except OSError:
                return False
            buffer += data
            return bool(data)

        with connection:
            while True:
                buffer = buffer.lstrip(b"\r\n")  # RFC 9112 §2.2: empty lines before a request
                while b"\r\n\r\n" not in buffer:
                    if not more():
                        return
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                first, *lines = head.split(b"\r\n")
                parts = first.split(b" ")
                if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
                    return  # not a request: the connection ends
                headers = [line.partition(b":") for line in lines]
                fields = {name.strip().lower(): value.strip() for name, _, value in headers}
                if b"content-length" in fields:  # preferred: the lenient choice
                    size = int(fields[b"content-length"])
                    while len(buffer) < size:
                        if not more():
                            return
                    body, buffer = buffer[:size], buffer[size:]
                elif fields.get(b"transfer-encoding", b"").lower() == b"chunked":
                    body = b""
                    while True:
                        while b"\r\n" not in buffer:
                            if not more():
                                return
                        size_line, _, buffer = buffer.partition(b"\r\n")
                        size = int(size_line, 16)
                        while len(buffer) < size + 2:
                            if not more():
                                return
                        body, buffer = body + buffer[:size], buffer[size + 2 :]
                        if size == 0:
                            break
                else:
                    body = b""
                host = fields.get(b"host", b"").decode("latin-1")
                with self._lock:
                    self.requests.append(
                        (parts[0].decode(), parts[1].decode("latin-1"), host, body)
                    )
                reply = f"naive {host} {parts[1].decode('latin-1')}".encode()
                try:
                    connection.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(reply) + reply
                    )
                except OSError:
                    return


@dataclass
class Servers:
    """Every stand-in server, by the name a test uses, and the CA their certificates chain to."""

    ca: trustme.CA
    ca_pem: str
    seen: dict[str, Seen]
    client_bundle: dict[str, Path]
    """The callback's client TLS bundle (ca, cert, key files) for the https callback."""
    naive: NaiveUpstream
    """``ALLOWED:NAIVE_PORT``: the upstream a desync would split a request for."""

    def clear(self) -> None:
        for record in self.seen.values():
            record.clear()
        self.naive.clear()


def _serve(address: str, port: int, label: str, seen: Seen, tls: ssl.SSLContext | None) -> _Server:
    kind = _Server6 if ":" in address else _Server
    server = kind((address, port), _handler(label, seen))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name=f"upstream {label}", daemon=True).start()
    return server


@contextmanager
def running_servers(directory: Path) -> Iterator[Servers]:
    ca = trustme.CA()
    seen = {name: Seen() for name in ("a", "b", "literal", "callback", "callback_tls", "v6")}

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
        _serve("::1", 8080, "loopback-v6", seen["v6"], None),  # a host service on [::1]
        _serve(
            "127.0.0.1", 9443, "callback-tls", seen["callback_tls"], tls(CALLBACK, client_ca=ca)
        ),
    ]
    naive = NaiveUpstream("192.0.2.10", NAIVE_PORT)
    try:
        yield Servers(
            ca=ca,
            ca_pem=ca.cert_pem.bytes().decode(),
            seen=seen,
            client_bundle=bundle,
            naive=naive,
        )
    finally:
        naive.close()
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
