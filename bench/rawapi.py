"""A minimal Docker Engine API client on the standard library only: the benchmarks' floor.

``http.client.HTTPConnection`` over an ``AF_UNIX`` socket, one keep-alive connection reused for
every call (``http.client`` reconnects by itself when the daemon closes it). Blocking: trio code
calls it through ``trio.to_thread.run_sync``. It shares no code with sbxkit, so it is also the
independent witness the benchmarks use to look for leaked containers.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.parse
from typing import Any

RAW_API_VERSION = "1.41"
"""Docker 20.10, the oldest API sbxkit speaks and the one CI's daemon offers."""


class RawAPIError(Exception):
    """The daemon answered with an unexpected status."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        try:
            message = str(json.loads(body).get("message", ""))
        except (ValueError, AttributeError):
            message = body.decode("utf-8", "replace")
        super().__init__(f"{method} {path}: HTTP {status}: {message.strip()}")
        self.status = status


class UnixHTTPConnection(http.client.HTTPConnection):
    """``HTTPConnection`` whose ``connect`` opens a Unix socket; counts the sockets it opens."""

    def __init__(self, socket_path: str, *, timeout: float | None) -> None:
        super().__init__("docker", timeout=timeout)
        self.socket_path = socket_path
        self.connects = 0

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.connects += 1


_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class RawEngine:
    """Blocking Engine API calls on one keep-alive connection. Not for concurrent use."""

    def __init__(
        self, socket_path: str, *, api_version: str = RAW_API_VERSION, timeout: float = 60.0
    ) -> None:
        self.socket_path = socket_path
        self.api_version = api_version
        self._conn = UnixHTTPConnection(socket_path, timeout=timeout)
        self._begun: tuple[str, str] | None = None

    @property
    def connects(self) -> int:
        """Sockets opened so far (1 when keep-alive held for the whole run)."""
        return self._conn.connects

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        ok: tuple[int, ...] = (200, 201, 204),
    ) -> tuple[int, bytes]:
        """One request/response; the whole body is read so the connection can be reused.

        A reused connection the daemon closed while idle is retried once on a fresh socket: such
        a request never reached the daemon (and every non-idempotent call here carries a unique
        container name, so a duplicate could only be refused with 409, never run twice).
        """
        target = f"/v{self.api_version}{path}"
        headers = {"Content-Type": "application/json"} if body is not None else {}
        reused = self._conn.sock is not None
        try:
            status, data = self._exchange(method, target, body, headers)
        except _STALE:
            self._conn.close()
            if not reused:
                raise
            status, data = self._exchange(method, target, body, headers)
        if status not in ok:
            raise RawAPIError(method, target, status, data)
        return status, data

    def _exchange(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        try:
            self._conn.request(method, target, body=body, headers=headers)
            response = self._conn.getresponse()
            return response.status, response.read()
        except BaseException:
            self._conn.close()
            raise

    def begin(self, method: str, path: str, body: bytes | None = None) -> None:
        """Send a request whose answer ``finish`` reads later (the connection carries nothing
        else meanwhile; ``reset`` after a failure in between). Sent right after another call,
        on the socket that call kept alive."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            self._conn.request(method, f"/v{self.api_version}{path}", body=body, headers=headers)
        except BaseException:
            self._conn.close()
            raise
        self._begun = (method, path)

    def finish(self, *, ok: tuple[int, ...] = (200, 201, 204)) -> tuple[int, bytes]:
        """The answer to the request ``begin`` sent."""
        assert self._begun is not None
        method, path = self._begun
        self._begun = None
        try:
            response = self._conn.getresponse()
            status, data = response.status, response.read()
        except BaseException:
            self._conn.close()
            raise
        if status not in ok:
            raise RawAPIError(method, f"/v{self.api_version}{path}", status, data)
        return status, data

    @property
    def begun(self) -> bool:
        """A request ``begin`` sent still waits for ``finish``."""
        return self._begun is not None

    def reset(self) -> None:
        """Forget a request ``begin`` sent whose answer was not read: a fresh socket next."""
        if self._begun is not None:
            self._begun = None
            self._conn.close()

    def get_json(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        _, data = self.call("GET", path + query)
        return json.loads(data)

    def containers(self, label: str | None = None) -> list[dict[str, Any]]:
        """Every container, running or not, optionally filtered by a label (``key`` or ``k=v``)."""
        params = {"all": "1"}
        if label is not None:
            params["filters"] = json.dumps({"label": [label]})
        found: list[dict[str, Any]] = self.get_json("/containers/json", params)
        return found

    def remove(self, ref: str) -> bool:
        """``DELETE ?force=1&v=1`` by id or name; False if it was already gone."""
        status, _ = self.call(
            "DELETE", f"/containers/{urllib.parse.quote(ref)}?force=1&v=1", ok=(204, 404)
        )
        return status == 204

    def close(self) -> None:
        self._conn.close()


class EventWatch:
    """Collects daemon events live, on a dedicated connection, from a worker thread.

    Live because a ``since``/``until`` query only sees the daemon's last 256 events, fewer than
    one benchmark run produces. ``run`` blocks (call it in a thread); ``ready`` is set once the
    daemon sent the response head, i.e. the subscription is active; ``stop`` ends it.
    """

    def __init__(self, socket_path: str, filters: dict[str, list[str]]) -> None:
        self._conn = UnixHTTPConnection(socket_path, timeout=None)
        self._target = f"/v{RAW_API_VERSION}/events?" + urllib.parse.urlencode(
            {"filters": json.dumps(filters)}
        )
        self.ready = threading.Event()
        self.events: list[dict[str, Any]] = []
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._conn.request("GET", self._target)
            response = self._conn.getresponse()
            if response.status != 200:
                raise RawAPIError("GET", self._target, response.status, response.read())
            self.ready.set()
            while line := response.readline():
                if line.strip():
                    self.events.append(json.loads(line))
        except (OSError, ValueError, http.client.HTTPException, RawAPIError) as exc:
            if self.ready.is_set() and isinstance(exc, OSError | ValueError):
                return  # stop() shut the socket down under the read
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()
            self._conn.close()

    def stop(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
