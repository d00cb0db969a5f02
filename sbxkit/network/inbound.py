"""Inbound ports: the host's listener, who may use it, and the way into the sandbox.

For each of a governed sandbox's ``ports`` the lease's owner listens on the host (its own
network namespace; ``127.0.0.1`` unless the spec asked for more) and, for each connection from
the owner's own account, opens a socket *in the sandbox's network namespace* (netns.py: a
fresh thread enters it by the init's pidfd, makes the socket, leaves) and connects it to the
sandbox's ``127.0.0.1:PORT``: the payload's server is reached on its own loopback, with no
route and no bridge, so this works under ``NetworkMode: none``.

Who may connect: a port on the host's loopback is reachable by every local account, and a
local account is not a credential. TCP has no ``SO_PEERCRED``, but both ends of a loopback
connection are sockets of this kernel, listed in ``/proc/net/tcp{,6}`` with the uid that made
them and their inode: the owner finds the peer's end (its local address is our remote one and
the other way round) and forwards only when that socket is still open (inode not 0: a closed
or TIME_WAIT end is listed as uid 0) and was made by the owner's uid. Anything else — another
account, a peer it cannot find (a remote client, another namespace), a closed one — is closed
before a byte reaches the sandbox, and the refusal is an audit decision (docs/network.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import sys
from typing import NamedTuple

import trio

from sbxkit._model.network_ports import PortForward
from sbxkit.errors import NetworkUnavailable
from sbxkit.network.netns import SandboxProcess, socket_in_sandbox
from sbxkit.network.proxy import ProxyContext
from sbxkit.network.relay import CONNECT_TIMEOUT_S, splice

__all__ = [
    "PeerSocket",
    "find_peer",
    "inbound_connection",
    "listen_on_host",
    "peer_problem",
    "peer_socket",
]

PROC_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN_BACKLOG = 128


class PeerSocket(NamedTuple):
    uid: int
    inode: int


Endpoint = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


def _endpoint(text: str) -> Endpoint:
    """``0100007F:1F90``: the address in the kernel's words (host byte order), the port hex."""
    address, _, port = text.partition(":")
    words = [bytes.fromhex(address[i : i + 8]) for i in range(0, len(address), 8)]
    if sys.byteorder == "little":
        words = [word[::-1] for word in words]
    ip = ipaddress.ip_address(b"".join(words))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(port, 16)


def _normal(host: str, port: int) -> Endpoint:
    ip = ipaddress.ip_address(host.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, port


def find_peer(table: str, peer: Endpoint, ours: Endpoint) -> PeerSocket | None:
    """The row of ``/proc/net/tcp{,6}`` (its text) whose local end is ``peer`` and remote end
    ``ours``: the peer's socket, its uid and inode (pure)."""
    for row in table.splitlines()[1:]:
        fields = row.split()
        if len(fields) < 10:
            continue
        try:
            if _endpoint(fields[1]) == peer and _endpoint(fields[2]) == ours:
                return PeerSocket(uid=int(fields[7]), inode=int(fields[9]))
        except ValueError:
            continue
    return None


def peer_problem(found: PeerSocket | None, owner_uid: int) -> str | None:
    """Why a connection's peer may not use the port (pure); None for the owner's own."""
    if found is None:
        return "the peer is not a socket of this host's namespace (no local account to check)"
    if found.inode == 0:
        return "the peer's socket is closed (its account can no longer be told)"
    if found.uid != owner_uid:
        return (
            f"the peer is uid {found.uid}, not the sandbox owner's uid {owner_uid} "
            "(a local account is not a credential)"
        )
    return None


def _read_peer(peer: Endpoint, ours: Endpoint) -> PeerSocket | None:
    for path in PROC_TABLES:
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                found = find_peer(handle.read(), peer, ours)
        except OSError:
            continue
        if found is not None:
            return found
    return None


def peer_socket(peer: tuple[str, int], ours: tuple[str, int]) -> PeerSocket | None:
    """The socket of this host whose local end is ``peer`` (host, port) and remote end ``ours``,
    from ``/proc/net/tcp{,6}`` (None if neither lists it). Blocking: a file read."""
    return _read_peer(_normal(*peer[:2]), _normal(*ours[:2]))


def listen_on_host(port: PortForward) -> tuple[socket.socket, PortForward]:
    """The host's listener for ``port`` (a free port for ``host_port`` 0) and the port as
    bound. No ``SO_REUSEPORT``: a named port somebody else listens on is refused, not shared."""
    family = socket.AF_INET6 if ":" in port.address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((port.address, port.host_port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise NetworkUnavailable(
            f"cannot listen on the host's {port.url_host}:{port.host_port} for the sandbox's "
            f"port {port.sandbox_port}: {exc.strerror or exc}"
        ) from exc
    bound = sock.getsockname()[1]
    return sock, PortForward(address=port.address, host_port=bound, sandbox_port=port.sandbox_port)


async def inbound_connection(
    ctx: ProxyContext,
    stream: trio.SocketStream,
    *,
    process: SandboxProcess,
    port: PortForward,
    owner_uid: int,
) -> None:
    """One host connection to ``port``: the peer checked, then spliced to the sandbox's own
    ``127.0.0.1:sandbox_port`` within the sandbox's connection and byte bounds."""
    where = f"127.0.0.1:{port.sandbox_port}"
    async with stream:
        remote = stream.socket.getpeername()
        peer = _normal(remote[0], remote[1])
        ours = _normal(*stream.socket.getsockname()[:2])
        found = await trio.to_thread.run_sync(_read_peer, peer, ours)
        problem = peer_problem(found, owner_uid)
        if problem is not None:
            ctx.decide(where, "inbound", verdict="denied", reason=problem, address=str(peer[0]))
            return
        if ctx.active >= ctx.max_connections:
            reason = f"the sandbox holds {ctx.max_connections} connections already"
            ctx.decide(where, "inbound", verdict="denied", reason=reason, address=str(peer[0]))
            return
        ctx.active += 1
        try:
            await _into_sandbox(ctx, stream, process, port, where, peer)
        finally:
            ctx.active -= 1


async def _into_sandbox(
    ctx: ProxyContext,
    stream: trio.SocketStream,
    process: SandboxProcess,
    port: PortForward,
    where: str,
    peer: Endpoint,
) -> None:
    try:
        inside = trio.socket.from_stdlib_socket(await socket_in_sandbox(process, socket.AF_INET))
    except NetworkUnavailable as exc:
        ctx.decide(where, "inbound", verdict="denied", reason=str(exc), address=str(peer[0]))
        return
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            await inside.connect(("127.0.0.1", port.sandbox_port))
    except (OSError, trio.TooSlowError) as exc:
        inside.close()
        # allowed, and nothing was there: the audit log says so; not a denial of the run's
        reason = f"nothing answers inside the sandbox: {exc}"
        ctx.decide(where, "inbound", verdict="allowed", reason=reason, address=str(peer[0]))
        return
    counts = [0, 0]
    within = True
    async with trio.SocketStream(inside) as upstream:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            within = await splice(stream, upstream, ctx.max_connection_bytes, counts)
    ctx.allowed(where, "inbound", peer[0], counts, within)
