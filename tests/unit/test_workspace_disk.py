"""A workspace's writable image (``Workspace.disk_bytes``) and exec scratch (``exec_tmp``),
without a daemon: what a spec may say, the body policy builds, the supervisor's second look and
what it watches, the profile's and the command line's spelling. The real-engine side is
tests/engine/test_workspace_disk.py."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
import pytest

from sbxkit._grammar.flags import spec_from_args
from sbxkit._grammar.profile import profile_from_dict, profile_workspace
from sbxkit._model.rules import DISK_LABEL
from sbxkit._model.spec import GiB, MiB, Workspace, spec_labels
from sbxkit._plan.policy import build_create_body, disk_bound, watched_container, watched_disk
from sbxkit._protocol.wire import Expiring
from sbxkit.engine.models import ContainerCreate, ContainerInspect
from sbxkit.errors import SpecError
from tests.unit.test_workspace import (
    FLAGS,
    LEASE,
    bent,
    recheck,
    refusal,
    workspace_spec,
)


def as_created(body: ContainerCreate) -> ContainerInspect:
    """What the daemon records of a container created from ``body``."""
    raw = {
        "Id": "c",
        "Config": {"Labels": body.labels},
        "HostConfig": msgspec.to_builtins(body.host_config),
    }
    return msgspec.convert(raw, ContainerInspect)


def test_a_writable_image_is_bounded_and_labelled_with_its_bound() -> None:
    body = build_create_body(workspace_spec(workspace=Workspace(disk_bytes=GiB)), LEASE)
    host = body.host_config
    assert host is not None
    assert host.readonly_rootfs is False
    assert (body.labels or {})[DISK_LABEL] == str(GiB)
    assert host.storage_opt is None  # no quota named: the supervisor watches it
    assert watched_disk(body) == disk_bound(body) == GiB
    assert watched_container(as_created(body)) == GiB  # a re-adopted lease's view
    assert "noexec" in (host.tmpfs or {})["/tmp"]
    assert recheck(body) is None


def test_a_quota_holds_the_bound_and_then_nothing_is_watched() -> None:
    spec = workspace_spec(workspace=Workspace(disk_bytes=64 * MiB))
    body = build_create_body(spec, LEASE, disk_quota_base=200 * MiB)
    host = body.host_config
    assert host is not None
    assert host.storage_opt == {"size": str(264 * MiB)}  # btrfs counts the image too
    assert disk_bound(body) == 64 * MiB
    assert watched_disk(body) is None
    assert watched_container(as_created(body)) is None
    assert recheck(body) is None


def test_without_disk_bytes_the_image_stays_read_only() -> None:
    body = build_create_body(workspace_spec(), LEASE)
    host = body.host_config
    assert host is not None
    assert host.readonly_rootfs is True
    assert DISK_LABEL not in (body.labels or {})
    assert watched_disk(body) is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["Labels"].pop(DISK_LABEL), "HostConfig.ReadonlyRootfs"),
        (lambda d: d["Labels"].__setitem__(DISK_LABEL, "lots"), f"Config.Labels.{DISK_LABEL}"),
        (lambda d: d["Labels"].__setitem__(DISK_LABEL, "0"), f"Config.Labels.{DISK_LABEL}"),
        (
            lambda d: d["HostConfig"].__setitem__("StorageOpt", {"size": "1024"}),
            "HostConfig.StorageOpt",
        ),
        (
            lambda d: d["HostConfig"].__setitem__("StorageOpt", {"dm.basesize": "10G"}),
            "HostConfig.StorageOpt",
        ),
        (lambda d: d["HostConfig"].__setitem__("ReadonlyRootfs", True), "Config.Labels"),
    ],
)
def test_the_supervisor_refuses_a_writable_root_without_its_bound(change: Any, field: str) -> None:
    body = build_create_body(workspace_spec(workspace=Workspace(disk_bytes=GiB)), LEASE)
    refused = recheck(bent(body, change))
    assert refused is not None
    assert refused.field.startswith(field), refused


def test_a_read_only_root_takes_no_storage_size() -> None:
    body = build_create_body(workspace_spec(), LEASE)
    sized = bent(body, lambda d: d["HostConfig"].__setitem__("StorageOpt", {"size": "1024"}))
    assert recheck(sized).field == "HostConfig.StorageOpt"


def test_exec_scratch_only_where_a_workspace_asks_and_may() -> None:
    spec = workspace_spec(workspace=Workspace(exec_tmp=True))
    body = build_create_body(spec, LEASE)
    scratch = (body.host_config.tmpfs or {})["/tmp"] if body.host_config else ""
    assert "exec" in scratch.split(",")  # explicit: Docker's default for a tmpfs is noexec
    assert "noexec" not in scratch.split(",")
    assert recheck(body) is None
    writable = Workspace(root=False, disk_bytes=GiB, exec_tmp=True)
    assert recheck(build_create_body(workspace_spec(workspace=writable), LEASE)) is None
    # A sandbox of its own uid on a read-only image keeps noexec: nothing policy builds drops it
    plain = build_create_body(workspace_spec(workspace=None), LEASE)
    opened = bent(plain, lambda d: d["HostConfig"]["Tmpfs"].__setitem__("/tmp", scratch))
    assert recheck(opened).field == "HostConfig.Tmpfs[/tmp]"
    both = scratch.replace("exec", "noexec,exec")
    twice = bent(plain, lambda d: d["HostConfig"]["Tmpfs"].__setitem__("/tmp", both))
    assert recheck(twice).field == "HostConfig.Tmpfs[/tmp]"
    lone = refusal(workspace_spec(workspace=Workspace(root=False, exec_tmp=True)))
    assert lone.field == "workspace.exec_tmp"


@pytest.mark.parametrize(
    ("disk", "rule"),
    [(0, "must be > 0"), (MiB - 1, ">= 1048576"), (True, "integer"), (1.5, "integer")],
)
def test_disk_bytes_is_a_count_of_at_least_a_mebibyte(disk: Any, rule: str) -> None:
    error = refusal(workspace_spec(workspace=Workspace(disk_bytes=disk)))
    assert error.field == "workspace.disk_bytes"
    assert rule in error.rule


def test_the_disk_label_is_sbxkits_own() -> None:
    error = refusal(workspace_spec(labels={DISK_LABEL: "1"}))
    assert error.field.startswith("labels")
    assert "reserved" in error.rule
    assert spec_labels(workspace_spec()) == {}


def test_a_profile_and_the_command_line_spell_the_bound_as_a_size() -> None:
    docker = {"image": "img", "workspace": {"disk": "2g", "exec_tmp": True}}
    table = profile_from_dict({"sandbox": {"docker": docker}}).sandbox.docker.workspace
    assert table is not None
    assert profile_workspace(table) == Workspace(disk_bytes=2 * GiB, exec_tmp=True)
    with pytest.raises(SpecError) as caught:
        profile_from_dict({"sandbox": {"docker": {"image": "i", "workspace": {"disk": "2q"}}}})
    assert caught.value.field == "sandbox.docker.workspace.disk"
    with pytest.raises(SpecError) as small:
        profile_from_dict({"sandbox": {"docker": {"image": "i", "workspace": {"disk": "1k"}}}})
    assert small.value.field == "sandbox.docker.workspace.disk"

    def args(**given: Any) -> argparse.Namespace:
        values = {"image": "img", "command": ["id"], "env": [], "label": [], **given}
        return argparse.Namespace(**values, **dict.fromkeys(FLAGS))

    spec = spec_from_args(args(workspace=True, disk="512m", exec_tmp=True))
    assert spec.workspace == Workspace(disk_bytes=512 * MiB, exec_tmp=True)
    for flag, given in (("--disk", {"disk": "1g"}), ("--exec-tmp", {"exec_tmp": True})):
        with pytest.raises(SpecError) as refused:
            spec_from_args(args(**given))
        assert refused.value.field == flag


def test_the_supervisor_says_which_removal_was_its_own() -> None:
    assert Expiring(lease=LEASE, reason="r").status == "timed_out"  # the older supervisors'
    assert Expiring(lease=LEASE, reason="r", status="disk_exceeded").status == "disk_exceeded"
