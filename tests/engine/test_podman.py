"""The Podman cell's own checks (run by ``./dev test`` against its Podman services).

The conformance subset proves the hardened contract on rootful Podman; these prove that the
engine under test really is Podman, and that a rootless Podman service, which cannot enforce
the mandatory limits (cgroup v1: no delegated controllers; cgroup v2: it drops the rlimits), is
refused before anything exists. On the host (v1) and in the cgroup v2 cell
(``SBXKIT_CGROUP2_ENGINES=rootless-podman``, where only the rootless tests run).
"""

from __future__ import annotations

import os

import pytest

from sbxkit._consumers.runner import run
from sbxkit._model.rules import GVISOR_MIN_PIDS
from sbxkit._model.spec import MiB
from sbxkit.engine.client import Engine, open_engine
from sbxkit.engine.models import ContainerCreate, HostConfig, Ulimit
from sbxkit.errors import SpecError
from tests.engine.helpers import spec, unique
from tests.engine.oneshot_paths import OneShot
from tests.witness import Witness

pytestmark = pytest.mark.podman

ROOTLESS_ENV = "SBXKIT_TEST_PODMAN_ROOTLESS_SOCKET"


def rootless_socket() -> str:
    path = os.environ.get(ROOTLESS_ENV)
    if not path:
        pytest.fail(f"{ROOTLESS_ENV} is not set: run the Podman cell through ./dev test")
    return path


async def test_the_engine_under_test_is_podman(witness: Witness, engine: Engine) -> None:
    assert witness.is_podman()
    assert engine.is_podman
    host = await engine.podman_host()
    assert not host.security.rootless
    assert {"cpu", "memory", "pids"} <= set(host.cgroup_controllers or [])


@pytest.mark.parametrize("asked", ["runsc", "runc"])
async def test_a_runtime_the_compat_api_would_ignore_is_refused_before_any_container(
    oneshot: OneShot, asked: str, busybox: str, engine: Engine, witness: Witness
) -> None:
    """Podman's compat create ignores HostConfig.Runtime: gVisor asked for would be crun."""
    marker = unique("podman-runtime")
    with pytest.raises(SpecError) as refused:
        await oneshot(
            spec(busybox, f"echo {marker}", runtime=asked, pids=GVISOR_MIN_PIDS), engine=engine
        )
    # Podman keeps no queryable event log here, so "nothing was created" is read from the
    # container list, right after the refusal.
    assert witness.containers() == []
    # Positive control: the service's own default runtime runs.
    default = witness.get("/info")["DefaultRuntime"]
    ok = await oneshot(spec(busybox, f"echo {marker}", runtime=default), engine=engine)

    assert refused.value.field == "runtime"
    assert "ignores HostConfig.Runtime" in refused.value.rule
    assert ok.ok, ok
    assert ok.stdout == f"{marker}\n".encode()


async def test_rootless_podman_without_controllers_is_refused_before_any_container(
    busybox: str,
) -> None:
    socket_path = rootless_socket()
    rootless = Witness(socket_path)
    assert rootless.is_podman()
    marker = unique("rootless")
    async with open_engine(socket_path) as engine:
        host = await engine.podman_host()
        assert host.security.rootless
        with pytest.raises(SpecError) as refused:
            await run(spec(busybox, f"echo {marker}"), engine=engine)

    assert refused.value.field == "limits"
    assert "rootless" in refused.value.rule
    if host.cgroup_version == "v1":
        assert "cpu/memory/pids" in refused.value.rule
    else:  # v2, controllers delegated: the rlimits it drops (next test)
        assert {"cpu", "memory", "pids"} <= set(host.cgroup_controllers or [])
        assert "drops HostConfig.Ulimits" in refused.value.rule
    # What it recommends instead works: never rootless Podman itself.
    assert "rootless Podman" not in refused.value.rule
    assert rootless.containers() == []  # nothing was created (Podman keeps no event log here)


async def test_rootless_podman_drops_the_ulimits_it_is_asked_for(busybox: str) -> None:
    """Why rootless Podman is refused on cgroup v2: a container created through its
    Docker-compatible API with ``HostConfig.Ulimits`` has none (Podman 4.3). Should a Podman
    keep them, this fails: then the refusal can be narrowed to the versions that drop them."""
    socket_path = rootless_socket()
    witness = Witness(socket_path)
    label, _, value = os.environ["SBXKIT_LABELS"].partition("=")
    asked = [Ulimit(name="fsize", soft=MiB, hard=MiB), Ulimit(name="msgqueue", soft=0, hard=0)]
    body = ContainerCreate(
        image=busybox,
        cmd=["true"],
        labels={label: value},
        host_config=HostConfig(ulimits=asked, network_mode="none"),
    )
    async with open_engine(socket_path) as engine:
        assert (await engine.podman_host()).security.rootless
        container = await engine.container_create(body, name=unique("ulimits"))
        try:
            got = (await engine.container_inspect(container)).host_config.ulimits or []
        finally:
            await engine.container_remove(container)

    assert {(u.name.removeprefix("RLIMIT_").lower(), u.soft, u.hard) for u in got} & {
        (u.name, u.soft, u.hard) for u in asked
    } == set(), got
    assert witness.containers() == []
