"""Post-create inspection: the container the daemon made must be the one sbxkit asked for.

Bodies come from the real policy (``build_create_body``); replies are what Docker 20.10 answers
for such a body (``ContainerInspect`` decoded from a dict), then bent one field at a time.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan.policy import LEASE_LABEL, build_create_body, container_name
from sbxkit._plan.verify import check_created
from sbxkit.engine.models import ContainerCreate, ContainerInspect
from sbxkit.errors import ContainerMismatch, ImageChanged

LEASE = "0123456789abcdef0123456789abcdef"
NAME = container_name(LEASE)
CONTAINER_ID = "c0ffee" + "0" * 58


def make_spec(**overrides: Any) -> SandboxSpec:
    values: dict[str, Any] = {
        "image": "sbxkit-test/busybox:latest",
        "command": ["sh", "-c", "echo hi"],
        "limits": Limits(
            cpus=1.5, memory_bytes=128 * MiB, pids=64, output_bytes=MiB, timeout_s=10.0
        ),
        "labels": {"team": "x"},
        **overrides,
    }
    return SandboxSpec(**values)


def reply_for(body: ContainerCreate, **top: Any) -> dict[str, Any]:
    """The inspect reply Docker gives for ``body``: a created, stopped container."""
    host = body.host_config
    assert host is not None
    data: dict[str, Any] = {
        "Id": CONTAINER_ID,
        "Name": f"/{NAME}",
        "Created": "2026-01-01T00:00:00Z",
        "Path": "/sbin/docker-init",
        "State": {
            "Status": "created",
            "Running": False,
            "OOMKilled": False,
            "ExitCode": 0,
            "Error": "",
            "Pid": 0,
        },
        "Config": {
            "Image": body.image,
            "User": body.user,
            "Labels": dict(body.labels or {}),
            "Cmd": body.cmd,
            "Entrypoint": [],  # what Docker 20.10 reports for Entrypoint=[]
        },
        "HostConfig": {
            "NanoCpus": host.nano_cpus,
            "Memory": host.memory,
            "MemorySwap": host.memory_swap,
            "PidsLimit": host.pids_limit,
            "ReadonlyRootfs": host.readonly_rootfs,
            "Privileged": False,
            "NetworkMode": host.network_mode,
            "CapAdd": None,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "Ulimits": [
                {"Name": "fsize", "Soft": 64 * MiB, "Hard": 64 * MiB},
                {"Name": "msgqueue", "Soft": 0, "Hard": 0},
            ],
            "ShmSize": host.shm_size,
            "Tmpfs": dict(host.tmpfs or {}),
            "Init": True,
            "Runtime": host.runtime or "runc",
            "Binds": None,
            "AutoRemove": False,
            "IpcMode": "private",
            "CgroupnsMode": "private",
            "LogConfig": {"Type": "none", "Config": {}},
            "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0},
            "SomethingNewer": {"the daemon": "adds fields"},
        },
        "Mounts": [],
        "NetworkSettings": {"Networks": {}},
    }
    data.update(top)
    return data


def inspect(data: dict[str, Any]) -> ContainerInspect:
    return msgspec.convert(data, ContainerInspect)


def bent(body: ContainerCreate, change: Callable[[dict[str, Any]], None]) -> ContainerInspect:
    data = copy.deepcopy(reply_for(body))
    change(data)
    return inspect(data)


def test_matching_reply_passes() -> None:
    body = build_create_body(make_spec(), LEASE)
    check_created(inspect(reply_for(body)), body, lease=LEASE, name=NAME)


def test_matching_reply_from_json_passes() -> None:
    """The same through the JSON decoder the engine uses, unknown daemon fields included."""
    body = build_create_body(make_spec(runtime="crun", workdir="/tmp"), LEASE)
    raw = msgspec.json.encode(reply_for(body))
    check_created(msgspec.json.decode(raw, type=ContainerInspect), body, lease=LEASE, name=NAME)


def test_unset_runtime_accepts_the_daemon_default() -> None:
    body = build_create_body(make_spec(), LEASE)
    assert body.host_config is not None
    assert body.host_config.runtime is None
    reply = bent(body, lambda d: d["HostConfig"].update(Runtime="crun"))
    check_created(reply, body, lease=LEASE, name=NAME)


def _set_label(value: str | None) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        if value is None:
            d["Config"]["Labels"].pop(LEASE_LABEL)
        else:
            d["Config"]["Labels"][LEASE_LABEL] = value

    return change


def _host(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["HostConfig"].update(fields)


def _state(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["State"].update(fields)


MOUNT = {
    "Type": "volume",
    "Name": "f00",
    "Source": "/var/lib/docker/volumes/f00/_data",
    "Destination": "/data",
    "RW": True,
}

DEVIATIONS: list[Any] = [
    pytest.param(_set_label("someone-else"), "label sbxkit.lease='someone-else'", id="lease-label"),
    pytest.param(_set_label(None), "label sbxkit.lease=None", id="lease-label-missing"),
    pytest.param(
        lambda d: d["Config"].update(Labels=None), "label sbxkit.lease=None", id="no-labels"
    ),
    pytest.param(lambda d: d.update(Name="/sbxkit-other"), "name '/sbxkit-other'", id="name"),
    pytest.param(_state(Status="running", Running=True), "state 'running'", id="running"),
    pytest.param(_state(Running=True), "state 'created'", id="running-flag"),
    pytest.param(_state(Status="exited"), "state 'exited'", id="exited"),
    pytest.param(
        lambda d: d.update(Mounts=[MOUNT]), "mounts are [('volume', 'f00', '/data'", id="mount"
    ),
    pytest.param(
        lambda d: d.update(Mounts=[{**MOUNT, "Type": "bind", "Destination": "/host"}]),
        "('bind', '/var/lib/docker/volumes/f00/_data', '/host'",
        id="bind-mount",
    ),
    pytest.param(_host(Memory=0), "HostConfig.Memory is 0", id="memory"),
    pytest.param(_host(MemorySwap=-1), "HostConfig.MemorySwap is -1", id="swap"),
    pytest.param(_host(NanoCpus=0), "HostConfig.NanoCpus is 0", id="cpu"),
    pytest.param(_host(PidsLimit=None), "HostConfig.PidsLimit is None", id="pids-none"),
    pytest.param(_host(PidsLimit=-1), "HostConfig.PidsLimit is -1", id="pids"),
    pytest.param(_host(ReadonlyRootfs=False), "HostConfig.ReadonlyRootfs", id="readonly"),
    pytest.param(_host(NetworkMode="bridge"), "HostConfig.NetworkMode is 'bridge'", id="network"),
    pytest.param(_host(NetworkMode="host"), "HostConfig.NetworkMode is 'host'", id="network-host"),
    pytest.param(_host(Tmpfs={}), "HostConfig.Tmpfs is {}", id="tmpfs-gone"),
    pytest.param(_host(Tmpfs=None), "HostConfig.Tmpfs is None", id="tmpfs-none"),
    pytest.param(_host(Tmpfs={"/tmp": "rw,exec"}), "HostConfig.Tmpfs", id="tmpfs-options"),
    pytest.param(_host(Privileged=True), "HostConfig.Privileged is true", id="privileged"),
    pytest.param(_host(CapAdd=["SYS_ADMIN"]), "HostConfig.CapAdd is ['SYS_ADMIN']", id="cap-add"),
    pytest.param(_host(Binds=["/:/host"]), "HostConfig.Binds is ['/:/host']", id="binds"),
    pytest.param(lambda d: d["Config"].update(User="0:0"), "Config.User is '0:0'", id="user"),
    pytest.param(lambda d: d["Config"].update(User=""), "Config.User is ''", id="user-empty"),
]


@pytest.mark.parametrize(("change", "field"), DEVIATIONS)
def test_each_deviation_is_named(change: Callable[[dict[str, Any]], None], field: str) -> None:
    body = build_create_body(make_spec(), LEASE)
    reply = bent(body, change)
    with pytest.raises(ContainerMismatch) as caught:
        check_created(reply, body, lease=LEASE, name=NAME)
    assert field in caught.value.what, caught.value.what
    assert caught.value.container_id == CONTAINER_ID
    assert str(caught.value).startswith(f"container {CONTAINER_ID[:12]}: ")


def test_a_container_its_owner_launched_may_run_and_nothing_else_changes() -> None:
    """``launched``: the supervisor may have started it (its shell waits for the go line), so
    a running container passes; an exited one does not, nor does a running one unasked."""
    body = build_create_body(make_spec(), LEASE)
    running = bent(body, _state(Status="running", Running=True))
    check_created(running, body, lease=LEASE, name=NAME, launched=True)
    check_created(bent(body, lambda d: None), body, lease=LEASE, name=NAME, launched=True)
    with pytest.raises(ContainerMismatch) as caught:
        check_created(running, body, lease=LEASE, name=NAME)
    assert "(or a running one" not in caught.value.what
    exited = bent(body, _state(Status="exited"))
    with pytest.raises(ContainerMismatch) as caught:
        check_created(exited, body, lease=LEASE, name=NAME, launched=True)
    assert caught.value.what == (
        "state 'exited', expected a stopped 'created' container "
        "(or a running one its owner started)"
    )
    with pytest.raises(ContainerMismatch, match=r"HostConfig\.Memory is 1,"):
        check_created(
            bent(body, lambda d: (_state(Status="running", Running=True)(d), _host(Memory=1)(d))),
            body,
            lease=LEASE,
            name=NAME,
            launched=True,
        )


def test_runtime_mismatch_is_named() -> None:
    body = build_create_body(make_spec(runtime="crun"), LEASE)
    check_created(bent(body, _host(Runtime="crun")), body, lease=LEASE, name=NAME)
    with pytest.raises(ContainerMismatch) as caught:
        check_created(bent(body, _host(Runtime="runc")), body, lease=LEASE, name=NAME)
    assert caught.value.what == "HostConfig.Runtime is 'runc', expected 'crun'"


def test_expected_values_are_in_the_message() -> None:
    body = build_create_body(make_spec(), LEASE)
    with pytest.raises(ContainerMismatch) as caught:
        check_created(bent(body, _host(Memory=1)), body, lease=LEASE, name=NAME)
    assert caught.value.what == f"HostConfig.Memory is 1, expected {128 * MiB}"
    with pytest.raises(ContainerMismatch) as caught:
        check_created(bent(body, _set_label("x")), body, lease=LEASE, name=NAME)
    assert caught.value.what == f"label {LEASE_LABEL}='x', expected {LEASE!r}"


def test_wrong_expectations_are_caught_too() -> None:
    """The caller's lease and name are what count, not whatever the reply says."""
    body = build_create_body(make_spec(), LEASE)
    reply = inspect(reply_for(body))
    other = "fedcba9876543210fedcba9876543210"
    with pytest.raises(ContainerMismatch, match="label"):
        check_created(reply, body, lease=other, name=NAME)
    with pytest.raises(ContainerMismatch, match="name"):
        check_created(reply, body, lease=LEASE, name=container_name(other))


def test_name_with_or_without_leading_slash() -> None:
    body = build_create_body(make_spec(), LEASE)
    check_created(bent(body, lambda d: d.update(Name=NAME)), body, lease=LEASE, name=NAME)


def test_user_and_limits_follow_the_spec() -> None:
    body = build_create_body(make_spec(user="1000:1000"), LEASE)
    check_created(inspect(reply_for(body)), body, lease=LEASE, name=NAME)
    with pytest.raises(ContainerMismatch, match=r"Config\.User is '65534:65534'"):
        check_created(
            bent(body, lambda d: d["Config"].update(User="65534:65534")),
            body,
            lease=LEASE,
            name=NAME,
        )


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("HostConfig", "IpcMode"), "host", "HostConfig.IpcMode"),
        (("HostConfig", "CgroupnsMode"), "host", "HostConfig.CgroupnsMode"),
        (("HostConfig", "AutoRemove"), True, "HostConfig.AutoRemove"),
        (("HostConfig", "CapDrop"), [], "HostConfig.CapDrop"),
        (("HostConfig", "SecurityOpt"), [], "HostConfig.SecurityOpt"),
        (("HostConfig", "Init"), False, "HostConfig.Init"),
        (("HostConfig", "LogConfig"), {"Type": "json-file"}, "HostConfig.LogConfig.Type"),
        (("HostConfig", "RestartPolicy"), {"Name": "always"}, "HostConfig.RestartPolicy.Name"),
        (("HostConfig", "Ulimits"), [], "HostConfig.Ulimits"),
        (("HostConfig", "ShmSize"), 64 * 1024 * 1024 * 2, "HostConfig.ShmSize"),
        (("Config", "Entrypoint"), ["/entry"], "Config.Entrypoint"),
        (("Config", "Cmd"), ["other"], "Config.Cmd"),
        (("Config", "Image"), "other:latest", "Config.Image"),
    ],
)
def test_every_hardened_field_is_compared(path: tuple[str, str], value: Any, field: str) -> None:
    body = build_create_body(make_spec(), LEASE)

    def change(data: dict[str, Any]) -> None:
        data[path[0]][path[1]] = value

    with pytest.raises(ContainerMismatch, match=re.escape(field)):
        check_created(bent(body, change), body, lease=LEASE, name=NAME)


def test_an_inspected_id_other_than_the_created_one_is_refused() -> None:
    body = build_create_body(make_spec(), LEASE)
    with pytest.raises(ContainerMismatch, match="created id"):
        check_created(inspect(reply_for(body)), body, lease=LEASE, name=NAME, container_id="f" * 64)


def test_a_container_of_another_image_than_the_planned_one_is_image_changed() -> None:
    body = build_create_body(make_spec(), LEASE)
    planned, other = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    moved = inspect({**reply_for(body), "Image": other})
    with pytest.raises(ImageChanged, match="moved to another image") as caught:
        check_created(moved, body, lease=LEASE, name=NAME, image_id=planned)
    assert isinstance(caught.value, ContainerMismatch)
    same = inspect({**reply_for(body), "Image": "a" * 64})  # Podman may leave out "sha256:"
    check_created(same, body, lease=LEASE, name=NAME, image_id=planned)
    check_created(moved, body, lease=LEASE, name=NAME)  # nothing planned on: not compared
    named = inspect({**reply_for(body), "Image": "busybox:latest"})  # Podman < 4.3: a name
    check_created(named, body, lease=LEASE, name=NAME, image_id=planned)
