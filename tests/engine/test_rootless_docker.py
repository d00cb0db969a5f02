"""A rootless Docker daemon that cannot hold a sandbox's limits is refused before anything exists.

Rootless Docker on cgroup v1 gets no controllers (``CgroupDriver: none``): it would record the
memory, CPU and pids limits and enforce none. On cgroup v2 it is refused while it reports
AppArmor (it then fails every start) or lacks a delegated controller. Where it holds them (v2,
delegated, AppArmor hidden) the conformance subset runs against it in the cgroup v2 cell
(``SBXKIT_CGROUP2_ENGINES=rootless-docker``; docs/backends.md, "Rootless engines on cgroup v2").

The daemon comes from ``SBXKIT_TEST_ROOTLESS_DOCKER_SOCKET`` (``dockerd-rootless.sh`` as an
ordinary user, with the busybox test image loaded).
"""

from __future__ import annotations

import os
import time

import pytest

from sbxkit._consumers.runner import run
from sbxkit.engine.client import open_engine
from sbxkit.errors import SpecError
from tests.engine.helpers import spec, unique
from tests.witness import Witness

pytestmark = pytest.mark.rootless_docker

SOCKET_ENV = "SBXKIT_TEST_ROOTLESS_DOCKER_SOCKET"


def rootless_docker() -> str:
    path = os.environ.get(SOCKET_ENV)
    if not path:
        pytest.fail(f"{SOCKET_ENV} is not set: name a rootless Docker daemon's socket")
    return path


async def test_a_rootless_docker_that_cannot_hold_the_limits_is_refused_before_any_container(
    busybox: str,
) -> None:
    socket_path = rootless_docker()
    witness = Witness(socket_path)
    info = witness.get("/info")
    assert "name=rootless" in info["SecurityOptions"]
    apparmor = "name=apparmor" in info["SecurityOptions"]
    held = info["MemoryLimit"] and info["PidsLimit"] and info["CpuCfsQuota"]
    assert info["CgroupVersion"] != "2" or apparmor or not held, "this daemon holds the limits"
    marker = unique("rootless-docker")
    since = time.time()
    async with open_engine(socket_path) as engine:
        with pytest.raises(SpecError) as refused:
            await run(spec(busybox, f"echo {marker}"), engine=engine)
    until = time.time() + 0.5

    assert refused.value.field == "limits"
    if info["CgroupVersion"] != "2":
        assert "rootless on cgroup v1" in refused.value.rule
    elif not held:
        assert "delegated" in refused.value.rule
    else:
        assert "AppArmor" in refused.value.rule
    assert "rootless Podman" not in refused.value.rule
    assert witness.events(since, until, type=["container"]) == []
    assert witness.containers() == []
