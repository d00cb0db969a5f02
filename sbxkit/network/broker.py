"""The credential broker's keys and TLS contexts: what lets the proxy add a header to HTTPS.

For a sandbox with inject rules (sbxkit/_model/network_inject.py) its owner — the process that
runs the proxy, and only it — makes a CA of the sandbox's own when it installs the listeners:
an EC P-256 key that never leaves this process's memory, and a certificate limited by name
constraints to the rules' hosts, which the sandbox trusts (the certificate alone is written
into it). For a CONNECT to a rule's host the proxy terminates the payload's TLS with a leaf
for that host signed by this CA, and opens TLS of its own to the upstream, verifying its real
certificate against the host's trust store or the rule's CA. Every other destination stays an
opaque tunnel (proxy.py).

``cryptography`` is an optional dependency (``sbxkit[broker]``): imported only here, only when
a sandbox has rules (the planner refuses rules by name when it is missing).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence

from sbxkit._model.network_inject import InjectTerms

__all__ = ["Broker", "inject_headers", "trust_bundle"]

CA_DAYS = 30
MAX_TRUST_STORE_BYTES = 900 * 1024
"""The host's store in the sandbox's bundle (Debian's is ~210 KiB); the tmpfs holds 1 MiB."""


def inject_headers(
    headers: Sequence[tuple[bytes, bytes]], rule: InjectTerms
) -> list[tuple[bytes, bytes]]:
    """``headers`` without any of the rule's header name (whatever case the payload sent it
    in) and with the rule's value: replaced, never forwarded beside it."""
    name = rule.header.encode("ascii")
    kept = [(key, value) for key, value in headers if key.lower() != name.lower()]
    return [*kept, (name, rule.value.encode("ascii"))]


def trust_bundle(ca_pem: bytes) -> bytes:
    """The host's trust store (the certificates this host's OpenSSL trusts by default) followed
    by the broker CA: what ``SSL_CERT_FILE`` and its kin point at, so a client trusts the
    broker for the rules' hosts and every other destination as before."""
    store = b""
    paths = ssl.get_default_verify_paths()
    for path in (paths.cafile, paths.openssl_cafile):
        if path and os.path.isfile(path):
            with open(path, "rb") as handle:
                store = handle.read(MAX_TRUST_STORE_BYTES + 1)
            if len(store) > MAX_TRUST_STORE_BYTES:
                store = b""  # an odd store: the broker CA alone is still correct for the rules
            break
    if store and not store.endswith(b"\n"):
        store += b"\n"
    return store + ca_pem


def _load_chain(context: ssl.SSLContext, pem: bytes) -> None:
    """``load_cert_chain`` from memory: an anonymous memfd, never a file on a disk."""
    fd = os.memfd_create("sbxkit-broker", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


class Broker:
    """One sandbox's broker CA, its leaves, and its rules by host."""

    def __init__(self, lease: str, rules: Sequence[InjectTerms]) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.rules = {rule.host: rule for rule in rules}
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sbxkit broker {lease[:12]}")])
        permitted: list[x509.GeneralName] = []
        for rule in rules:
            if rule.is_ip:
                permitted.append(x509.IPAddress(ipaddress.ip_network(rule.host)))
            else:
                permitted.append(x509.DNSName(rule.host))
        public = self._key.public_key()
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            # The CA can vouch for the rules' hosts and nothing else, for a client that
            # checks (OpenSSL, Go, Node do).
            .add_extension(x509.NameConstraints(permitted, None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self._servers: dict[str, ssl.SSLContext] = {}
        self._clients: dict[str, ssl.SSLContext] = {}

    def rule_for(self, host: str) -> InjectTerms | None:
        return self.rules.get(host)

    def server_context(self, host: str) -> ssl.SSLContext:
        """What the payload's TLS ends at for ``host``: a leaf for it alone, signed here."""
        context = self._servers.get(host)
        if context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])
            _load_chain(context, self._leaf(host))
            self._servers[host] = context
        return context

    def client_context(self, rule: InjectTerms) -> ssl.SSLContext:
        """What verifies the upstream: the host's trust store, or the rule's CA."""
        context = self._clients.get(rule.host)
        if context is None:
            if rule.ca is not None:
                context = ssl.create_default_context(cadata=rule.ca.decode("ascii", "replace"))
            else:
                context = ssl.create_default_context()
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])
            self._clients[rule.host] = context
        return context

    def _leaf(self, host: str) -> bytes:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        rule = self.rules[host]
        alt: x509.GeneralName = (
            x509.IPAddress(ipaddress.ip_address(host)) if rule.is_ip else x509.DNSName(host)
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        private: bytes = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return cert.public_bytes(serialization.Encoding.PEM) + private
