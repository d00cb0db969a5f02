"""One state directory per daemon (issue 43, item 3): the standard socket keeps the layout
sbxkit always had, another named daemon gets its own, and SBXKIT_STATE_DIR still wins."""

from __future__ import annotations

import hashlib
import os

import pytest

from sbxkit._protocol.address import docker_host_socket, state_dir_text
from sbxkit.backends.docker import DockerBackend

HOME = os.path.expanduser("~")


def digest(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:12]


@pytest.mark.parametrize(
    ("environ", "socket", "expected"),
    [
        ({}, None, f"{HOME}/.sbxkit/leases"),
        ({"DOCKER_HOST": "unix:///var/run/docker.sock"}, None, f"{HOME}/.sbxkit/leases"),
        ({"DOCKER_HOST": "unix:///run/docker.sock"}, None, f"{HOME}/.sbxkit/leases"),
        (
            {"DOCKER_HOST": "unix:///run/other/docker.sock"},
            None,
            f"{HOME}/.sbxkit/leases-{digest('/run/other/docker.sock')}",
        ),
        (
            {"DOCKER_HOST": "unix:///run/other/docker.sock"},
            "/srv/d.sock",
            f"{HOME}/.sbxkit/leases-{digest('/srv/d.sock')}",
        ),
        ({"DOCKER_HOST": "tcp://h:2375"}, None, f"{HOME}/.sbxkit/leases"),
        ({"SBXKIT_STATE_DIR": " /s ", "DOCKER_HOST": "unix:///x.sock"}, "/y.sock", "/s"),
    ],
)
def test_each_daemon_has_its_own_state_directory(
    environ: dict[str, str], socket: str | None, expected: str
) -> None:
    assert state_dir_text(environ, socket=socket) == expected


def test_docker_host_names_a_socket_only_as_unix_absolute() -> None:
    assert docker_host_socket({"DOCKER_HOST": "unix:///a/b.sock"}) == "/a/b.sock"
    assert docker_host_socket({"DOCKER_HOST": "unix://rel.sock"}) is None
    assert docker_host_socket({}) is None


def test_a_backend_on_a_named_socket_takes_that_daemons_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SBXKIT_STATE_DIR", raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    backend = DockerBackend(socket_path="/run/other/docker.sock")
    assert backend.settings is not None
    assert backend.settings.supervisor_state_dir == (
        f"{HOME}/.sbxkit/leases-{digest('/run/other/docker.sock')}"
    )
    assert DockerBackend().settings is None  # no daemon named: decided at run time, as before
