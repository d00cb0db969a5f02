"""Pure: the Podman dialect of the create body, of the post-create check and of error replies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sbxkit._model.rules import PODMAN_AUTO_USERNS
from sbxkit._model.runtimes import check_podman_runtime
from sbxkit._model.spec import Workspace
from sbxkit._plan.policy import PODMAN_SEALED_TMPFS, build_create_body, scratch_options
from sbxkit._plan.verify import check_created
from sbxkit.engine.transport import error_for
from sbxkit.errors import Conflict, ContainerMismatch, EngineError, NotFound, SpecError
from tests.unit.test_verify import CONTAINER_ID, LEASE, NAME, inspect, make_spec, reply_for


def podman_reply(podman_body: Any) -> dict[str, Any]:
    """What Podman 4.3's compat inspect says for a body sbxkit built for it."""
    data = reply_for(podman_body)
    host = data["HostConfig"]
    host["Tmpfs"] = {k: v + ",tmpcopyup" for k, v in host["Tmpfs"].items()}
    host["CapDrop"] = ["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "KILL", "SETUID", "SETGID"]
    host["IpcMode"] = "shareable"
    host["CgroupnsMode"] = ""
    host["Runtime"] = "oci"
    host["Ulimits"] = [
        {"Name": "RLIMIT_" + u.name.upper(), "Soft": u.soft, "Hard": u.hard}
        for u in podman_body.host_config.ulimits
    ]
    data["Config"]["Image"] = "localhost/" + podman_body.image
    return data


def test_the_podman_body_drops_tmpfs_ownership_seals_run_and_sets_nofile_nproc() -> None:
    spec = make_spec(user="4242:4343")
    docker = build_create_body(spec, LEASE)
    podman = build_create_body(spec, LEASE, podman=True)
    assert docker.host_config is not None
    assert podman.host_config is not None
    assert "uid=4242,gid=4343" in scratch_options(spec)
    assert "uid=" not in scratch_options(spec, podman=True)
    assert "mode=1777" in scratch_options(spec, podman=True)
    assert podman.host_config.tmpfs == {"/tmp": scratch_options(spec, podman=True)} | dict(
        PODMAN_SEALED_TMPFS
    )
    assert all(o.startswith("ro,") for o in PODMAN_SEALED_TMPFS.values())
    names = [u.name for u in podman.host_config.ulimits or []]
    assert names == ["fsize", "msgqueue", "nofile", "nproc"]
    assert [u.name for u in docker.host_config.ulimits or []] == ["fsize", "msgqueue"]


def test_podmans_inspect_dialect_passes_only_in_podman_mode() -> None:
    body = build_create_body(make_spec(), LEASE, podman=True)
    reply = inspect(podman_reply(body))
    check_created(reply, body, lease=LEASE, name=NAME, container_id=CONTAINER_ID, podman=True)
    with pytest.raises(ContainerMismatch):
        check_created(reply, body, lease=LEASE, name=NAME, container_id=CONTAINER_ID)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("CapAdd", ["SYS_ADMIN"]),
        ("IpcMode", "host"),
        ("Tmpfs", {"/tmp": "rw,size=1"}),
        ("Ulimits", []),
        ("Memory", 1),
    ],
)
def test_podman_mode_still_refuses_what_differs(field: str, value: object) -> None:
    body = build_create_body(make_spec(), LEASE, podman=True)
    data = copy.deepcopy(podman_reply(body))
    data["HostConfig"][field] = value
    with pytest.raises(ContainerMismatch):
        check_created(inspect(data), body, lease=LEASE, name=NAME, podman=True)


def test_podman_mode_refuses_another_image() -> None:
    body = build_create_body(make_spec(), LEASE, podman=True)
    data = podman_reply(body)
    data["Config"]["Image"] = "localhost/other:latest"
    with pytest.raises(ContainerMismatch, match=r"Config\.Image"):
        check_created(inspect(data), body, lease=LEASE, name=NAME, podman=True)


@pytest.mark.parametrize("runtime", ["runsc", "gvisor", "runc"])
def test_podman_refuses_a_runtime_it_would_ignore(runtime: str) -> None:
    with pytest.raises(SpecError) as refused:
        check_podman_runtime(runtime, "crun")
    assert refused.value.field == "runtime"
    assert "ignores HostConfig.Runtime" in refused.value.rule
    check_podman_runtime(None, "crun")
    check_podman_runtime("crun", "crun")


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b'{"cause":"no such container","message":"x does not exist","response":500}', NotFound),
        (b'{"cause":"container state improper","message":"stopped","response":500}', Conflict),
        (b'{"cause":"something else","message":"boom","response":500}', EngineError),
    ],
)
def test_podmans_500_causes_map_to_dockers_statuses(body: bytes, kind: type[EngineError]) -> None:
    error = error_for("POST", "/v1.41/containers/abc/kill", 500, body)
    assert type(error) is kind
    assert error.status == 500


def test_podman_out_of_ids_for_its_own_user_namespace_says_where_they_come_from() -> None:
    body = (
        b'{"cause":"could not find enough available IDs","message":"container create: creating'
        b' container storage: could not find enough available IDs","response":500}'
    )  # Podman 4.3, asked for auto:size=65536 without a containers range
    error = error_for("POST", "/v1.41/containers/create", 500, body)
    assert type(error) is EngineError
    assert "could not find enough available IDs" in str(error)
    assert "/etc/subuid" in str(error)
    assert "scripts/podman-up" in str(error)


PODMAN_DEFAULTS_DROPPED = [
    "AUDIT_WRITE", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "NET_RAW", "SETFCAP",
    "SETPCAP", "SYS_CHROOT",
]  # fmt: skip
"""What Podman 4.3's compat inspect said of a workspace's root (the five kept; its defaults)."""


def workspace_reply(body: Any, **host: object) -> dict[str, Any]:
    data = podman_reply(body)
    data["HostConfig"].update({"CapAdd": [], "CapDrop": PODMAN_DEFAULTS_DROPPED, **host})
    return data


def test_podmans_grant_of_a_workspaces_five_capabilities_is_read_in_its_dialect() -> None:
    """Podman names capabilities against its default set, which holds all five: they show as
    no CapAdd and a CapDrop without them."""
    body = build_create_body(
        make_spec(workspace=Workspace()), LEASE, podman=True, userns_mode=PODMAN_AUTO_USERNS
    )
    assert body.user == "0:0"
    check_created(inspect(workspace_reply(body)), body, lease=LEASE, name=NAME, podman=True)


@pytest.mark.parametrize(
    ("host", "field"),
    [
        ({"CapAdd": ["SYS_ADMIN"]}, "CapAdd"),
        ({"CapDrop": [*PODMAN_DEFAULTS_DROPPED, "CHOWN"]}, "CapDrop"),
        ({"CapDrop": []}, "CapDrop"),
    ],
)
def test_podmans_grant_beyond_or_short_of_the_five_is_refused(
    host: dict[str, object], field: str
) -> None:
    body = build_create_body(
        make_spec(workspace=Workspace()), LEASE, podman=True, userns_mode=PODMAN_AUTO_USERNS
    )
    with pytest.raises(ContainerMismatch, match=rf"HostConfig\.{field}"):
        check_created(
            inspect(workspace_reply(body, **host)), body, lease=LEASE, name=NAME, podman=True
        )
