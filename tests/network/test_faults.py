"""When the owner dies or cannot enter: egress fails closed and the sandbox is still removed;
without the privilege to enter a sandbox, a governed network is refused before anything exists."""

from __future__ import annotations

import json
import os
import subprocess
import time

import msgspec
import pytest
import trio

import sbxkit
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.network_terms import Network
from sbxkit._model.settings import Settings
from sbxkit._plan.plan import make_plan
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import SbxError, SupervisorError
from tests.network.conftest import LAUNCHER_UMASK, supervisor_with_umask
from tests.network.payloads import SBXKIT_RUN
from tests.network.servers import ALLOWED, Servers
from tests.supervision import SupervisorProcess, private_state_dir
from tests.witness import PYTHON, Witness

LOOP = r"""
import sys, time, urllib.request
refused = 0
for attempt in range(300):
    try:
        urllib.request.urlopen("http://allowed.sbxkit.test/tick", timeout=5).read()
        print("ok", flush=True)
        refused = 0
    except Exception as error:
        print("refused", repr(error)[:80], flush=True)
        refused += 1
        if refused == 3:
            sys.exit(7)
    time.sleep(0.1)
"""


async def test_a_killed_supervisor_takes_egress_with_it_and_recovery_removes_the_sandbox(
    engine: Engine, servers: Servers, witness: Witness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its caller cannot launch another (a broken ``SBXKIT_SUPERVISOR``), so nothing re-adopts
    the lease: egress stays closed, the run fails, and the next supervisor's recovery removes
    the sandbox. (A caller that can launch one re-adopts it: test_readoption.py.)"""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    state_dir = private_state_dir()
    spec = sbxkit.SandboxSpec(
        image=PYTHON,
        command=["python3", "-c", LOOP],
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=128 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=60
        ),
        network=Network(allow=[f"{ALLOWED}:80"]),
    )
    lines: list[str] = []
    first_ok = trio.Event()

    def on_output(stream: str, chunk: bytes) -> None:
        lines.extend(chunk.decode().splitlines())
        if "ok" in lines:
            first_ok.set()

    with supervisor_with_umask(state_dir, LAUNCHER_UMASK) as supervisor:
        backend = DockerBackend(
            engine=engine,
            settings=Settings(supervisor_state_dir=str(state_dir)),
            recover_at_open=False,
        )
        failure: list[BaseException] = []

        async def run() -> None:
            try:
                await backend.run_once(spec, on_output=on_output)
            except SbxError as exc:
                failure.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            with trio.fail_after(60):
                await first_ok.wait()
            supervisor.kill()  # SIGKILL: no cleanup code of its runs
        assert failure, "the run cannot report success once its owner is gone"
        refusals = [line for line in lines if line.startswith("refused")]
        assert len(refusals) >= 3, lines  # egress stopped with its owner: fails closed
        assert "Connection refused" in refusals[-1]
        assert witness.sbxkit_containers(), "recovery, not the killed owner, removes it"
    # the next start recovers it: held for its caller's grace period (10 s), then removed
    with supervisor_with_umask(state_dir, LAUNCHER_UMASK):
        assert witness.wait_until_no_sbxkit_containers(seconds=30) == []


def test_without_cap_sys_admin_a_governed_network_is_refused(witness: Witness) -> None:
    began = time.time()
    proc = subprocess.run(
        [
            "setpriv",
            "--bounding-set",
            "-sys_admin",
            "--inh-caps",
            "-sys_admin",
            "--",
            *SBXKIT_RUN,
            "--allow",
            f"{ALLOWED}:443",
            PYTHON,
            "--",
            "true",
        ],
        capture_output=True,
        timeout=60,
        check=False,
        env=os.environ,
    )
    assert proc.returncode == 2, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["field"] == "network"
    assert "needs CAP_SYS_ADMIN" in error["message"]
    assert witness.events(began, time.time() + 1, type=["container"], event=["create"]) == []


@pytest.mark.parametrize("network", ["managed", Network(mode="managed")])
async def test_production_refuses_the_managed_network(
    backend: DockerBackend, network: object, witness: Witness
) -> None:
    began = time.time()
    spec = sbxkit.SandboxSpec(
        image=PYTHON,
        command=["true"],
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=64 * sbxkit.MiB, pids=16, output_bytes=64, timeout_s=9
        ),
        network=network,  # type: ignore[arg-type]
    )
    production = DockerBackend(
        engine=backend.engine, owner=backend.owner, settings=Settings(environment=b"production")
    )
    with pytest.raises(sbxkit.SpecError, match="refused in production"):
        await production.run_once(spec)
    assert witness.events(began, time.time() + 1, type=["container"], event=["create"]) == []
    assert {n["Name"] for n in witness.get("/networks")} == {"host", "none"}


async def test_the_supervisor_refuses_a_body_that_points_the_proxy_elsewhere(
    engine: Engine, supervisor: SupervisorProcess, witness: Witness
) -> None:
    """The supervisor re-checks a governed body against the terms it registers (a raw client
    on its socket could send anything): the owned variables must be exactly sbxkit's."""
    backend = DockerBackend(
        engine=engine, settings=Settings(supervisor_state_dir=str(supervisor.state_dir))
    )
    spec = sbxkit.SandboxSpec(
        image=PYTHON,
        command=["true"],
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=64 * sbxkit.MiB, pids=16, output_bytes=64, timeout_s=9
        ),
        network=Network(allow=[f"{ALLOWED}:443"]),
    )
    plan = await make_plan(engine, backend.check(spec, "run"))
    assert plan.network is not None
    env = [
        "HTTPS_PROXY=http://198.51.100.10:3128" if item.startswith("HTTPS_PROXY=") else item
        for item in plan.body.env or []
    ]
    hostile = msgspec.structs.replace(plan.body, env=env)
    owner = SupervisedOwner(engine, state_dir=supervisor.state_dir)
    began = time.time()
    with pytest.raises(SupervisorError) as info:
        await owner.create(CreateRequest(plan.lease, plan.name, hostile, 60, network=plan.network))
    assert info.value.code == "policy"
    assert "variables are not sbxkit's" in info.value.reason
    await owner.remove(plan.lease, plan.name, None)
    # the body policy built passes, so the refusal above was the change
    container_id = await owner.create(
        CreateRequest(plan.lease, plan.name, plan.body, 60, network=plan.network)
    )
    await owner.remove(plan.lease, plan.name, container_id)
    creates = witness.events(began, time.time() + 1, type=["container"], event=["create"])
    assert len(creates) == 1
