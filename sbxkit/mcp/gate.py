"""The door of ``sbxkit mcp --http``: every request is authenticated here, before the SDK sees
it, and leaves with the identity its calls will act as.

- **Authentication.** A request needs ``Authorization: Bearer TOKEN`` with a token of this
  server (``sbxkit.mcp.tokens``). Anything else is answered ``401`` with ``WWW-Authenticate:
  Bearer`` and ``Connection: close``, and logged — the peer, its local account when the kernel
  says (``/proc/net/tcp``), and why; never the token — at most ``LOG_BURST`` lines per
  ``LOG_WINDOW_S`` (a flood is counted, not echoed).
- **Identity.** The client is the token's name. The SDK binds each session it issues to the
  credential that opened it (it answers ``404`` to a session id it never issued or issued to
  another token), and a request of the 2026-07-28 protocol, which has no sessions, may not carry
  one at all (``400``). So a call's ``Caller`` (``sbxkit.mcp.hub``) is the token's account and,
  over the 2025-11-25 protocol, the session the server issued — never a value the client made
  up.
- **Ending a session.** A ``DELETE`` the SDK answers 2xx ended a session of this credential:
  its sandboxes are removed before the answer's last byte goes out.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.authentication import AuthCredentials

from sbxkit.mcp.hub import Caller
from sbxkit.mcp.server import CALLER_SCOPE_KEY
from sbxkit.mcp.tokens import Credentials
from sbxkit.network.inbound import peer_socket

logger = logging.getLogger("sbxkit.mcp")

REALM = 'Bearer realm="sbxkit mcp"'
LOG_BURST = 10
LOG_WINDOW_S = 10.0
AUTHORIZATION = b"authorization"
SESSION = MCP_SESSION_ID_HEADER.encode("ascii")
PROTOCOL_VERSION = MCP_PROTOCOL_VERSION_HEADER.encode("ascii")


def http_account(name: str) -> str:
    return f"http:{name}"


def session_owner(name: str, session_id: str) -> str:
    return f"http:{name}:session:{session_id}"


class RateLimitedLog:
    """At most ``burst`` warnings per ``window`` seconds; the rest are counted, and the count
    is said with the next line that is logged. ``warning`` takes a function that makes the
    message, so a line that is not logged costs nothing to make."""

    def __init__(
        self,
        burst: int = LOG_BURST,
        window: float = LOG_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.window = window
        self.clock = clock
        self._started = -window
        self._logged = 0
        self._held_back = 0

    def warning(self, message: Callable[[], str]) -> None:
        now = self.clock()
        if now - self._started >= self.window:
            self._started, self._logged = now, 0
        if self._logged >= self.burst:
            self._held_back += 1
            return
        self._logged += 1
        text = message()
        if self._held_back:
            text += f" (and {self._held_back} more not shown)"
            self._held_back = 0
        logger.warning("%s", text)


def peer_uid(client: tuple[str, int] | None, server: tuple[str, int] | None) -> int | None:
    """The local account behind a loopback TCP peer: the owner of the socket whose local end is
    ``client`` and remote end ``server``, as /proc/net/tcp{,6} lists it. None if not found, or
    if that socket is closed: a closed or TIME_WAIT end is listed as uid 0, which is nobody's
    account here (network/inbound.py reads the table for the forwarded ports the same way)."""
    if client is None or server is None:
        return None
    try:
        found = peer_socket(client, server)
    except ValueError:
        return None
    return found.uid if found is not None and found.inode != 0 else None


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key.lower() == name]


def modern_route(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the SDK serves this request as the 2026-07-28 protocol (no initialize, no
    session): the rule of its session manager — a protocol version header that is not one of
    the handshake era's."""
    versions = _header(headers, PROTOCOL_VERSION)
    return bool(versions) and versions[0].decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS


async def respond(
    send: Any, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A JSON-RPC error (no id) with an HTTP status, and the connection closed after it."""
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Gate:
    """ASGI: see the module doc. ``app`` is the SDK's streamable HTTP app; ``close_client``
    removes a caller's sandboxes (the hub's, through the portal)."""

    def __init__(
        self,
        app: Any,
        credentials: Credentials,
        close_client: Callable[[Caller], Any],
        log: RateLimitedLog | None = None,
    ) -> None:
        self.app = app
        self.credentials = credentials
        self.close_client = close_client
        self.log = log or RateLimitedLog()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "lifespan":
            await self.app(scope, receive, send)  # the hub's start and stop
            return
        if scope.get("type") != "http":  # never served (uvicorn's ws="none"): refused
            if scope.get("type") == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        authorization = _header(headers, AUTHORIZATION)
        if len(authorization) > 1:
            name, why = None, "several Authorization headers"
        else:
            name, why = self.credentials.verify(authorization[0] if authorization else None)
        if name is None:
            await self._unauthorized(scope, send, why)
            return
        sessions = _header(headers, SESSION)
        if len(sessions) > 1:
            await respond(send, 400, "Mcp-Session-Id appears more than once")
            return
        session = sessions[0].decode("latin-1") if sessions else None
        modern = modern_route(headers)
        if modern and session is not None:
            self.log.warning(
                lambda: (
                    f"refused {_request(scope)} from {_peer(scope)} (client {name}): an "
                    "Mcp-Session-Id on a 2026-07-28 request, which has no sessions"
                )
            )
            await respond(
                send,
                400,
                "Mcp-Session-Id: the 2026-07-28 protocol has no sessions; this server issued "
                "none to this request",
            )
            return
        account = http_account(name)
        caller = Caller(account, account if session is None else session_owner(name, session))
        # The SDK binds each session to the credential that opened it (and refuses it to any
        # other) when the request carries an authenticated user.
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=name, scopes=[]))
        scope["auth"] = AuthCredentials([])
        scope[CALLER_SCOPE_KEY] = caller
        if scope.get("method") != "DELETE" or session is None:
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def watch(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, watch)
        if status and 200 <= status[0] < 300:
            await self.close_client(caller)

    async def _unauthorized(self, scope: Any, send: Any, why: str) -> None:
        self.log.warning(
            lambda: f"refused {_request(scope)} from {_peer(scope, with_account=True)}: {why}"
        )
        challenge = REALM if why == "no Authorization header" else REALM + ', error="invalid_token"'
        await respond(
            send,
            401,
            f"unauthorized ({why}): this server needs Authorization: Bearer <token> "
            "(sbxkit mcp prints where its token is; docs/mcp.md)",
            [(b"www-authenticate", challenge.encode())],
        )


def _request(scope: Any) -> str:
    return f"{scope.get('method')} {scope.get('path')}"


def _peer(scope: Any, *, with_account: bool = False) -> str:
    client = scope.get("client")
    if not client:
        return "an unknown peer"
    host, port = client[0], client[1]
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if with_account:
        uid = peer_uid(tuple(client), tuple(scope.get("server") or ()) or None)
        if uid is not None:
            shown += f" (uid {uid})"
    return shown
