"""Truthful outcomes against the real engine: an operator's ``docker kill`` (sent through the
witness, as an operator would) is ``killed``, not ``oom_killed``; the payload's own ``exit 137``
is an exit; a real OOM stays ``oom_killed`` with the daemon's evidence."""

from __future__ import annotations

import threading

import sbxkit
from sbxkit.engine.client import Engine
from tests.engine.helpers import python_spec, spec, unique, wait_until
from tests.engine.oneshot_paths import OneShot
from tests.witness import Witness

TEST_LABEL = "sbxkit.test"


def labelled(base: sbxkit.SandboxSpec, label: str) -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=base.image, command=base.command, limits=base.limits, labels={TEST_LABEL: label}
    )


def kill_when_running(witness: Witness, label: str, process: str) -> threading.Thread:
    """An operator killing the container once ``process`` runs in it (seen by the daemon)."""

    def operator() -> None:
        found: list[str] = []

        def running() -> bool:
            found[:] = [
                c["Id"]
                for c in witness.containers(label=f"{TEST_LABEL}={label}")
                if c.get("State") == "running"
                and any(process in " ".join(row) for row in _top(witness, c["Id"]))
            ]
            return bool(found)

        if wait_until(running, 30):
            witness.kill(found[0])

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    return thread


def _top(witness: Witness, container_id: str) -> list[list[str]]:
    try:
        rows: list[list[str]] = witness.get(f"/containers/{container_id}/top")["Processes"] or []
    except Exception:  # stopped between the listing and this call
        return []
    return rows


async def test_an_operators_docker_kill_is_killed_not_oom(
    oneshot: OneShot, engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("kill")
    operator = kill_when_running(witness, label, "sleep 30")
    result = await oneshot(labelled(spec(busybox, "sleep 30"), label), engine=engine)
    operator.join(5)
    assert result.status == "killed", result
    assert result.exit_code == 137  # the container's status, as for oom_killed
    assert result.oom_evidence is None
    assert result.kill_evidence is not None
    assert "SIGKILL" in result.kill_evidence


async def test_a_payloads_own_exit_137_is_an_exit(
    oneshot: OneShot, engine: Engine, busybox: str
) -> None:
    result = await oneshot(spec(busybox, "exit 137"), engine=engine)
    assert (result.status, result.exit_code) == ("exited", 137)
    assert result.oom_evidence is None
    assert result.kill_evidence is None


async def test_a_real_oom_is_oom_killed_on_the_daemons_evidence(
    oneshot: OneShot, engine: Engine, python_image: str
) -> None:
    code = "b = bytearray(200 << 20)"
    result = await oneshot(python_spec(python_image, code, memory_bytes=32 << 20), engine=engine)
    assert result.status == "oom_killed", result
    assert result.oom_evidence in ("State.OOMKilled",) or "oom event" in (result.oom_evidence or "")


async def test_docker_kill_of_a_sandbox_during_an_exec_is_reported_as_killed(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    label = unique("kill")
    async with sbxkit.open_sandbox(labelled(spec(busybox, "true"), label), engine=engine) as box:
        operator = kill_when_running(witness, label, "sleep 29")
        result = await box.exec(["sleep", "29"])
        operator.join(5)
    assert result.status == "killed", result
    assert result.kill_evidence is not None
