"""Rootless engines: which ones can hold a sandbox's limits, judged before any container.

Pure (the rules on a daemon's ``/info`` and Podman's host facts), plus the preflight shell on a
stub ``/info``. The engines themselves are proven in the cgroup v2 cell
(``scripts/cgroup2-cell`` with ``SBXKIT_CGROUP2_ENGINES``: tests/engine/test_rootless.py and
tests/engine/test_podman.py).
"""

from __future__ import annotations

import uuid

import pytest

from sbxkit._kernel.rlimits import check_host_rlimits_consumer
from sbxkit._model.gpu import GpuCursor
from sbxkit._model.rules import ROOTLESS_WORKS, check_podman_controllers, check_rootless_docker
from sbxkit._model.spec import Limits, SandboxSpec
from sbxkit._plan.preflight import check_daemon
from sbxkit.engine.models import InfoReply
from sbxkit.errors import SpecError

ROOTLESS = ["name=seccomp,profile=default", "name=rootless", "name=cgroupns"]
ROOTFUL_APPARMOR = ["name=apparmor", "name=seccomp,profile=default"]
HELD = {"memory": True, "pids": True, "cpu": True}


def test_what_works_recommends_no_engine_that_is_refused() -> None:
    assert "rootless Docker on cgroup v2" in ROOTLESS_WORKS
    # Rootless Podman only where it is served: v2, and only what waits for the host's rlimits.
    assert "rootless Podman on cgroup v2" in ROOTLESS_WORKS
    assert "one-shot runs and pools" in ROOTLESS_WORKS


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_rootful_docker_passes_whatever_it_reports(version: str) -> None:
    check_rootless_docker(
        ROOTFUL_APPARMOR, cgroup_version=version, memory=False, pids=False, cpu=False
    )


def test_rootless_docker_on_cgroup_v1_is_refused_by_name() -> None:
    with pytest.raises(SpecError) as refused:
        check_rootless_docker(ROOTLESS, cgroup_version="1", **HELD)  # v1 reports them all
    assert refused.value.field == "limits"
    assert "rootless on cgroup v1" in refused.value.rule
    assert "rootless Podman on cgroup v1" not in refused.value.rule


@pytest.mark.parametrize("missing", ["memory", "pids", "cpu"])
def test_rootless_docker_on_v2_names_each_controller_not_delegated(missing: str) -> None:
    held = {**HELD, missing: False}
    with pytest.raises(SpecError) as refused:
        check_rootless_docker(ROOTLESS, cgroup_version="2", **held)
    assert f"no {missing} controller delegated" in refused.value.rule
    assert "Delegate=" in refused.value.rule


def test_rootless_docker_that_reports_apparmor_is_refused_with_the_way_out() -> None:
    with pytest.raises(SpecError) as refused:
        check_rootless_docker([*ROOTLESS, "name=apparmor"], cgroup_version="2", **HELD)
    assert "AppArmor" in refused.value.rule
    assert "securityfs hidden" in refused.value.rule
    assert "apparmor=0" in refused.value.rule


def test_rootless_docker_on_v2_with_the_controllers_delegated_passes() -> None:
    check_rootless_docker(ROOTLESS, cgroup_version="2", **HELD)


def test_rootless_podman_on_v1_names_the_missing_controllers() -> None:
    with pytest.raises(SpecError) as refused:
        check_podman_controllers([], rootless=True, version="v1")
    assert "cpu/memory/pids" in refused.value.rule
    assert "rootless Podman on cgroup v1" not in refused.value.rule


def test_rootless_podman_on_v2_is_served_with_the_rlimits_set_from_the_host() -> None:
    """It drops HostConfig.Ulimits: accepted only with the host setting them (True)."""
    assert (
        check_podman_controllers(
            ["cpuset", "cpu", "io", "memory", "pids"], rootless=True, version="v2"
        )
        is True
    )


@pytest.mark.parametrize("missing", ["cpu", "memory", "pids"])
def test_rootless_podman_on_v2_without_a_controller_is_refused(missing: str) -> None:
    held = [name for name in ("cpu", "io", "memory", "pids") if name != missing]
    with pytest.raises(SpecError) as refused:
        check_podman_controllers(held, rootless=True, version="v2")
    assert f"no {missing} cgroup controller" in refused.value.rule


def test_rootful_podman_with_the_controllers_passes() -> None:
    assert (
        check_podman_controllers(["cpu", "memory", "pids"], rootless=False, version="v2") is False
    )


@pytest.mark.parametrize("consumer", ["session", "pty", "stdio", "grants", "harness"])
def test_what_does_not_wait_for_the_hosts_rlimits_is_refused_by_name(consumer: str) -> None:
    with pytest.raises(SpecError) as refused:
        check_host_rlimits_consumer(consumer)
    assert refused.value.field == "limits"
    assert f"a {consumer} sandbox" in refused.value.rule
    assert "drops HostConfig.Ulimits" in refused.value.rule
    assert "use one-shot runs or a pool on it" in refused.value.rule


def test_a_one_shot_run_waits_for_the_hosts_rlimits() -> None:
    check_host_rlimits_consumer("run")


class StubEngine:
    """Answers /info from a fixed reply and counts the calls."""

    is_podman = False

    def __init__(self, info: InfoReply) -> None:
        self.reply = info
        self.calls = 0
        self.socket_path = f"/stub/{uuid.uuid4().hex}.sock"

    async def cached_info(self) -> InfoReply:
        self.calls += 1
        return self.reply


def a_spec() -> SandboxSpec:
    return SandboxSpec(
        image="busybox", command=["true"], limits=Limits(cpus=1.0, memory_bytes=2**28, pids=64)
    )


async def test_the_preflight_refuses_a_rootless_v1_daemon_every_time_from_one_answer() -> None:
    engine = StubEngine(InfoReply(security_options=ROOTLESS, cgroup_version="1"))
    for _ in range(2):
        with pytest.raises(SpecError) as refused:
            await check_daemon(engine, a_spec(), GpuCursor())  # type: ignore[arg-type]
        assert "rootless on cgroup v1" in refused.value.rule
    assert engine.calls == 1


async def test_the_preflight_passes_a_rootless_v2_daemon_that_holds_the_limits() -> None:
    info = InfoReply(
        security_options=ROOTLESS,
        cgroup_version="2",
        memory_limit=True,
        pids_limit=True,
        cpu_cfs_quota=True,
    )
    await check_daemon(StubEngine(info), a_spec(), GpuCursor())  # type: ignore[arg-type]
