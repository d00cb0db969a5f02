"""Governed networking as a spec asks for it, and as its owner carries it out.

Pure. ``Network`` is the spec's (and a profile's ``[sandbox.docker.network]``) table::

    network = {allow = ["pypi.org:443", "*.pythonhosted.org:443"], callback = "http://localhost:8080"}

``mode = "none"`` (the default) keeps ``NetworkMode: none``: the sandbox has only loopback, and
sbxkit puts listeners on that loopback — an allow-list proxy on ``127.0.0.1:3128`` (``allow``)
and a forwarder to the callback endpoint (``callback``) — dialling every upstream from the
host after deciding on the name. ``mode = "managed"`` is the reference's managed bridge network
(it routes; production refuses it). ``check_network_spec`` validates a table before any
container exists; ``NetworkTerms`` is what a plan hands the lease's owner (the supervisor, or
the caller's ``InProcessOwner``): the parsed allow-list, the callback, the client TLS bundle's
bytes, the bounds, and where decisions are logged. ``network_env`` is the environment the
sandbox gets for them: owned keys no spec or profile value can override (docs/network.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Literal, NamedTuple

import msgspec

from sbxkit._model.network_allow import AllowEntry, entry_text, parse_allow_list
from sbxkit._model.network_inject import (
    BROKER_KEYS,
    InjectRule,
    InjectTerms,
    check_inject,
    inject_env,
)
from sbxkit._model.network_names import Destination, destination_text, parse_host, parse_port
from sbxkit._model.network_ports import PortForward, check_ports
from sbxkit._model.predicates import has_control
from sbxkit._model.units import parse_size
from sbxkit._util.public import publish
from sbxkit.errors import SpecError

__all__ = [
    "BROKER_TMPFS",
    "CALLBACK_ALIAS",
    "MANAGED_ALIASES",
    "OWNED_KEYS",
    "PROXY_KEYS",
    "PROXY_PORT",
    "TLS_DIR",
    "TLS_TMPFS",
    "CallbackTerms",
    "CallbackTls",
    "Network",
    "NetworkTerms",
    "PortForward",
    "TlsBundle",
    "check_network_spec",
    "is_callback_destination",
    "loopback_forwards",
    "network_env",
    "network_mode",
    "owned_keys",
    "parse_callback",
    "sbxkit_ports_inside",
    "spec_owned_keys",
    "unset_env",
]

PROXY_PORT = 3128
"""The allow-list proxy's port on the sandbox's own 127.0.0.1 (a namespace of its own, so a
fixed port collides with nothing)."""
TLS_DIR = "/run/sbxkit/tls"
TLS_MOUNT = "/run/sbxkit"
TLS_TMPFS = {TLS_MOUNT: "rw,nosuid,nodev,noexec,size=65536,mode=755"}
"""A tiny tmpfs owned by root: sbxkit writes the client TLS bundle into it before the payload
runs; the sandbox user reads it and cannot change what is in it."""
BROKER_TMPFS = {TLS_MOUNT: "rw,nosuid,nodev,noexec,size=1048576,mode=755"}
"""The same with inject rules: room for the trust bundle (the host's store and the broker CA)."""
CALLBACK_ALIAS = "host.sbxkit.internal"
MANAGED_ALIASES = ("host.docker.internal", CALLBACK_ALIAS)
MAX_TLS_FILE_BYTES = 64 * 1024
MAX_CONNECTIONS = 1024
MAX_CONNECTION_BYTES = 1024**4
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_MAX_CONNECTION_BYTES = 4 * 1024**3

PROXY_KEYS = tuple(
    key
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
    for key in (name, name.lower())
)
CALLBACK_KEYS = ("SBXKIT_ENDPOINT", "SBXKIT_TLS_CA", "SBXKIT_TLS_CERT", "SBXKIT_TLS_KEY")
OWNED_KEYS = PROXY_KEYS + CALLBACK_KEYS


class CallbackTls(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Host paths of the client TLS bundle an https callback needs (``cert`` and ``key``
    together, for a server that asks for a client certificate)."""

    ca: str
    cert: str | None = None
    key: str | None = None


class Network(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A governed network (``mode = "none"``) or the reference's managed one."""

    mode: Literal["none", "managed"] = "none"
    allow: list[str] = msgspec.field(default_factory=list)
    """``HOST[:PORT]`` entries (sbxkit/_model/network_allow.py); empty: no proxy at all."""
    callback: str | None = None
    """``http(s)://HOST:PORT``: a host endpoint the sandbox reaches as ``SBXKIT_ENDPOINT``."""
    tls: CallbackTls | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections the sandbox may hold open through its listeners at once."""
    max_connection_bytes: int | str = DEFAULT_MAX_CONNECTION_BYTES
    """Bytes one connection may carry (both directions together): a count or a size such as
    ``"4g"`` (sbxkit/_model/units.py)."""
    inject: list[InjectRule] = msgspec.field(default_factory=list)
    """Headers the proxy adds for one host each (sbxkit/_model/network_inject.py)."""
    ports: list[int | str] = msgspec.field(default_factory=list)
    """Inbound ports (sbxkit/_model/network_ports.py): ``8000``, ``"18000:8000"``,
    ``"127.0.0.1:18000:8000"``; the host reaches the sandbox's own ``127.0.0.1:PORT``."""
    ports_beyond_loopback: bool = False
    """Let a port's host address be other than loopback (refused in production)."""


class CallbackTerms(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    scheme: Literal["http", "https"]
    host: str
    port: int
    is_ip: bool = False

    @property
    def inside_host(self) -> str:
        """The name the sandbox uses: the endpoint's own (mapped to loopback in its
        ``/etc/hosts``, so an https certificate for it still matches), or ``127.0.0.1`` for an
        address."""
        return "127.0.0.1" if self.is_ip else self.host

    def url(self, host: str) -> str:
        return f"{self.scheme}://{host}:{self.port}"


class TlsBundle(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The bundle's bytes, read before any container exists (a bad file is refused then)."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None


class NetworkTerms(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """What the lease's owner needs to govern the sandbox's network."""

    mode: Literal["none", "managed"]
    allow: list[str]
    """Canonical allow entries (``entry_text``), parsed again where they are enforced."""
    callback: CallbackTerms | None = None
    tls: TlsBundle | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connection_bytes: int = DEFAULT_MAX_CONNECTION_BYTES
    audit_log: str | None = None
    gateway: str | None = None
    """Managed mode: the bridge gateway the callback forwarder listens on (native Linux)."""
    network_name: str | None = None
    """Managed mode: the Docker network the sandbox joins."""
    inject: list[InjectTerms] = msgspec.field(default_factory=list)
    """Inject rules with their values (network_inject.py): held by the proxying owner only."""
    ports: list[PortForward] = msgspec.field(default_factory=list)
    """Inbound ports as asked for (``host_port`` 0: a free one)."""

    @property
    def needs_governor(self) -> bool:
        """The owner has listeners to open (and files to write) before the payload runs: the
        sandbox starts parked and is claimed once they are in place."""
        return bool(self.allow) or self.callback is not None or bool(self.ports)

    @property
    def tmpfs(self) -> dict[str, str]:
        """The root-owned tmpfs the owner writes into, or none."""
        if self.inject:
            return BROKER_TMPFS
        return TLS_TMPFS if self.tls is not None else {}


def network_mode(network: object) -> str:
    """``none``, ``bridge`` or ``managed`` for a spec's ``network`` (a string or a table)."""
    if isinstance(network, Network):
        return network.mode
    return network if isinstance(network, str) else "?"


def parse_callback(url: object, field: str = "network.callback") -> CallbackTerms:
    """``http(s)://HOST:PORT`` (a trailing ``/`` is fine), or a SpecError naming the rule."""
    if not isinstance(url, str) or not url:
        raise SpecError(field, "must be a URL http(s)://HOST:PORT")
    if has_control(url) or any(ch.isspace() for ch in url):
        raise SpecError(field, "must not contain whitespace or control characters")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise SpecError(field, f"{url!r}: the scheme must be http or https")
    rest = rest.removesuffix("/")
    for bad, why in (("/", "a path"), ("@", "userinfo"), ("?", "a query"), ("#", "a fragment")):
        if bad in rest:
            raise SpecError(field, f"{url!r} has {why}; the endpoint is http(s)://HOST:PORT")
    if rest.startswith("["):
        host_text, _, port_part = rest[1:].partition("]")
        port_text = port_part.removeprefix(":") if port_part.startswith(":") else None
    else:
        host_text, colon, port_text_raw = rest.partition(":")
        port_text = port_text_raw if colon else None
    if port_text is None:
        raise SpecError(field, f"{url!r}: name the port (http(s)://HOST:PORT)")
    port = parse_port(port_text)
    if port is None:
        raise SpecError(field, f"{url!r}: the port must be a number from 1 to 65535")
    parsed = parse_host(host_text)
    if parsed is None:
        raise SpecError(field, f"{url!r}: {host_text!r} is neither a DNS name nor an IP literal")
    host, is_ip = parsed
    if port == PROXY_PORT:
        raise SpecError(
            field, f"port {PROXY_PORT} is the allow-list proxy's inside the sandbox; use another"
        )
    kind: Literal["http", "https"] = "https" if scheme.lower() == "https" else "http"
    return CallbackTerms(scheme=kind, host=host, port=port, is_ip=is_ip)


def _check_tls(network: Network, callback: CallbackTerms | None) -> None:
    tls = network.tls
    if tls is None:
        if callback is not None and callback.scheme == "https":
            raise SpecError(
                "network.tls",
                "an https callback needs the client TLS bundle (tls.ca, and tls.cert with "
                "tls.key for a client certificate)",
            )
        return
    if callback is None or callback.scheme != "https":
        raise SpecError(
            "network.tls",
            "TLS material is refused without an https callback: an http endpoint would not "
            "use it (the reference driver's rule)",
        )
    if (tls.cert is None) != (tls.key is None):
        raise SpecError("network.tls", "cert and key go together (a client certificate)")
    for name in ("ca", "cert", "key"):
        path = getattr(tls, name)
        if path is None:
            continue
        where = f"network.tls.{name}"
        if not isinstance(path, str) or not path.startswith("/"):
            raise SpecError(where, "must be an absolute host path")
        if has_control(path) or ".." in path.split("/"):
            raise SpecError(where, "must not contain control characters or '..'")


LOOPBACK_NAMES = ("localhost", "127.0.0.1")
"""What a client inside names the sandbox's own 127.0.0.1 by (``localhost`` is in the
``/etc/hosts`` Docker writes for a sandbox with a callback)."""


def is_callback_destination(callback: CallbackTerms | None, destination: Destination) -> bool:
    """Whether a proxy request for ``destination`` means the callback: a name or address that,
    dialled directly inside the sandbox, reaches the callback's forwarder (its
    ``127.0.0.1:PORT``, by ``$SBXKIT_ENDPOINT``'s host, ``localhost`` or ``127.0.0.1``)."""
    if callback is None or destination.port != callback.port:
        return False
    return destination.host in (callback.inside_host, *LOOPBACK_NAMES)


def _is_loopback(entry: AllowEntry) -> bool:
    return entry.kind == "ip" and ipaddress.ip_address(entry.host).is_loopback


def loopback_forwards(
    entries: Sequence[AllowEntry], callback: CallbackTerms | None = None
) -> list[tuple[int, str, int]]:
    """``(index, address, port)`` for each port of each loopback literal entry, once: served
    at that same address inside the sandbox, forwarded to the host's, because a client that
    honours ``NO_PROXY`` (or, like Go's, never proxies loopback) dials it there directly. One
    the callback's forwarder already serves (``127.0.0.1:PORT`` to the same address) is left
    to it."""
    found: list[tuple[int, str, int]] = []
    for index, entry in enumerate(entries):
        if not _is_loopback(entry):
            continue
        for port in entry.ports:
            taken = callback is not None and (entry.host, port) == ("127.0.0.1", callback.port)
            if not taken and all((entry.host, port) != (a, p) for _, a, p in found):
                found.append((index, entry.host, port))
    return found


def _check_loopback(entries: Sequence[AllowEntry], callback: CallbackTerms | None) -> None:
    """Refuse the loopback entries no client could use as written: a name for loopback (the
    proxy refuses what it resolves to, and inside it is the sandbox's own), and an address
    whose port inside is already the proxy's or the callback's."""
    for index, entry in enumerate(entries):
        field = f"network.allow[{index}]"
        text = entry_text(entry)
        if entry.kind != "ip" and (entry.host == "localhost" or entry.host.endswith(".localhost")):
            raise SpecError(
                field,
                f"{text!r}: localhost is the sandbox's own loopback inside it; to reach a "
                "service on the host's loopback, allow its address (127.0.0.1:PORT)",
            )
        if not _is_loopback(entry) or entry.host != "127.0.0.1":
            continue
        for port in entry.ports:
            if port == PROXY_PORT:
                raise SpecError(
                    field,
                    f"{text!r}: a loopback entry is served at the same address inside the "
                    f"sandbox, where 127.0.0.1:{PROXY_PORT} is the allow-list proxy's",
                )
            if callback is not None and port == callback.port and callback.host != entry.host:
                raise SpecError(
                    field,
                    f"{text!r}: a loopback entry is served at the same address inside the "
                    f"sandbox, where 127.0.0.1:{port} forwards to the callback "
                    f"{destination_text(Destination(callback.host, port, callback.is_ip))}; "
                    "use another port",
                )


class CheckedNetwork(NamedTuple):
    callback: CallbackTerms | None
    allow: list[str]
    """Canonical allow entries."""
    max_connection_bytes: int
    ports: list[PortForward] = []


def sbxkit_ports_inside(entries: Sequence[AllowEntry], callback: CallbackTerms | None) -> list[int]:
    """The ports of ``127.0.0.1`` inside the sandbox that sbxkit's own listeners take."""
    taken = [PROXY_PORT] if entries else []
    if callback is not None:
        taken.append(callback.port)
    taken += [
        port for _, address, port in loopback_forwards(entries, callback) if address == "127.0.0.1"
    ]
    return taken


def check_inbound_ports(
    network: Network, entries: Sequence[AllowEntry], callback: CallbackTerms | None
) -> list[PortForward]:
    """The network's inbound ports, checked (only under the governed mode)."""
    if not network.ports:
        if network.ports_beyond_loopback:
            raise SpecError(
                "network.ports_beyond_loopback", "is only meaningful with network.ports"
            )
        return []
    if network.mode != "none":
        raise SpecError(
            "network.ports",
            "inbound ports are forwarded into a governed sandbox's own loopback (mode = "
            "'none'); a managed network routes",
        )
    if not isinstance(network.ports, list):
        raise SpecError("network.ports", "must be a list")
    return check_ports(
        network.ports,
        beyond_loopback=network.ports_beyond_loopback is True,
        reserved=sbxkit_ports_inside(entries, callback),
    )


def check_network_spec(network: Network) -> CheckedNetwork:
    """Validate a network table; the parsed callback, allow entries and byte bound."""
    if network.mode not in ("none", "managed"):
        raise SpecError("network.mode", "must be 'none' (governed) or 'managed'")
    parsed = parse_allow_list(network.allow)
    entries = [entry_text(entry) for entry in parsed]
    if network.mode == "managed" and entries:
        raise SpecError(
            "network.allow",
            "a managed network routes: an allow-list there would not be enforced; use "
            "mode = 'none' for governed egress",
        )
    callback = None if network.callback is None else parse_callback(network.callback)
    _check_tls(network, callback)
    _check_loopback(parsed, callback)
    check_inject(network.inject, parsed, managed=network.mode == "managed")
    ports = check_inbound_ports(network, parsed, callback)
    size = network.max_connection_bytes
    if isinstance(size, str):
        size = parse_size(size, "network.max_connection_bytes")
    limits = (
        ("network.max_connections", network.max_connections, MAX_CONNECTIONS),
        ("network.max_connection_bytes", size, MAX_CONNECTION_BYTES),
    )
    for field, value, ceiling in limits:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
            raise SpecError(field, f"must be an integer from 1 to {ceiling}")
    return CheckedNetwork(callback, entries, size, ports)


def owned_keys(terms: NetworkTerms | None) -> frozenset[str]:
    """Keys no spec or profile value may set: the callback's always, the proxy's whenever
    sbxkit governs the sandbox's network."""
    broker = BROKER_KEYS if terms is not None and terms.inject else ()
    return frozenset((OWNED_KEYS if terms is not None else CALLBACK_KEYS) + broker)


def spec_owned_keys(network: object) -> frozenset[str]:
    """``owned_keys`` judged from a spec's ``network`` alone (before the plan has terms): what a
    pool's claim line must not export, as the create body does not carry it."""
    governed = network == "managed" or (
        isinstance(network, Network)
        and (
            bool(network.allow)
            or network.callback is not None
            or bool(network.ports)
            or network.mode == "managed"
        )
    )
    broker = BROKER_KEYS if isinstance(network, Network) and network.inject else ()
    return frozenset((OWNED_KEYS if governed else CALLBACK_KEYS) + broker)


def network_env(terms: NetworkTerms | None) -> dict[str, str]:
    """The variables sbxkit sets for ``terms`` (written last over every other layer)."""
    if terms is None:
        return {}
    env: dict[str, str] = {}
    no_proxy = ["localhost", "127.0.0.1", "::1"]
    callback = terms.callback
    if callback is not None:
        if terms.mode == "managed":
            env["SBXKIT_ENDPOINT"] = callback.url(CALLBACK_ALIAS)
        else:
            env["SBXKIT_ENDPOINT"] = callback.url(callback.inside_host)
            if callback.inside_host not in no_proxy:
                no_proxy.append(callback.inside_host)
        if terms.tls is not None:
            env["SBXKIT_TLS_CA"] = f"{TLS_DIR}/ca.pem"
            if terms.tls.cert is not None:
                env["SBXKIT_TLS_CERT"] = f"{TLS_DIR}/cert.pem"
                env["SBXKIT_TLS_KEY"] = f"{TLS_DIR}/key.pem"
    if terms.mode == "none" and terms.allow:
        proxy = f"http://127.0.0.1:{PROXY_PORT}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[name] = env[name.lower()] = proxy
        env["NO_PROXY"] = env["no_proxy"] = ",".join(no_proxy)
    env.update(inject_env(terms.inject))
    return env


def unset_env(terms: NetworkTerms | None, *, podman: bool = False) -> list[str]:
    """Create-body ``Env`` entries for the owned keys sbxkit does not set (after every other
    entry): without them an image's ``ENV`` for one (``SBXKIT_ENDPOINT``, a proxy) reached
    the payload. Docker unsets a key listed without ``=``: the image's value is dropped and
    the payload sees no such variable. Podman would look a bare key up in its own service's
    environment instead, so there it is listed empty (``KEY=``)."""
    given = network_env(terms)
    return sorted(f"{key}=" if podman else key for key in owned_keys(terms) if key not in given)


publish(__name__, globals())  # public names show as sbxkit.NAME
