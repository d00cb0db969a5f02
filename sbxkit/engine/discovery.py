"""Which socket is the Docker daemon: explicit path, then ``DOCKER_HOST``, then standard places.

The first candidate whose ``/_ping`` answers with an ``Api-Version`` header wins. A Podman
socket answers too; it is recognised by ``Libpod-Api-Version`` and reported as such, so the
caller can say which engine it is talking to.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import trio

from sbxkit.engine import answers
from sbxkit.engine.answers import PingResult as PingResult
from sbxkit.engine.transport import Transport
from sbxkit.errors import EngineUnavailable, SbxError

_API_VERSION = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})")  # ASCII digits only
STANDARD_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


def parse_api_version(text: str) -> tuple[int, int]:
    """``"1.41"`` → ``(1, 41)``; anything else is an unusable daemon."""
    match = _API_VERSION.fullmatch(text.strip())
    if match is None:
        raise EngineUnavailable("(negotiation)", f"unparseable Api-Version {text!r}")
    return int(match[1]), int(match[2])


def socket_from_docker_host(value: str) -> str:
    """The socket path in a ``DOCKER_HOST`` value; only ``unix://`` is supported."""
    if not value.startswith("unix://"):
        raise EngineUnavailable(
            value,
            "DOCKER_HOST must be a unix:// socket; tcp and ssh are "
            "not supported (sbxkit speaks only to a local socket)",
        )
    path = value.removeprefix("unix://")
    if not path.startswith("/"):
        raise EngineUnavailable(value, "DOCKER_HOST socket path must be absolute")
    return path


def candidate_sockets(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """Where to look, in order, when no path was given."""
    docker_host = environ.get("DOCKER_HOST", "").strip()
    if docker_host:
        return [socket_from_docker_host(docker_host)]
    candidates = list(STANDARD_SOCKETS)
    runtime_dir = environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        candidates.append(str(Path(runtime_dir) / "docker.sock"))
    home = environ.get("HOME")
    if home:
        candidates.append(str(Path(home) / ".docker" / "run" / "docker.sock"))
    return candidates


async def ping_socket(path: str, *, timeout: float) -> PingResult:
    """Ping one socket; raise EngineUnavailable saying why it is not a usable daemon."""
    if not await trio.Path(path).exists():
        raise EngineUnavailable(path, "no such socket")
    transport = Transport(path)
    try:
        response = await transport.request("GET", "/_ping", timeout=timeout)
    except EngineUnavailable:
        raise
    except SbxError as exc:
        raise EngineUnavailable(path, f"ping failed: {exc}") from exc
    finally:
        await transport.aclose()
    api_version = response.headers.get("api-version")
    if not api_version:
        raise EngineUnavailable(path, "answered /_ping without an Api-Version header")
    return PingResult(
        socket_path=path,
        api_version=api_version,
        os_type=response.headers.get("ostype", ""),
        podman_api_version=response.headers.get("libpod-api-version"),
    )


async def discover_socket(*, timeout: float, environ: dict[str, str] | None = None) -> PingResult:
    """The first answering candidate; the error lists every candidate and why it failed."""
    env = os.environ if environ is None else environ
    reasons: list[str] = []
    for path in candidate_sockets(env):
        try:
            return await ping_socket(path, timeout=timeout)
        except EngineUnavailable as exc:
            reasons.append(f"{path}: {exc.reason}")
    raise EngineUnavailable("(discovery)", "no Docker engine answered: " + "; ".join(reasons))


async def answering_socket(
    socket_path: str | None, *, timeout: float, environ: dict[str, str] | None = None
) -> PingResult:
    """The daemon an engine is opened on: ``socket_path`` pinged, else the first answering
    candidate — or the same question's answer of the last ``answers.RECENT_PING_S`` seconds,
    while its socket is the same file (``answers``: a restarted daemon is asked again)."""
    env = os.environ if environ is None else environ
    question = (socket_path,) if socket_path is not None else tuple(candidate_sockets(env))
    known = answers.recent(question)
    if known is not None:
        return known
    if socket_path is not None:
        ping = await ping_socket(socket_path, timeout=timeout)
    else:
        ping = await discover_socket(timeout=timeout, environ=environ)
    answers.remember(question, ping)
    return ping
