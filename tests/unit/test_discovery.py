"""Which socket is the daemon, and which API version to speak with it.

Real Unix sockets in tmp dirs: a fake Docker (or Podman) ``/_ping`` responder answers with the
headers a test needs, a dead socket file is bound and closed, a plain file is just a file. No
real daemon in this tier; tests/engine/ checks the real one.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

import sbxkit.engine.discovery as discovery
from sbxkit.engine import answers
from sbxkit.engine.client import NEWEST_API, OLDEST_API, connect, negotiate
from sbxkit.engine.discovery import (
    STANDARD_SOCKETS,
    PingResult,
    candidate_sockets,
    discover_socket,
    parse_api_version,
    ping_socket,
    socket_from_docker_host,
)
from sbxkit.errors import EngineUnavailable
from tests.unit.unix_server import answer_heads, response, unix_server

DOCKER_HEADERS = {"Api-Version": "1.41", "Ostype": "linux", "Server": "Docker/20.10.24 (linux)"}
PODMAN_HEADERS = {
    "Api-Version": "1.41",
    "Libpod-Api-Version": "4.9.0",
    "Ostype": "linux",
    "Server": "Libpod/4.9.0 (linux)",
}


class FakeDaemon:
    """Answers every request with ``status`` and ``headers`` (``OK`` for ``/_ping``, else
    ``{}``)."""

    def __init__(self, path: str, headers: dict[str, str], status: int = 200) -> None:
        self.path = path
        self.headers = headers
        self.status = status
        self.stall = False
        self.requests: list[bytes] = []

    async def handle(self, stream: trio.SocketStream) -> None:
        await answer_heads(stream, self.answer)

    async def answer(self, head: bytes) -> bytes:
        self.requests.append(head)
        if self.stall:
            await trio.sleep_forever()
        body = b"OK" if b" /_ping " in head.split(b"\r\n")[0] else b"{}"
        return response(f"{self.status} X", body, self.headers)


@asynccontextmanager
async def fake_daemon(
    path: Path, headers: dict[str, str], status: int = 200
) -> AsyncIterator[FakeDaemon]:
    daemon = FakeDaemon(str(path), headers, status)
    async with unix_server(str(path), daemon.handle):
        yield daemon


def dead_socket(path: Path) -> Path:
    """A socket file nobody listens on any more (a crashed daemon leaves one behind)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    assert path.is_socket()
    return path


def plain_file(path: Path) -> Path:
    path.write_text("not a socket\n")
    return path


# -- ping_socket ------------------------------------------------------------------------------


async def test_ping_live_docker(tmp_path: Path) -> None:
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, DOCKER_HEADERS) as daemon:
        result = await ping_socket(str(path), timeout=5)
    assert result == PingResult(socket_path=str(path), api_version="1.41", os_type="linux")
    assert not result.is_podman
    assert daemon.requests[0].startswith(b"GET /_ping HTTP/1.1\r\n")


async def test_ping_recognises_podman(tmp_path: Path) -> None:
    path = tmp_path / "podman.sock"
    async with fake_daemon(path, PODMAN_HEADERS):
        result = await ping_socket(str(path), timeout=5)
    assert result.is_podman
    assert result.podman_api_version == "4.9.0"
    assert result.api_version == "1.41"


async def test_ping_without_api_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "web.sock"
    async with fake_daemon(path, {"Server": "nginx"}):
        with pytest.raises(EngineUnavailable) as caught:
            await ping_socket(str(path), timeout=5)
    assert caught.value.socket_path == str(path)
    assert "Api-Version" in caught.value.reason


async def test_ping_error_status_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, DOCKER_HEADERS, status=500):
        with pytest.raises(EngineUnavailable) as caught:
            await ping_socket(str(path), timeout=5)
    assert caught.value.socket_path == str(path)
    assert caught.value.reason.startswith("ping failed")
    assert "500" in caught.value.reason


async def test_ping_stalled_daemon_is_unavailable_within_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, DOCKER_HEADERS) as daemon:
        daemon.stall = True
        t0 = trio.current_time()
        with pytest.raises(EngineUnavailable) as caught:
            await ping_socket(str(path), timeout=0.3)
        assert trio.current_time() - t0 < 2
    assert caught.value.socket_path == str(path)
    assert "ping failed" in caught.value.reason
    assert "0.3 s" in caught.value.reason


async def test_dead_socket_is_unavailable_and_named(tmp_path: Path) -> None:
    path = dead_socket(tmp_path / "docker.sock")
    with pytest.raises(EngineUnavailable) as caught:
        await ping_socket(str(path), timeout=5)
    assert caught.value.socket_path == str(path)
    assert str(path) in str(caught.value)
    assert "refused" in caught.value.reason.lower()


async def test_plain_file_is_unavailable(tmp_path: Path) -> None:
    path = plain_file(tmp_path / "docker.sock")
    with pytest.raises(EngineUnavailable) as caught:
        await ping_socket(str(path), timeout=5)
    assert caught.value.socket_path == str(path)


async def test_missing_socket_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.sock"
    with pytest.raises(EngineUnavailable) as caught:
        await ping_socket(str(path), timeout=5)
    assert caught.value.socket_path == str(path)
    assert caught.value.reason == "no such socket"


# -- connect: explicit path, negotiation -------------------------------------------------------


async def test_explicit_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = tmp_path / "explicit.sock"
    other = tmp_path / "other.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{other}")
    async with (
        fake_daemon(explicit, DOCKER_HEADERS) as mine,
        fake_daemon(other, DOCKER_HEADERS) as theirs,
    ):
        engine = await connect(str(explicit))
        try:
            assert engine.socket_path == str(explicit)
            assert engine.api_version == "1.41"
            await engine.version()  # goes to the explicit socket, too
        finally:
            await engine.aclose()
    assert len(mine.requests) == 2
    assert theirs.requests == []


async def test_explicit_path_never_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead explicit socket is an error, even with a live daemon at DOCKER_HOST."""
    dead = dead_socket(tmp_path / "dead.sock")
    live = tmp_path / "live.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{live}")
    async with fake_daemon(live, DOCKER_HEADERS) as daemon:
        with pytest.raises(EngineUnavailable) as caught:
            await connect(str(dead))
    assert caught.value.socket_path == str(dead)
    assert daemon.requests == []


async def test_explicit_path_ignores_a_tcp_docker_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    async with fake_daemon(path, DOCKER_HEADERS):
        engine = await connect(str(path))
        await engine.aclose()
    assert engine.socket_path == str(path)


@pytest.mark.parametrize(
    ("announced", "spoken"),
    [("1.41", "1.41"), ("1.45", "1.45"), ("1.56", "1.56"), ("1.99", "1.56")],
)
async def test_connect_negotiates(tmp_path: Path, announced: str, spoken: str) -> None:
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, {"Api-Version": announced}) as daemon:
        engine = await connect(str(path))
        try:
            await engine.version()
        finally:
            await engine.aclose()
    assert engine.api_version == spoken
    assert daemon.requests[1].startswith(f"GET /v{spoken}/version ".encode())


@pytest.mark.parametrize("announced", ["1.40", "1.24", "0.99", "banana"])
async def test_connect_refuses_old_or_garbled_servers(tmp_path: Path, announced: str) -> None:
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, {"Api-Version": announced}):
        with pytest.raises(EngineUnavailable) as caught:
            await connect(str(path))
    # The refusal names the socket, not "(negotiation)".
    assert caught.value.socket_path == str(path)
    assert announced in caught.value.reason


async def test_connect_maps_non_ascii_digits_in_api_version(tmp_path: Path) -> None:
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, {"Api-Version": "1.\xb2"}):
        with pytest.raises(EngineUnavailable):
            await connect(str(path))


# -- DOCKER_HOST and candidates ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("tcp://127.0.0.1:2375", "unix://"),
        ("ssh://user@host", "unix://"),
        ("npipe:////./pipe/docker_engine", "unix://"),
        ("/var/run/docker.sock", "unix://"),
        ("unix://relative/docker.sock", "absolute"),
        ("unix://", "absolute"),
    ],
)
def test_docker_host_refusals(value: str, needle: str) -> None:
    with pytest.raises(EngineUnavailable) as caught:
        socket_from_docker_host(value)
    assert caught.value.socket_path == value
    assert needle in caught.value.reason


def test_docker_host_tcp_message_is_clear() -> None:
    with pytest.raises(EngineUnavailable) as caught:
        candidate_sockets({"DOCKER_HOST": "tcp://127.0.0.1:2375"})
    reason = caught.value.reason
    assert "tcp" in reason
    assert "not supported" in reason
    assert "local socket" in reason


def test_docker_host_unix_path() -> None:
    assert socket_from_docker_host("unix:///run/user/1000/docker.sock") == (
        "/run/user/1000/docker.sock"
    )


def test_candidates_default_to_standard_places() -> None:
    assert candidate_sockets({}) == list(STANDARD_SOCKETS)
    assert candidate_sockets({"DOCKER_HOST": "   "}) == list(STANDARD_SOCKETS)
    assert STANDARD_SOCKETS[0] == "/var/run/docker.sock"


def test_candidates_append_rootless_places_in_order() -> None:
    env = {"XDG_RUNTIME_DIR": "/run/user/1000", "HOME": "/home/u"}
    assert candidate_sockets(env) == [
        *STANDARD_SOCKETS,
        "/run/user/1000/docker.sock",
        "/home/u/.docker/run/docker.sock",
    ]
    assert candidate_sockets({"HOME": "/home/u"}) == [
        *STANDARD_SOCKETS,
        "/home/u/.docker/run/docker.sock",
    ]


def test_docker_host_beats_every_standard_place() -> None:
    env = {
        "DOCKER_HOST": " unix:///srv/d.sock ",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "HOME": "/home/u",
    }
    assert candidate_sockets(env) == ["/srv/d.sock"]


async def test_discover_picks_the_first_answering_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = dead_socket(tmp_path / "dead.sock")
    first = tmp_path / "first.sock"
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setattr(discovery, "STANDARD_SOCKETS", (str(dead), str(first)))
    async with (
        fake_daemon(first, DOCKER_HEADERS),
        fake_daemon(runtime / "docker.sock", PODMAN_HEADERS) as later,
    ):
        result = await discover_socket(timeout=5, environ={"XDG_RUNTIME_DIR": str(runtime)})
    assert result.socket_path == str(first)
    assert later.requests == []


async def test_discover_prefers_docker_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    standard = tmp_path / "standard.sock"
    chosen = tmp_path / "chosen.sock"
    monkeypatch.setattr(discovery, "STANDARD_SOCKETS", (str(standard),))
    async with fake_daemon(standard, DOCKER_HEADERS) as std, fake_daemon(chosen, PODMAN_HEADERS):
        result = await discover_socket(timeout=5, environ={"DOCKER_HOST": f"unix://{chosen}"})
    assert result.socket_path == str(chosen)
    assert result.is_podman
    assert std.requests == []


async def test_discover_reads_os_environ_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "env.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    async with fake_daemon(path, DOCKER_HEADERS):
        assert (await discover_socket(timeout=5)).socket_path == str(path)
        engine = await connect()
        await engine.aclose()
    assert engine.socket_path == str(path)


async def test_discover_lists_every_candidate_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "missing.sock"
    dead = dead_socket(tmp_path / "dead.sock")
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    plain = plain_file(runtime / "docker.sock")
    home = tmp_path / "home"
    (home / ".docker" / "run").mkdir(parents=True)
    no_api = home / ".docker" / "run" / "docker.sock"
    monkeypatch.setattr(discovery, "STANDARD_SOCKETS", (str(missing), str(dead)))
    env = {"XDG_RUNTIME_DIR": str(runtime), "HOME": str(home)}
    async with fake_daemon(no_api, {"Server": "something else"}):
        with pytest.raises(EngineUnavailable) as caught:
            await discover_socket(timeout=5, environ=env)
    assert caught.value.socket_path == "(discovery)"
    reason = caught.value.reason
    assert reason.startswith("no Docker engine answered: ")
    entries = reason.removeprefix("no Docker engine answered: ").split("; ")
    assert [entry.split(": ", 1)[0] for entry in entries] == [
        str(missing),
        str(dead),
        str(plain),
        str(no_api),
    ]
    assert entries[0] == f"{missing}: no such socket"
    assert "refused" in entries[1].lower()
    assert "Api-Version" in entries[3]


async def test_discover_refuses_tcp_docker_host_without_probing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    standard = tmp_path / "standard.sock"
    monkeypatch.setattr(discovery, "STANDARD_SOCKETS", (str(standard),))
    async with fake_daemon(standard, DOCKER_HEADERS) as daemon:
        with pytest.raises(EngineUnavailable) as caught:
            await discover_socket(timeout=5, environ={"DOCKER_HOST": "tcp://127.0.0.1:2375"})
    assert caught.value.socket_path == "tcp://127.0.0.1:2375"
    assert daemon.requests == []  # no silent fallback to another engine


# -- negotiation ------------------------------------------------------------------------------


def test_negotiate_bounds() -> None:
    assert OLDEST_API == (1, 41)
    assert NEWEST_API == (1, 56)
    assert negotiate((1, 41)) == "1.41"
    assert negotiate((1, 44)) == "1.44"
    assert negotiate((1, 56)) == "1.56"
    assert negotiate((1, 99)) == "1.56"
    assert negotiate((2, 0)) == "1.56"


@pytest.mark.parametrize("server", [(1, 40), (1, 12), (0, 99)])
def test_negotiate_refuses_old_servers(server: tuple[int, int]) -> None:
    with pytest.raises(EngineUnavailable) as caught:
        negotiate(server)
    assert f"{server[0]}.{server[1]}" in caught.value.reason
    assert "1.41" in caught.value.reason
    assert "upgrade" in caught.value.reason


@pytest.mark.parametrize(
    ("text", "parsed"), [("1.41", (1, 41)), (" 1.41\n", (1, 41)), ("1.100", (1, 100))]
)
def test_parse_api_version(text: str, parsed: tuple[int, int]) -> None:
    assert parse_api_version(text) == parsed


@pytest.mark.parametrize(
    "text", ["", "1", "1.", ".41", "v1.41", "1.41.0", "1,41", "1.4a", "one.two", "-1.41", "1. 41"]
)
def test_parse_api_version_rejects_garbage(text: str) -> None:
    with pytest.raises(EngineUnavailable) as caught:
        parse_api_version(text)
    assert repr(text) in caught.value.reason


# -- the ping's answer, reused for a few seconds (answers.py) ----------------------------------


def pings(daemon: FakeDaemon) -> int:
    return sum(1 for head in daemon.requests if b" /_ping " in head.split(b"\r\n")[0])


async def test_an_engine_opened_again_soon_is_not_pinged_again(tmp_path: Path) -> None:
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, DOCKER_HEADERS) as daemon:
        for _ in range(3):
            engine = await connect(str(path))
            await engine.aclose()
        assert pings(daemon) == 1
        assert engine.api_version == "1.41"


async def test_a_discovered_daemon_is_not_pinged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    async with fake_daemon(path, DOCKER_HEADERS) as daemon:
        for _ in range(2):
            await (await connect()).aclose()
        assert pings(daemon) == 1


async def test_a_new_socket_file_is_pinged_afresh(tmp_path: Path) -> None:
    """A restarted daemon makes a new socket: its answer (here another API version) is asked
    for, not taken from the old one's."""
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, {"Api-Version": "1.41"}):
        await (await connect(str(path))).aclose()
    path.unlink()
    await trio.sleep(0.05)  # a restart takes longer than the file clock's tick
    async with fake_daemon(path, {"Api-Version": "1.45"}) as restarted:
        engine = await connect(str(path))
        await engine.aclose()
    assert pings(restarted) == 1
    assert engine.api_version == "1.45"


async def test_a_daemon_that_died_behind_its_socket_is_reported_by_the_next_connect(
    tmp_path: Path,
) -> None:
    """The same socket file, nobody listening: the first request's failed connection forgets
    the answer, so the next connect pings and says the daemon is unavailable, as ever."""
    path = tmp_path / "docker.sock"
    async with fake_daemon(path, DOCKER_HEADERS):
        await (await connect(str(path))).aclose()
    assert path.is_socket()  # the listener is closed; its file stays, as a crashed daemon's
    engine = await connect(str(path))  # the answer of a moment ago
    with pytest.raises(EngineUnavailable):
        await engine.version()
    await engine.aclose()
    with pytest.raises(EngineUnavailable) as caught:
        await connect(str(path))
    assert caught.value.socket_path == str(path)


async def test_an_answer_older_than_recent_ping_s_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "docker.sock"
    monkeypatch.setattr(answers, "RECENT_PING_S", 0.0)
    async with fake_daemon(path, DOCKER_HEADERS) as daemon:
        for _ in range(2):
            await (await connect(str(path))).aclose()
        assert pings(daemon) == 2
