"""A sandbox's network terms, decided before anything is created (the plan's I/O step).

``plan_network`` turns a checked spec's ``network`` into the ``NetworkTerms`` its owner
carries out, or None when there is nothing to govern (``none`` without listeners, ``bridge``).
It asks what only the world can answer, before any container exists: whether this host can
enter the daemon's sandboxes (refusals.py), the client TLS bundle's files (read here, so a
missing or odd file is refused naming ``network.tls.*``), and for ``managed`` the labelled,
attachable bridge network (created on first use; a 409 from a concurrent creator is fine; it
must be a bridge with an IPv4 gateway).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import platform
import stat
from functools import partial

import trio

from sbxkit._model.network_allow import parse_allow_list
from sbxkit._model.network_inject import (
    MAX_VALUE_BYTES,
    InjectTerms,
    check_inject,
    check_inject_value,
)
from sbxkit._model.network_terms import (
    MAX_TLS_FILE_BYTES,
    CallbackTls,
    Network,
    NetworkTerms,
    TlsBundle,
    check_network_spec,
)
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec
from sbxkit._util.bounded_read import read_bounded
from sbxkit.engine.client import Engine
from sbxkit.engine.networks import NetworkCreate, NetworkReply, network_create, network_inspect
from sbxkit.errors import Conflict, NotFound, SpecError
from sbxkit.network.netns import can_enter_namespaces
from sbxkit.network.refusals import desktop_kind, governed_refusal

__all__ = [
    "MANAGED_LABEL",
    "MANAGED_NETWORK",
    "broker_available",
    "managed_gateway_problem",
    "managed_network_problem",
    "plan_inject",
    "plan_network",
]

MANAGED_NETWORK = "sbxkit-managed"
MANAGED_LABEL = "sbxkit.network"


def managed_network_problem(reply: NetworkReply) -> str | None:
    """Why the network named ``MANAGED_NETWORK`` cannot be sbxkit's managed one (pure)."""
    if (reply.labels or {}).get(MANAGED_LABEL) != "managed":
        return f"a network named {MANAGED_NETWORK} exists without sbxkit's label; not using it"
    if reply.driver != "bridge":
        return f"{MANAGED_NETWORK} uses the {reply.driver!r} driver, not bridge"
    if reply.internal:
        return f"{MANAGED_NETWORK} is internal"
    if _gateway(reply) is None:
        return f"{MANAGED_NETWORK} has no IPv4 gateway"
    return None


def _gateway(reply: NetworkReply) -> str | None:
    for config in reply.ipam.config or []:
        try:
            address = ipaddress.ip_address(config.gateway.partition("/")[0])
        except ValueError:
            continue
        if address.version == 4:
            return str(address)
    return None


async def ensure_managed_network(engine: Engine) -> str:
    """The managed network's IPv4 gateway, the network created first if absent."""
    try:
        reply = await network_inspect(engine, MANAGED_NETWORK)
    except NotFound:
        body = NetworkCreate(
            name=MANAGED_NETWORK,
            driver="bridge",
            attachable=True,
            check_duplicate=True,
            labels={MANAGED_LABEL: "managed"},
        )
        with contextlib.suppress(Conflict):  # another caller created it meanwhile
            await network_create(engine, body)
        reply = await network_inspect(engine, MANAGED_NETWORK)
    problem = managed_network_problem(reply)
    if problem is not None:
        raise SpecError("network", problem)
    gateway = _gateway(reply)
    assert gateway is not None
    return gateway


async def managed_gateway_problem(engine: Engine, terms: NetworkTerms) -> str | None:
    """Why a registered managed network's terms are not the daemon's network (the supervisor's
    check: the callback forwarder listens on ``terms.gateway``, so it must be the bridge's)."""
    try:
        reply = await network_inspect(engine, terms.network_name or "")
    except NotFound:
        return f"no network named {terms.network_name!r}"
    problem = managed_network_problem(reply)
    if problem is None and terms.gateway is not None and terms.gateway != _gateway(reply):
        problem = f"{terms.gateway} is not the managed network's gateway"
    return problem


def _read_pem(path: str, field: str) -> bytes:
    return read_bounded(path, field=field, limit=MAX_TLS_FILE_BYTES)


async def read_tls_bundle(tls: CallbackTls) -> TlsBundle:
    """The bundle's files: regular, at most 64 KiB each, PEM."""
    found: dict[str, bytes] = {}
    for name in ("ca", "cert", "key"):
        path = getattr(tls, name)
        if path is None:
            continue
        field = f"network.tls.{name}"
        data = await trio.to_thread.run_sync(partial(_read_pem, path, field))
        if b"-----BEGIN " not in data:
            raise SpecError(field, f"{path} is not PEM (no '-----BEGIN ' line)")
        found[name] = data
    return TlsBundle(ca=found["ca"], cert=found.get("cert"), key=found.get("key"))


def _read_secret_file(path: str, field: str) -> str:
    """A 0600 regular file of this process's user, read without following a link."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise SpecError(field, f"file:{path}: cannot open it ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(field, f"file:{path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode != 0o600:
            raise SpecError(
                field,
                f"file:{path} has mode {mode:04o}; a secret file must be 0600 (read and "
                "written by its owner alone)",
            )
        if info.st_uid != os.geteuid():
            raise SpecError(
                field, f"file:{path} belongs to uid {info.st_uid}, not this process's user"
            )
        data = os.read(fd, MAX_VALUE_BYTES + 2)
    finally:
        os.close(fd)
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise SpecError(field, f"file:{path} holds non-ASCII bytes: not one header value") from None


def broker_available() -> bool:
    """Whether the optional ``cryptography`` package (``sbxkit[broker]``) is installed."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False
    return True


def plan_inject(network: Network) -> list[InjectTerms]:
    """The inject rules with their values, read on this host now (before any container
    exists): ``env:`` from this process's environment, ``file:`` from a 0600 file, ``ca_file``
    as PEM. Every refusal names ``network.inject[i]``."""
    if not network.inject:
        return []
    checked = check_inject(
        network.inject, parse_allow_list(network.allow), managed=network.mode == "managed"
    )
    if not broker_available():
        raise SpecError(
            "network.inject",
            "credential injection needs the 'cryptography' package to make the sandbox's CA: "
            "sbxkit's broker extra, pip install '.[broker]' in its clone",
        )
    terms: list[InjectTerms] = []
    for index, (rule, host, is_ip, (kind, source)) in enumerate(checked):
        field = f"network.inject[{index}].value_from"
        if kind == "env":
            raw = os.environ.get(source)
            if raw is None:
                raise SpecError(field, f"env:{source}: no such variable in this process")
            where = f"env:{source}"
        else:
            raw = _read_secret_file(source, field)
            where = f"file:{source}"
        value = check_inject_value(raw, field, where)
        ca = None
        if rule.ca_file is not None:
            ca_field = f"network.inject[{index}].ca_file"
            ca = _read_pem(rule.ca_file, ca_field)
            if b"-----BEGIN CERTIFICATE-----" not in ca:
                raise SpecError(ca_field, f"{rule.ca_file} holds no PEM certificate")
        terms.append(InjectTerms(host=host, is_ip=is_ip, header=rule.header, value=value, ca=ca))
    return terms


async def plan_network(
    engine: Engine, spec: SandboxSpec, settings: Settings
) -> NetworkTerms | None:
    """The terms the lease's owner carries out for ``spec``, or None (nothing to govern)."""
    network = spec.network
    if isinstance(network, str):
        if network != "managed":
            return None
        network = Network(mode="managed")
    callback, allow, max_connection_bytes, ports = check_network_spec(network)
    managed = network.mode == "managed"
    if not managed and not allow and callback is None and not ports:
        return None
    info = await engine.cached_info()
    desktop = desktop_kind(info.operating_system, info.name)
    enters = not managed or network.tls is not None
    if enters or (callback is not None and desktop is None):
        what = "a governed network" if not managed else "the managed network's callback"
        refusal = governed_refusal(
            operating_system=info.operating_system,
            name=info.name,
            kernel_version=info.kernel_version,
            security_options=info.security_options or [],
            local_kernel=platform.release(),
            podman=engine.is_podman,
            can_enter=can_enter_namespaces() if enters else True,
            what=what,
        )
        if refusal is not None:
            raise refusal
    inject = await trio.to_thread.run_sync(plan_inject, network)
    tls = None if network.tls is None else await read_tls_bundle(network.tls)
    gateway = network_name = None
    if managed:
        network_name = MANAGED_NETWORK
        found = await ensure_managed_network(engine)
        gateway = None if desktop is not None else found
    return NetworkTerms(
        mode=network.mode,
        allow=allow,
        callback=callback,
        tls=tls,
        max_connections=network.max_connections,
        max_connection_bytes=max_connection_bytes,
        audit_log=settings.network_audit_log,
        gateway=gateway,
        network_name=network_name,
        inject=inject,
        ports=ports,
    )
