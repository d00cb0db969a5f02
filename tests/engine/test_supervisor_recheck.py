"""The supervisor as a second line of defence: a raw client on its socket cannot get a body
created that policy never produces, nor make it talk to a socket the client names.

A bare AF_UNIX client (no sbxkit client code) completes the Hello and registers a hostile body;
the supervisor must answer Refused naming the field, and the independent witness must see no
container. A policy-built body on the same supervisor is the positive control.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sbxkit._plan.plan import new_lease_id
from sbxkit._plan.policy import container_name
from sbxkit._protocol.wire import (
    Close,
    Closed,
    Created,
    Launch,
    Refused,
    Register,
    Registered,
    Welcome,
)
from tests.engine.helpers import unique
from tests.engine.test_mounts import bind_options, volume_exists, witness_volume
from tests.engine.test_supervisor import RawClient, first_reply, hello, register_for
from tests.supervision import (
    running_supervisor,
)
from tests.witness import SOCKET, Witness


def frame(document: Any) -> bytes:
    payload = msgspec.json.encode(document)
    return struct.pack(">I", len(payload)) + payload


def raw_register(register: Register, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The Register as JSON with one change to its body, byte for byte what a raw client sends."""
    document = msgspec.to_builtins(register)
    change(document["body"])
    return frame(document)


def exists_by_name(witness: Witness, lease: str) -> bool:
    response = witness.session.get(
        f"{witness.base}/containers/{container_name(lease)}/json", timeout=30
    )
    if response.status_code == 404:
        return False
    response.raise_for_status()
    return True


def host(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda body: body["HostConfig"].__setitem__(key, value)


HOSTILE = {
    "privileged": (host("Privileged", True), "HostConfig.Privileged"),
    "root-bind": (host("Binds", ["/:/host:rw,rprivate"]), "HostConfig.Binds[0]"),
    "no-user": (lambda body: body.pop("User"), "Config.User"),
    "root-user": (lambda body: body.__setitem__("User", "0:0"), "Config.User"),
    "no-readonly": (host("ReadonlyRootfs", False), "HostConfig.ReadonlyRootfs"),
    "cap-add": (host("CapAdd", ["SYS_ADMIN"]), "HostConfig.CapAdd"),
    "seccomp": (
        host("SecurityOpt", ["no-new-privileges", "seccomp=unconfined"]),
        "HostConfig.SecurityOpt",
    ),
    "devices": (host("Devices", [{"PathOnHost": "/dev/mem"}]), "HostConfig.Devices"),
    "pid-host": (host("PidMode", "host"), "HostConfig.PidMode"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_raw_client_registering_a_hostile_body_is_refused_and_nothing_is_created(
    name: str, busybox: str, witness: Witness, state_dir: Path
) -> None:
    change, field = HOSTILE[name]
    with running_supervisor(state_dir, "--engine-socket", SOCKET) as sup:
        lease = new_lease_id()
        client = RawClient(sup.socket_path)
        try:
            client.sock.sendall(frame(msgspec.to_builtins(hello())))
            assert isinstance(client.receive(), Welcome)
            client.sock.sendall(raw_register(register_for(lease, busybox, "true", SOCKET), change))
            reply = client.receive()
        finally:
            client.close()
        assert isinstance(reply, Refused), reply
        assert reply.code == "policy"
        assert reply.field == field, reply
        assert not exists_by_name(witness, lease)
        assert not [n for n in os.listdir(state_dir) if n.endswith(".lease")]

        # The positive control: the policy-built body on the same supervisor is created.
        control = new_lease_id()
        client = RawClient(sup.socket_path)
        try:
            client.send(hello())
            assert isinstance(client.receive(), Welcome)
            client.send(register_for(control, busybox, "true", SOCKET))
            assert isinstance(client.receive(), Registered)
            assert isinstance(client.receive(), Created)
            assert exists_by_name(witness, control)
            client.send(Close(lease=control))
            assert isinstance(client.receive(), Closed)
        finally:
            client.close()
        assert not exists_by_name(witness, control)


def test_a_client_naming_another_socket_is_refused_and_that_socket_never_hears(
    busybox: str, witness: Witness, state_dir: Path
) -> None:
    decoy_path = state_dir.parent / "decoy.sock"
    decoy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    decoy.bind(str(decoy_path))
    decoy.listen(8)
    decoy.settimeout(0.5)
    try:
        with running_supervisor(state_dir, "--engine-socket", SOCKET) as sup:
            lease = new_lease_id()
            reply = first_reply(
                sup.socket_path, register_for(lease, busybox, "true", str(decoy_path))
            )
        assert isinstance(reply, Refused), reply
        assert reply.code == "engine"
        assert str(decoy_path) in reply.reason
        with pytest.raises(TimeoutError):
            decoy.accept()  # the supervisor never connected to it
        assert not exists_by_name(witness, lease)
    finally:
        decoy.close()


def volume_mount(name: str) -> Callable[[dict[str, Any]], None]:
    mount = {
        "Type": "volume",
        "Source": name,
        "Target": "/data",
        "ReadOnly": False,
        "VolumeOptions": {"NoCopy": True},
    }
    return host("Mounts", [mount])


def register_raw(sup_socket: Path, register: Register, change: Callable[..., None]) -> Any:
    client = RawClient(sup_socket)
    try:
        client.send(hello())
        assert isinstance(client.receive(), Welcome)
        client.sock.sendall(raw_register(register, change))
        return client.receive()
    finally:
        client.close()


def test_a_named_volume_backed_by_the_hosts_root_or_missing_is_refused(
    busybox: str, witness: Witness, state_dir: Path
) -> None:
    """A raw client cannot reach the host's root through a named volume either, nor make the
    daemon create a volume; a plain local volume on the same supervisor is the control."""
    with (
        witness_volume(witness, bind_options("/")) as rooted,
        witness_volume(witness) as plain,
        running_supervisor(state_dir, "--engine-socket", SOCKET) as sup,
    ):
        lease = new_lease_id()
        register = register_for(lease, busybox, "true", SOCKET)
        reply = register_raw(sup.socket_path, register, volume_mount(rooted))
        assert isinstance(reply, Refused), reply
        assert reply.field == "HostConfig.Mounts[0].Source"
        assert "/ is the host's root" in reply.reason
        assert not exists_by_name(witness, lease)

        missing = unique("sbxt-none")
        reply = register_raw(sup.socket_path, register, volume_mount(missing))
        assert isinstance(reply, Refused), reply
        assert "it would be created" in reply.reason
        assert not volume_exists(witness, missing)
        assert not exists_by_name(witness, lease)

        client = RawClient(sup.socket_path)
        try:
            client.send(hello())
            assert isinstance(client.receive(), Welcome)
            client.sock.sendall(raw_register(register, volume_mount(plain)))
            assert isinstance(client.receive(), Registered)
            assert isinstance(client.receive(), Created)
            client.send(Close(lease=lease))
            assert isinstance(client.receive(), Closed)
        finally:
            client.close()
        assert not exists_by_name(witness, lease)


def test_a_launch_asked_for_a_body_that_does_not_wait_for_its_go_line_is_refused(
    busybox: str, witness: Witness, state_dir: Path
) -> None:
    """``launch`` starts a container before its caller lets the payload go: only a body whose
    payload waits for the go line (the kernel path's FIFO shell) may ask for it. Another is
    refused as a request, before anything is journaled or created."""
    with running_supervisor(state_dir, "--engine-socket", SOCKET) as sup:
        lease = new_lease_id()
        register = register_for(lease, busybox, "echo would-run-at-once", SOCKET)
        asked = msgspec.structs.replace(register, launch=Launch(expected_mounts=[]))
        reply = first_reply(sup.socket_path, asked)
        assert isinstance(reply, Refused), reply
        assert (reply.code, reply.field) == ("request", None)
        assert "launch: only a body whose payload waits for its go line" in reply.reason
        assert not exists_by_name(witness, lease)
        assert not [n for n in os.listdir(state_dir) if n.endswith(".lease")]
