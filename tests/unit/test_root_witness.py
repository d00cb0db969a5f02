"""What says a workspace's root is not the host's, per daemon and ``UsernsMode``, against a
scripted daemon on a Unix socket (its ``/_ping``, ``/info`` and Podman's ``/libpod/info``): the
caller plans on it, the supervisor asks it again of the body it was handed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from sbxkit._model.rules import PODMAN_AUTO_USERNS, PODMAN_AUTO_WITNESS
from sbxkit._plan.preflight import planned_root_witness, root_inside_witness
from sbxkit.engine.client import connect
from tests.unit.test_discovery import DOCKER_HEADERS, PODMAN_HEADERS
from tests.unit.unix_server import Handler, answer_heads, response, unix_server


def answers(*, podman: bool, remap: str | None = None, rootless: bool = False) -> dict[str, bytes]:
    options = ["name=seccomp,profile=default", *([f"name={remap}"] if remap else [])]
    info = {"SecurityOptions": options, "DefaultRuntime": "crun" if podman else "runc"}
    host = {"security": {"rootless": rootless}, "cgroupControllers": ["cpu", "memory", "pids"]}
    return {  # the first whose path ends the request's answers
        "/_ping": b"OK",
        "/libpod/info": json.dumps({"host": host}).encode(),
        "/info": json.dumps(info).encode(),
    }


def daemon(replies: dict[str, bytes], headers: dict[str, str]) -> Handler:
    async def answer(head: bytes) -> bytes:
        path = head.split(b" ")[1].decode().split("?")[0]
        body = next((v for k, v in replies.items() if path.endswith(k)), b"{}")
        return response("200 OK", body, headers)

    async def handle(stream: trio.SocketStream) -> None:
        await answer_heads(stream, answer)

    return handle


CASES = [
    # (daemon, runtime, UsernsMode) -> the witness, or None: refused
    ({"podman": False}, None, None, None),
    ({"podman": False}, None, PODMAN_AUTO_USERNS, None),
    ({"podman": False}, "runsc", None, "gvisor"),
    ({"podman": False}, "runsc", "host", None),
    ({"podman": False, "remap": "userns"}, None, None, "userns"),
    ({"podman": False, "remap": "userns"}, None, "host", None),  # would undo the remapping
    ({"podman": False, "remap": "userns"}, None, PODMAN_AUTO_USERNS, None),
    ({"podman": False, "remap": "rootless"}, None, None, "rootless"),
    ({"podman": True}, None, None, None),  # root in the host's user namespace
    ({"podman": True}, None, PODMAN_AUTO_USERNS, PODMAN_AUTO_WITNESS),
    ({"podman": True}, None, "auto", None),
    ({"podman": True}, None, "host", None),
    ({"podman": True, "rootless": True}, None, None, "rootless"),
    ({"podman": True, "rootless": True}, None, PODMAN_AUTO_USERNS, None),
]


@pytest.mark.parametrize(("facts", "runtime", "mode", "witness"), CASES)
async def test_the_witness_of_root_inside(
    tmp_path: Path,
    facts: dict[str, Any],
    runtime: str | None,
    mode: str | None,
    witness: str | None,
) -> None:
    podman = bool(facts.get("podman"))
    path = str(tmp_path / "engine.sock")
    headers = PODMAN_HEADERS if podman else DOCKER_HEADERS
    async with unix_server(path, daemon(answers(**facts), headers)):
        engine = await connect(path)
        try:
            assert engine.is_podman is podman
            said = await root_inside_witness(engine, runtime, mode)
        finally:
            await engine.aclose()
    assert said == witness


@pytest.mark.parametrize(
    ("facts", "runtime", "planned"),
    [
        ({"podman": False}, None, None),
        ({"podman": False}, "runsc", "gvisor"),
        ({"podman": False, "remap": "userns"}, None, "userns"),
        ({"podman": True}, None, PODMAN_AUTO_WITNESS),
        ({"podman": True, "rootless": True}, None, "rootless"),
    ],
)
async def test_the_caller_plans_rootful_podmans_root_in_its_own_user_namespace(
    tmp_path: Path, facts: dict[str, Any], runtime: str | None, planned: str | None
) -> None:
    path = str(tmp_path / "engine.sock")
    headers = PODMAN_HEADERS if facts.get("podman") else DOCKER_HEADERS
    async with unix_server(path, daemon(answers(**facts), headers)):
        engine = await connect(path)
        try:
            said = await planned_root_witness(engine, runtime)
        finally:
            await engine.aclose()
    assert said == planned
