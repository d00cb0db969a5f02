"""One sandbox's governed network, run by the lease's owner for as long as the lease lives.

``Governor.run`` is what the owner (the supervisor for supervised leases, the caller for an
``InProcessOwner``) starts once the sandbox's container started and before its payload runs:
it enters the sandbox (netns.py) to bind the allow-list proxy on ``127.0.0.1:3128``, the
callback forwarder on the callback's port and a forwarder for each loopback allow entry at its
own address (a client that honours ``NO_PROXY`` dials it there), maps the callback's name to
loopback in the sandbox's ``/etc/hosts``, writes the client TLS bundle, and then serves those
listeners (proxy.py) until the owner closes it — when the lease ends. The sockets are the
owner's: if the owner dies, the kernel closes them and egress fails closed (the sandbox is left
with a loopback nothing listens on). Under the managed network the callback forwarder listens
on the bridge's gateway instead, in the owner's own namespace.

Each decision goes to the operator's audit log (one JSON line, appended; not fsync'd) and
denials are kept for the run's ``RunResult``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from functools import partial

import trio

from sbxkit._model.network_allow import parse_allow_list
from sbxkit._model.network_audit import Decision, Denial, Denials, encode_decision
from sbxkit._model.network_ports import PortForward
from sbxkit._model.network_terms import PROXY_PORT, NetworkTerms, loopback_forwards
from sbxkit.engine.client import Engine
from sbxkit.errors import NetworkUnavailable
from sbxkit.network.broker import Broker, trust_bundle
from sbxkit.network.inbound import inbound_connection, listen_on_host
from sbxkit.network.netns import (
    SandboxProcess,
    add_hosts_entries,
    bind_in_sandbox,
    open_sandbox_process,
    write_broker_files,
    write_tls_bundle,
)
from sbxkit.network.proxy import (
    Handler,
    ProxyContext,
    Resolver,
    forward_connection,
    proxy_connection,
    serve_listener,
    system_resolver,
)

__all__ = ["Governor"]


class Governor:
    """The listeners, proxy and decisions of one governed sandbox."""

    def __init__(
        self,
        lease: str,
        terms: NetworkTerms,
        *,
        user: tuple[int, int],
        resolver: Resolver = system_resolver,
    ) -> None:
        self.lease = lease
        self.terms = terms
        self.user = user
        self.denials = Denials()
        self.errors: list[str] = []
        self._audit_fd: int | None = None
        self._scope = trio.CancelScope()
        self._process: SandboxProcess | None = None
        self.ports: list[PortForward] = []
        """The inbound ports as bound (their host ports), once installed."""
        self.context = ProxyContext(
            lease=lease,
            entries=parse_allow_list(terms.allow),
            record=self._record,
            max_connections=terms.max_connections,
            max_connection_bytes=terms.max_connection_bytes,
            resolver=resolver,
            callback=terms.callback if terms.mode == "none" else None,
        )

    def _record(self, decision: Decision) -> None:
        if decision.verdict == "denied":
            self.denials.add(decision.denial())
        if self._audit_fd is not None:
            try:
                os.write(self._audit_fd, encode_decision(decision))
            except OSError as exc:
                self.errors.append(f"audit log: {exc}")

    def denied(self) -> tuple[tuple[Denial, ...], int]:
        """The denials so far (the first ones) and how many more were only counted."""
        return tuple(self.denials.kept), self.denials.dropped

    def close(self) -> None:
        """Stop serving: the listeners close and every connection through them ends."""
        self._scope.cancel()

    def _open_audit(self) -> None:
        path = self.terms.audit_log
        if path is None:
            return
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self._audit_fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise NetworkUnavailable(f"cannot open the audit log {path}: {exc}") from exc

    async def _install(
        self, engine: Engine, container_id: str
    ) -> list[tuple[socket.socket, Handler]]:
        terms, callback = self.terms, self.terms.callback
        served: list[tuple[socket.socket, Handler]] = []
        self._open_audit()
        process: SandboxProcess | None = None
        try:
            if terms.mode == "none" or terms.tls is not None or terms.inject:
                process = await open_sandbox_process(engine, container_id)
            if terms.mode == "none":
                assert process is not None
                addresses = []
                if terms.allow:
                    addresses.append(("127.0.0.1", PROXY_PORT))
                if callback is not None:
                    addresses.append(("127.0.0.1", callback.port))
                loopback = loopback_forwards(self.context.entries, callback)
                addresses += [(address, port) for _, address, port in loopback]
                sockets = await bind_in_sandbox(process, addresses)
                handlers: list[Handler] = []
                if terms.allow:
                    handlers.append(partial(proxy_connection, self.context))
                if callback is not None:
                    handlers.append(
                        partial(
                            forward_connection, self.context, host=callback.host, port=callback.port
                        )
                    )
                handlers += [
                    partial(
                        forward_connection,
                        self.context,
                        host=address,
                        port=port,
                        kind="connect",
                        rule=terms.allow[index],
                    )
                    for index, address, port in loopback
                ]
                served = list(zip(sockets, handlers, strict=True))
                if callback is not None and not callback.is_ip:
                    await add_hosts_entries(process, [callback.host])
            elif callback is not None and terms.gateway is not None:
                served = [
                    (
                        _listen_on(terms.gateway, callback.port),
                        partial(
                            forward_connection, self.context, host=callback.host, port=callback.port
                        ),
                    )
                ]
            if terms.tls is not None:
                assert process is not None
                await write_tls_bundle(process, terms.tls, *self.user)
            if terms.inject:
                assert process is not None
                # The CA is made here, in the process that proxies, and its key stays here: the
                # sandbox gets the certificate (and a bundle of it with the host's store).
                broker = await trio.to_thread.run_sync(Broker, self.lease, terms.inject)
                bundle = await trio.to_thread.run_sync(trust_bundle, broker.ca_pem)
                files = [("ca.pem", broker.ca_pem), ("bundle.pem", bundle)]
                await write_broker_files(process, files, *self.user)
                self.context.broker = broker
            if terms.ports:
                assert process is not None
                served += self._inbound(process)
                self._process, process = process, None  # held while the ports serve
        except BaseException:
            for sock, _ in served:
                sock.close()
            self._close_audit()
            raise
        finally:
            if process is not None:
                process.close()
        return served

    def _inbound(self, process: SandboxProcess) -> list[tuple[socket.socket, Handler]]:
        """The host's listeners for the inbound ports, each forwarding into the sandbox for
        connections of the owner's own account (inbound.py)."""
        served: list[tuple[socket.socket, Handler]] = []
        bound: list[PortForward] = []
        try:
            for asked in self.terms.ports:
                sock, port = listen_on_host(asked)
                served.append(
                    (
                        sock,
                        partial(
                            inbound_connection,
                            self.context,
                            process=process,
                            port=port,
                            owner_uid=os.geteuid(),
                        ),
                    )
                )
                bound.append(port)
        except BaseException:
            for sock, _ in served:
                sock.close()
            raise
        self.ports = bound
        return served

    def _close_audit(self) -> None:
        if self._audit_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._audit_fd)
            self._audit_fd = None

    async def run(
        self,
        engine: Engine,
        container_id: str,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Install, report started, serve until ``close``. An install failure is raised (the
        payload must not run); after that nothing is: a failure is noted in ``errors``."""
        with self._scope:
            served = await self._install(engine, container_id)
            try:
                task_status.started()
                async with trio.open_nursery() as nursery:
                    for sock, handler in served:
                        nursery.start_soon(serve_listener, sock, handler, self.errors)
            except Exception as exc:  # after started, the owner's nursery must not see it
                self.errors.append(repr(exc))
            finally:
                for sock, _ in served:
                    sock.close()
                if self._process is not None:
                    self._process.close()
                    self._process = None
                self._close_audit()


def _listen_on(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Two managed sandboxes with one callback share the gateway's port (reachable, as the
        # reference's gateway binding is, from every container on the network).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise NetworkUnavailable(f"cannot listen on the gateway {host}:{port}: {exc}") from exc
    return sock
