"""Workspaces with root inside (``sbxkit.Workspace``), without a daemon: what a spec may say,
the body policy builds, the supervisor's second look, the pools' refusal and the host
kernel's rule (``sbxkit._kernel.userns``). The real-engine side is tests/engine/test_workspace.py
and the userns cell's tests/engine/test_userns.py."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
import pytest

from sbxkit._grammar.flags import spec_from_args
from sbxkit._grammar.profile import ProfileWorkspace, profile_from_dict
from sbxkit._kernel.userns import (
    host_root_problem,
    maps_host_root,
    outside_id,
    parse_id_map,
    recorded_maps_problem,
)
from sbxkit._model.network_terms import Network
from sbxkit._model.rules import PODMAN_AUTO_USERNS, PODMAN_AUTO_WITNESS, ROOT_INSIDE_CAPS
from sbxkit._model.spec import Limits, MiB, SandboxSpec, Workspace, validate_spec
from sbxkit._plan.policy import build_create_body
from sbxkit._plan.preflight import planned_userns_mode
from sbxkit._protocol.wire import Claim, PoolTerms, Register, Reservation
from sbxkit.backends.docker import gated, refuse_late_start
from sbxkit.backends.sbx import check_sbx_spec
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import SpecError
from sbxkit.pool.line import claim_line_within
from sbxkit.supervisor.recheck import recheck_body
from sbxkit.supervisor.templates import template_problem

LEASE = "0123456789abcdef0123456789abcdef"


def workspace_spec(**fields: Any) -> SandboxSpec:
    values: dict[str, Any] = {
        "image": "sbxkit-test/python:latest",
        "command": ["id", "-u"],
        "limits": Limits(cpus=1, memory_bytes=64 * MiB, pids=64, output_bytes=MiB, timeout_s=5),
        "workspace": Workspace(),
    }
    values.update(fields)
    return SandboxSpec(**values)


def refusal(spec: SandboxSpec) -> SpecError:
    with pytest.raises(SpecError) as caught:
        validate_spec(spec)
    return caught.value


def test_a_workspace_runs_as_root_inside_with_the_short_list_of_capabilities() -> None:
    body = build_create_body(workspace_spec(), LEASE)
    host = body.host_config
    assert host is not None
    assert body.user == "0:0"
    assert host.cap_drop == ["ALL"]
    assert host.cap_add == list(ROOT_INSIDE_CAPS)
    assert host.security_opt == ["no-new-privileges"]
    assert host.readonly_rootfs is True
    assert host.privileged is False
    assert "HOME=/tmp" in (body.env or [])
    assert "uid=0,gid=0" in host.tmpfs["/tmp"]
    # without the workspace, nothing of it
    plain = build_create_body(workspace_spec(workspace=None), LEASE)
    assert plain.user != "0:0"
    assert plain.host_config is not None
    assert plain.host_config.cap_add is None


def test_a_workspace_names_no_user_and_may_ask_for_a_governed_network() -> None:
    named = refusal(workspace_spec(user="1000:1000"))
    assert (named.field, "leave user unset" in named.rule) == ("user", True)
    # judged with the daemon (gVisor and rootless engines are refused there, by name)
    validate_spec(workspace_spec(network=Network(allow=["example.com:443"])))
    wrong = refusal(workspace_spec(workspace={"root": True}))
    assert wrong.field == "workspace"
    # a workspace without root is a sandbox of its own uid, as before
    validate_spec(workspace_spec(workspace=Workspace(root=False), user="1000:1000"))
    assert build_create_body(workspace_spec(workspace=Workspace(root=False)), LEASE).user != "0:0"


def test_root_is_still_refused_where_no_workspace_asks_for_it() -> None:
    assert refusal(workspace_spec(workspace=None, user="0:0")).field == "user"


def test_its_cold_runs_wait_behind_the_gate_and_its_payload_is_never_parked() -> None:
    spec = workspace_spec()
    assert gated(spec)
    assert not gated(workspace_spec(workspace=None))
    assert claim_line_within(spec, 600.0) is None
    assert claim_line_within(workspace_spec(workspace=None), 600.0) is not None
    for consumer in ("pty", "stdio"):
        with pytest.raises(SpecError) as caught:
            refuse_late_start(spec, consumer)
        assert caught.value.field == "workspace"
    refuse_late_start(spec, "session")
    refuse_late_start(spec, "run")


def recheck(body: ContainerCreate) -> Any:
    return recheck_body(body, lease=LEASE, state_dir="/var/lib/sbxkit-x", environment=None)


def bent(body: ContainerCreate, change: Any) -> ContainerCreate:
    data = msgspec.json.decode(msgspec.json.encode(body))
    change(data)
    return msgspec.json.decode(msgspec.json.encode(data), type=ContainerCreate)


def test_the_supervisor_takes_root_only_with_exactly_its_capabilities() -> None:
    body = build_create_body(workspace_spec(), LEASE)
    assert recheck(body) is None  # the daemon is asked apart from this (admitting.py)
    no_caps = recheck(bent(body, lambda d: d["HostConfig"].pop("CapAdd")))
    assert no_caps.field == "Config.User"
    more = recheck(bent(body, lambda d: d["HostConfig"]["CapAdd"].append("CAP_SYS_ADMIN")))
    assert more.field == "HostConfig.CapAdd"
    plain = build_create_body(workspace_spec(workspace=None), LEASE)
    caps_alone = recheck(
        bent(plain, lambda d: d["HostConfig"].__setitem__("CapAdd", ["CAP_CHOWN"]))
    )
    assert caps_alone.field == "HostConfig.CapAdd"
    spelled = recheck(bent(body, lambda d: d.__setitem__("User", "root")))
    assert spelled.field == "Config.User"


def test_on_rootful_podman_its_root_has_a_user_namespace_of_its_own() -> None:
    body = build_create_body(
        workspace_spec(), LEASE, podman=True, userns_mode=planned_userns_mode(PODMAN_AUTO_WITNESS)
    )
    assert body.host_config is not None
    assert body.host_config.userns_mode == PODMAN_AUTO_USERNS == "auto:size=65536"
    assert b'"UsernsMode":"auto:size=65536"' in msgspec.json.encode(body)
    assert recheck(body) is None  # whether the daemon is rootful Podman: admitting.py
    for witness in ("userns", "rootless", "gvisor", None):  # those need none of their own
        assert planned_userns_mode(witness) is None
    elsewhere = build_create_body(workspace_spec(), LEASE, podman=True)
    assert elsewhere.host_config is not None
    assert elsewhere.host_config.userns_mode is None
    assert b"UsernsMode" not in msgspec.json.encode(elsewhere)
    with pytest.raises(SpecError) as caught:
        build_create_body(workspace_spec(workspace=None), LEASE, userns_mode=PODMAN_AUTO_USERNS)
    assert caught.value.field == "workspace"


@pytest.mark.parametrize(
    "mode", ["host", "auto", "auto:size=1024", "private", "keep-id", "ns:/proc/1/ns/user", ""]
)
def test_the_supervisor_takes_no_other_user_namespace_mode(mode: str) -> None:
    """``host`` on a remapping Docker would make root inside the host's root; an unpinned or
    other ``auto`` is not the map sbxkit plans on."""
    body = build_create_body(workspace_spec(), LEASE, podman=True)
    refused = recheck(bent(body, lambda d: d["HostConfig"].__setitem__("UsernsMode", mode)))
    assert refused.field == "HostConfig.UsernsMode"
    assert PODMAN_AUTO_USERNS in refused.reason


def test_the_supervisor_takes_a_user_namespace_only_for_a_workspaces_root() -> None:
    plain = build_create_body(workspace_spec(workspace=None), LEASE, podman=True)
    asked = bent(plain, lambda d: d["HostConfig"].__setitem__("UsernsMode", PODMAN_AUTO_USERNS))
    assert recheck(asked).field == "HostConfig.UsernsMode"
    own_uid = build_create_body(workspace_spec(workspace=Workspace(root=False)), LEASE)
    asked = bent(own_uid, lambda d: d["HostConfig"].__setitem__("UsernsMode", PODMAN_AUTO_USERNS))
    assert recheck(asked).field == "HostConfig.UsernsMode"


def test_the_host_kernel_rule() -> None:
    identity = "         0          0 4294967295\n"
    remapped = "         0     165536      65536\n"
    assert parse_id_map(remapped) == ((0, 165536, 65536),)
    assert maps_host_root(parse_id_map(identity))
    assert not maps_host_root(parse_id_map(remapped))
    assert maps_host_root(parse_id_map("0 165536 1000\n1000 0 1\n"))  # some id onto host root
    assert host_root_problem(remapped, "userns") is None
    problem = host_root_problem(identity, "userns")
    assert problem is not None
    assert "though the daemon said userns" in problem
    assert host_root_problem("garbage", "userns") is not None
    assert host_root_problem(None, "userns") is None  # the host cannot see it: the daemon's word
    podman = "         0     300000      65536\n"  # --userns=auto from containers:300000:…
    assert host_root_problem(podman, PODMAN_AUTO_WITNESS) is None
    caught = host_root_problem(identity, PODMAN_AUTO_WITNESS)
    assert caught is not None
    assert "though the daemon said userns-auto" in caught
    # what the governor chowns a TLS bundle to: the sandbox user as the host knows it
    assert outside_id(parse_id_map(remapped), 0) == 165536
    assert outside_id(parse_id_map(remapped), 61440) == 165536 + 61440
    assert outside_id(parse_id_map(remapped), 65536) is None
    assert outside_id(parse_id_map(identity), 1000) == 1000


def test_the_maps_podman_recorded_before_the_start() -> None:
    own = ["0:300000:65536"]
    assert recorded_maps_problem(own, own) is None
    for uids, gids in ((None, own), ([], own), (own, None)):  # the host's user namespace
        problem = recorded_maps_problem(uids, gids)
        assert problem is not None
        assert "runs in the host's user namespace" in problem
    onto_root = recorded_maps_problem(own, ["0:0:1", "1:300001:65535"])
    assert onto_root is not None
    assert "gid map" in onto_root
    assert "reaches host id 0" in onto_root
    garbled = recorded_maps_problem(["0-300000-65536"], own)
    assert garbled is not None
    assert "cannot be read" in garbled


def test_a_profile_and_a_flag_ask_for_a_workspace(tmp_path: Any) -> None:
    docker = {"image": "img", "workspace": {}}
    profile = profile_from_dict({"sandbox": {"docker": docker}})
    assert profile.sandbox.docker.workspace == ProfileWorkspace()
    with pytest.raises(SpecError) as caught:
        profile_from_dict({"sandbox": {"docker": {**docker, "user": "1000:1000"}}})
    assert caught.value.field == "sandbox.docker.user"
    args = argparse.Namespace(
        image="img", command=["id"], workspace=True, env=[], label=[], **dict.fromkeys(FLAGS)
    )
    assert spec_from_args(args).workspace == Workspace()


FLAGS = ("cpus", "memory", "pids", "max_output", "timeout", "fsize", "scratch", "shm")


def test_the_sandbox_runtime_refuses_a_workspace() -> None:
    with pytest.raises(SpecError) as caught:
        check_sbx_spec(workspace_spec())
    assert caught.value.field == "workspace"


def test_the_supervisor_parks_no_workspace() -> None:
    body = build_create_body(workspace_spec(), LEASE)
    template = Register(
        lease=LEASE,
        name=f"sbxkit-{LEASE}",
        engine_socket="/var/run/docker.sock",
        body=body,
        reservation=Reservation(memory_bytes=64 * MiB, nano_cpus=10**9),
        startup_deadline_s=30,
        lifetime_deadline_s=60,
    )
    terms = PoolTerms(size=1, idle_ttl_s=60, max_timeout_s=60)
    problem = template_problem(Claim(template=template, terms=terms, expected_mounts=[]))
    assert problem is not None
    assert "workspace" in problem
